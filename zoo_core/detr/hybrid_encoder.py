"""The hybrid encoder of RT-DETR (Zhao et al., arXiv:2304.08069), shared by its descendants.

Two parts, both on features already projected to one width ``hidden_dim``:

- **AIFI** (attention-based intra-scale feature interaction): a post-norm transformer encoder
  layer (multi-head self-attention + feed-forward, fixed 2-D sine-cosine position embedding) on
  the tokens of selected levels only — by default the coarsest, where it is cheap and the
  semantics are richest.
- **CCFM** (CNN-based cross-scale feature fusion): a top-down path (lateral conv on the coarser
  map, nearest ×2 upsampling, concatenation with the finer map, a fusion block) then a bottom-up
  path (stride-2 downsampling, concatenation, a fusion block), PAN-style.

The encoder is backbone-agnostic: it takes any list of feature maps (finest first) with their
channel counts. What differs between families is the CCFM's blocks, given as a
``CrossScaleFusion`` (three factories): ``csp_rep_fusion`` builds RT-DETR's (activated 1×1
laterals, CSPRepLayer blocks, 3×3 stride-2 conv-BN-SiLU downsampling), ``elan_fusion``
D-FINE's/DEIM's (linear 1×1 laterals, RepNCSPELAN4 blocks, SCDown downsampling). A later
family plugs in its own factories.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.detr.fusion_blocks import CSPRepFusion, ELANFusion, SeparableDownsample, conv_bn
from zoo_core.detr.geometry import sine_position_grid
from zoo_core.nn.conv import make_activation

__all__ = ["CrossScaleFusion", "csp_rep_fusion", "elan_fusion", "IntraScaleEncoderLayer", "HybridEncoder"]

_POSITION_CACHE_SIZE = 16


@dataclass(frozen=True)
class CrossScaleFusion:
    """The CCFM's blocks: each factory takes ``hidden_dim`` and returns a module.

    ``lateral``: hidden → hidden on the coarser map before upsampling; ``block``: 2·hidden →
    hidden after each concatenation; ``downsample``: hidden → hidden at stride 2.
    """

    lateral: Callable[[int], nn.Module]
    block: Callable[[int], nn.Module]
    downsample: Callable[[int], nn.Module]


def csp_rep_fusion(expansion: float = 1.0, depth_mult: float = 1.0, activation: str = "silu") -> CrossScaleFusion:
    """RT-DETR's CCFM blocks: ``round(3·depth_mult)`` RepConvBlocks per CSPRepLayer."""
    blocks = round(3 * depth_mult)
    return CrossScaleFusion(
        lateral=lambda hidden: conv_bn(hidden, hidden, 1, activation=activation),
        block=lambda hidden: CSPRepFusion(2 * hidden, hidden, blocks, expansion, activation),
        downsample=lambda hidden: conv_bn(hidden, hidden, 3, 2, activation=activation),
    )


