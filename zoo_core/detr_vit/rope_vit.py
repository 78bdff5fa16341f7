"""A small pre-norm vision transformer with DINOv3's axial rotary position embedding.

DEIMv2's distilled ViT-Tiny / ViT-Tiny+ (S, M) and EdgeCrafter's ECViT are this network: patch
tokens at stride 16 after a pluggable patch embedding, one learned prefix token (DEIMv2 calls it
the class token, ECViT a register token) that takes no rotation, then ``depth`` blocks of
``x + attn(LN(x))``, ``x + MLP(LN(x))`` (LayerNorm eps 1e-6, a biased fused qkv projection, GELU
MLP, no layer scale). The trunk returns the patch tokens after the requested blocks, without a
final norm.

Rotary embedding (DINOv3's ``RopePositionEmbedding`` with ``normalize_coords="separate"``): token
``(r, c)`` of an ``h × w`` grid sits at ``y = 2(r + ½)/h − 1``, ``x = 2(c + ½)/w − 1``; with
``P = head_dim / 4`` periods ``base^(2p / (head_dim/2))`` the angles are ``2π·y/period_p`` for the
first ``P`` channels and ``2π·x/period_p`` for the next ``P``; the angle vector is repeated to the
full head dimension and applied in the "rotate half" layout (channel ``j`` pairs with ``j + d/2``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["AxialRope", "RopeAttention", "RopeBlock", "RopeViT", "rotate_half"]

_CACHE_SIZE = 8


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(a, b) -> (-b, a)`` over the two halves of the last dimension."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class AxialRope(nn.Module):
    """Sine and cosine tables ``(h·w, head_dim)`` of DINOv3's 2-D rotary embedding (no parameters)."""

    def __init__(self, head_dim: int, base: float = 100.0) -> None:
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"the 2-D rotary embedding needs a head dimension divisible by 4, got {head_dim}")
        quarter = head_dim // 4
        periods = base ** (2 * torch.arange(quarter, dtype=torch.float32) / (head_dim // 2))
        self.register_buffer("periods", periods, persistent=False)
        self._tables: "OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]]" = OrderedDict()

    def forward(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = (height, width, self.periods.device)
        cached = self._tables.get(key)
        if cached is not None:
            return cached
        device = self.periods.device
        ys = (torch.arange(height, dtype=torch.float32, device=device) + 0.5) / height
        xs = (torch.arange(width, dtype=torch.float32, device=device) + 0.5) / width
        grid = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1) * 2.0 - 1.0  # (hw, 2): y, x
        angles = (2 * math.pi * grid[:, :, None] / self.periods[None, None, :]).flatten(1)  # (hw, head_dim / 2)
        angles = angles.repeat(1, 2)
        tables = (angles.sin(), angles.cos())
        self._tables[key] = tables
        while len(self._tables) > _CACHE_SIZE:
            self._tables.popitem(last=False)
        return tables


class RopeAttention(nn.Module):
    """Multi-head self-attention whose queries and keys (prefix tokens excepted) are rotated."""

    def __init__(self, dim: int, num_heads: int, prefix_tokens: int = 1) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} must be divisible by num_heads {num_heads}")
        self.num_heads, self.prefix_tokens = num_heads, prefix_tokens
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, dim // self.num_heads).permute(2, 0, 3, 1, 4)
        sin, cos = rope
        p = self.prefix_tokens
        q = torch.cat([q[:, :, :p], q[:, :, p:] * cos + rotate_half(q[:, :, p:]) * sin], dim=2)
        k = torch.cat([k[:, :, :p], k[:, :, p:] * cos + rotate_half(k[:, :, p:]) * sin], dim=2)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


class RopeBlock(nn.Module):
    """``x + attn(norm1(x))`` then ``x + mlp(norm2(x))``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, eps: float = 1e-6, prefix_tokens: int = 1) -> None:
        super().__init__()
        from timm.layers import Mlp

        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = RopeAttention(dim, num_heads, prefix_tokens)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


class RopeViT(nn.Module):
    """Patch embedding → one prefix token → ``depth`` rotary blocks; returns chosen blocks' patch tokens.

    Args:
        patch_embed: images → ``(B, dim, h, w)`` token map (stride 16 in both families).
        dim, depth, num_heads, mlp_ratio: the transformer.
        out_indices: blocks (0-based) whose outputs are returned.
        rope_base: the rotary periods' base (100 in DINOv3 and both families).
    """

    def __init__(
        self, patch_embed: nn.Module, dim: int, depth: int, num_heads: int, out_indices: Sequence[int], *, mlp_ratio: float = 4.0,
        rope_base: float = 100.0,
    ) -> None:
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.out_indices = tuple(int(i) for i in out_indices)
        if not self.out_indices or max(self.out_indices) >= depth:
            raise ValueError(f"out_indices {self.out_indices} must name blocks of the {depth}")
        self.patch_embed = patch_embed
        self.prefix_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.rope = AxialRope(dim // num_heads, rope_base)
        self.blocks = nn.ModuleList(RopeBlock(dim, num_heads, mlp_ratio) for _ in range(depth))
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.prefix_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, images: torch.Tensor) -> tuple[list[torch.Tensor], tuple[int, int]]:
        """``([B, h·w, dim] per requested block], (h, w))``."""
        grid = self.patch_embed(images)
        height, width = int(grid.shape[2]), int(grid.shape[3])
        x = torch.cat([self.prefix_token.expand(grid.shape[0], -1, -1), grid.flatten(2).transpose(1, 2)], dim=1)
        rope = self.rope(height, width)
        rope = (rope[0].to(x.dtype), rope[1].to(x.dtype))
        outputs = []
        last = max(self.out_indices)
        for index, block in enumerate(self.blocks):
            x = block(x, rope)
            if index in self.out_indices:
                outputs.append(x[:, 1:])
            if index == last:
                break
        return outputs, (height, width)