def elan_fusion(expansion: float = 1.0, depth_mult: float = 1.0, activation: str = "silu") -> CrossScaleFusion:
    """D-FINE's CCFM blocks: RepNCSPELAN4 with stage width ``round(expansion·hidden // 2)``."""
    blocks = round(3 * depth_mult)
    return CrossScaleFusion(
        lateral=lambda hidden: conv_bn(hidden, hidden, 1),
        block=lambda hidden: ELANFusion(2 * hidden, hidden, 2 * hidden, round(expansion * hidden // 2), blocks, activation),
        downsample=lambda hidden: SeparableDownsample(hidden, hidden, 3, 2),
    )


class IntraScaleEncoderLayer(nn.Module):
    """Post-norm transformer encoder layer; the position embedding is added to queries and keys only.

    Attention computes what ``nn.MultiheadAttention``'s weights-returning path (the published code's)
    computes for trainable weights, op for op (``self_attention``), which keeps the encoder
    bit-identical to it: the query selection downstream is a top-k, where last-bit differences can
    reorder near-tied scores.
    """

    def __init__(self, dim: int, num_heads: int, ffn_dim: int, activation: str = "gelu", dropout: float = 0.0) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.norm_attn = nn.LayerNorm(dim)
        self.ffn_in = nn.Linear(dim, ffn_dim)
        self.ffn_act = make_activation(activation, inplace=False)  # after nn.Linear: see make_activation
        self.ffn_out = nn.Linear(ffn_dim, dim)
        self.norm_ffn = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def self_attention(self, query: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """``self_attn(query, query, value)[0]`` (B×T×dim, batch first), the same bits whether or not its
        weights require grad.

        ``nn.MultiheadAttention`` projects the sequence-first (transposed) view of its inputs, and ATen's
        matmul picks the kernel of that projection by whether the weight requires grad: a contiguous copy
        and one ``mm`` when it does, a ``bmm`` over the strided view when it does not. A frozen copy (the
        inference form, ``zoo_core.export.inference_form``) then rounds differently, its query scores
        differ in the last bit, and near-tied queries swap places in the top-k. Here the projections are
        always the copy and the ``mm``; the rest is the module's own sequence of ops.
        """
        attention = self.self_attn
        batch, length, dim = query.shape
        heads = attention.num_heads
        head_dim = dim // heads
        w_q, w_k, w_v = attention.in_proj_weight.chunk(3)
        b_q, b_k, b_v = attention.in_proj_bias.chunk(3)

        def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            rows = x.transpose(0, 1).contiguous().view(length * batch, dim)
            projected = torch.mm(rows, weight.t()).view(length, batch, dim) + bias
            return projected.view(length, batch * heads, head_dim).transpose(0, 1)  # (B·heads)×T×head_dim

        q, k, v = project(query, w_q, b_q), project(query, w_k, b_k), project(value, w_v, b_v)
        weights = torch.bmm(q * math.sqrt(1.0 / float(head_dim)), k.transpose(-2, -1)).softmax(dim=-1)
        if self.training and attention.dropout > 0.0:
            weights = F.dropout(weights, p=attention.dropout)
        attended = torch.bmm(weights, v).transpose(0, 1).contiguous().view(length * batch, dim)
        attended = F.linear(attended, attention.out_proj.weight, attention.out_proj.bias)
        return attended.view(length, batch, dim).transpose(0, 1)

    def forward(self, tokens: torch.Tensor, position: torch.Tensor | None = None) -> torch.Tensor:
        query = tokens if position is None else tokens + position
        attended = self.self_attention(query, tokens)
        tokens = self.norm_attn(tokens + self.dropout(attended))
        hidden = self.ffn_out(self.dropout(self.ffn_act(self.ffn_in(tokens))))
        return self.norm_ffn(tokens + self.dropout(hidden))


class HybridEncoder(nn.Module):
    """AIFI + CCFM over ``len(in_channels)`` levels; returns one ``hidden_dim`` map per level.

    Args:
        in_channels: channels of the input maps, finest first (stride doubling from one to the next).
        hidden_dim: the common width (1×1 conv-BN input projections).
        fusion: the CCFM blocks (``csp_rep_fusion`` or ``elan_fusion`` or a family's own).
        attention_levels: indices of the levels AIFI runs on (default: the last).
        num_heads, ffn_dim, num_layers, activation, dropout: the AIFI layers (GELU, no dropout published).
        temperature: the sine-cosine embedding's temperature.
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        hidden_dim: int,
        fusion: CrossScaleFusion,
        *,
        attention_levels: Sequence[int] | None = None,
        num_heads: int = 8,
        ffn_dim: int = 1024,
        num_layers: int = 1,
        activation: str = "gelu",
        dropout: float = 0.0,
        temperature: float = 10000.0,
    ) -> None:
        super().__init__()
        self.in_channels = tuple(in_channels)
        self.hidden_dim = hidden_dim
        self.num_levels = len(self.in_channels)
        self.attention_levels = tuple(attention_levels) if attention_levels is not None else (self.num_levels - 1,)
        self.temperature = temperature
        self.out_channels = (hidden_dim,) * self.num_levels
        self.input_projections = nn.ModuleList(conv_bn(c, hidden_dim) for c in self.in_channels)
        self.intra_scale = nn.ModuleList(
            nn.ModuleList(IntraScaleEncoderLayer(hidden_dim, num_heads, ffn_dim, activation, dropout) for _ in range(num_layers))
            for _ in self.attention_levels
        )
        steps = self.num_levels - 1
        self.lateral = nn.ModuleList(fusion.lateral(hidden_dim) for _ in range(steps))
        self.top_down = nn.ModuleList(fusion.block(hidden_dim) for _ in range(steps))
        self.downsample = nn.ModuleList(fusion.downsample(hidden_dim) for _ in range(steps))
        self.bottom_up = nn.ModuleList(fusion.block(hidden_dim) for _ in range(steps))
        self._positions: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()

    def position_embedding(self, height: int, width: int, like: torch.Tensor) -> torch.Tensor:
        """The AIFI position embedding for an ``height × width`` map (cached per shape, device, dtype)."""
        key = (height, width, like.device, like.dtype)
        cached = self._positions.get(key)
        if cached is None:
            cached = sine_position_grid(height, width, self.hidden_dim, self.temperature, device=like.device).to(like.dtype)
            self._positions[key] = cached
            while len(self._positions) > _POSITION_CACHE_SIZE:
                self._positions.popitem(last=False)
        return cached

    def forward(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if len(features) != self.num_levels:
            raise ValueError(f"the hybrid encoder takes {self.num_levels} feature maps, got {len(features)}")
        maps = [projection(x) for projection, x in zip(self.input_projections, features)]
        for layers, level in zip(self.intra_scale, self.attention_levels):
            batch, _, height, width = maps[level].shape
            tokens = maps[level].flatten(2).transpose(1, 2)
            position = self.position_embedding(height, width, tokens)
            for layer in layers:
                tokens = layer(tokens, position)
            maps[level] = tokens.transpose(1, 2).reshape(batch, self.hidden_dim, height, width).contiguous()

        # Top-down: each coarser map, after its lateral conv, is upsampled into the next finer one.
        coarse = maps[-1]
        laterals: list[torch.Tensor] = []
        for step, fine in enumerate(reversed(maps[:-1])):
            coarse = self.lateral[step](coarse)
            laterals.append(coarse)
            upsampled = F.interpolate(coarse, scale_factor=2.0, mode="nearest")
            coarse = self.top_down[step](torch.cat([upsampled, fine], dim=1))
        # Bottom-up: the finest fused map is downsampled and fused with each lateral, coarser and coarser.
        outputs = [coarse]
        for step, lateral in enumerate(reversed(laterals)):
            downsampled = self.downsample[step](outputs[-1])
            outputs.append(self.bottom_up[step](torch.cat([downsampled, lateral], dim=1)))
        return outputs
