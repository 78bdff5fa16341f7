"""The FDR decoder as DEIMv2 and EdgeCrafter configure it, on ``zoo_core.detr.decoder``.

``ViTDistributionDecoder`` is ``DistributionRefinementDecoder`` (D-FINE's fine-grained
distribution refinement, LQE, GO-LSD-ready outputs) with what both families change:

- query selection scores the (validity-masked) memory directly: no ``enc_output`` linear +
  LayerNorm before the proposal heads;
- the query position embedding is a 3-layer MLP ``4 → dim → dim → dim`` and is computed **once**
  from the initial (selected or denoising) references, then reused by every layer (D-FINE
  recomputes it from each layer's refined box);
- ``shared_box_head``: one distribution head serves every layer (DEIMv2 Atto/Femto/Pico);
- ``layer="rms_swiglu"``: DEIMv2's ``RMSDecoderLayer`` (RMSNorm everywhere, SwiGLU feed-forward
  of hidden width ``ffn_dim // 2``, gated or plain cross-attention residual); ``"layer_norm"``:
  ``zoo_core.detr.decoder.DecoderLayer`` as D-FINE's, with the family's activation (ECDet).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.detr.decoder import MLP, DecoderLayer, DistributionRefinementDecoder

__all__ = ["SwiGLU", "RMSNorm", "RMSDecoderLayer", "ViTDistributionDecoder"]

RMS_EPS = 1e-6


class SwiGLU(nn.Module):
    """``silu(a) · b`` for the two halves ``(a, b)`` of the last dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = x.chunk(2, dim=-1)
        return F.silu(gate) * value


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` written out (``x · rsqrt(mean(x²) + eps) · weight``, in float32): the same
    parameters and state-dict keys, and a graph that exports to ONNX, which has no ``aten::rms_norm``
    at opset 17."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        return (normed * self.weight.float()).to(x.dtype) if self.weight is not None else normed.to(x.dtype)


class RMSDecoderLayer(DecoderLayer):
    """DEIMv2's decoder layer: ``DecoderLayer`` with RMSNorms and a SwiGLU feed-forward.

    ``ffn_in`` (DEIMv2's ``w12``) maps to ``2 · (ffn_dim // 2)``, ``ffn_act`` is ``SwiGLU`` and
    ``ffn_out`` (``w3``) maps ``ffn_dim // 2`` back, so ``DecoderLayer.forward`` runs unchanged.
    """

    def __init__(self, dim: int, num_heads: int, ffn_dim: int, points_per_level: Sequence[int], *, gated: bool = True) -> None:
        super().__init__(dim, num_heads, ffn_dim, points_per_level, activation="silu", gated=gated, value_projection=False)
        hidden = ffn_dim // 2
        self.norm_self = RMSNorm(dim, eps=RMS_EPS)
        if gated:
            self.gate.norm = RMSNorm(dim, eps=RMS_EPS)
        else:
            self.norm_cross = RMSNorm(dim, eps=RMS_EPS)
        self.ffn_in = nn.Linear(dim, 2 * hidden)
        self.ffn_act = SwiGLU()
        self.ffn_out = nn.Linear(hidden, dim)
        self.norm_ffn = RMSNorm(dim, eps=RMS_EPS)
        for linear in (self.ffn_in, self.ffn_out):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)


class ViTDistributionDecoder(DistributionRefinementDecoder):
    """See the module docstring. Extra args: ``layer`` (``"layer_norm"`` or ``"rms_swiglu"``),
    ``gated`` (cross-attention gateway; ``rms_swiglu`` only may turn it off), ``shared_box_head``."""

    def __init__(
        self,
        num_classes: int,
        in_channels: Sequence[int],
        dim: int = 256,
        num_queries: int = 300,
        num_layers: int = 4,
        *,
        num_heads: int = 8,
        ffn_dim: int = 1024,
        points_per_level: Sequence[int] = (3, 6, 3),
        activation: str = "silu",
        mlp_activation: str = "silu",
        layer: str = "layer_norm",
        gated: bool = True,
        shared_box_head: bool = False,
        **kwargs: Any,
    ) -> None:
        if layer not in ("layer_norm", "rms_swiglu"):
            raise ValueError(f"layer must be 'layer_norm' or 'rms_swiglu', got {layer!r}")
        if layer == "layer_norm" and not gated:
            raise ValueError("the LayerNorm decoder layer is D-FINE's gated one; use layer='rms_swiglu' for a plain residual")
        super().__init__(
            num_classes, in_channels, dim, num_queries, num_layers, num_heads=num_heads, ffn_dim=ffn_dim,
            points_per_level=points_per_level, activation=activation, mlp_activation=mlp_activation, **kwargs,
        )
        self.query_selector.memory_linear = nn.Identity()
        self.query_selector.memory_norm = nn.Identity()
        self.query_position = MLP(4, dim, dim, 3, mlp_activation)
        for linear in self.query_position.layers:
            nn.init.xavier_uniform_(linear.weight)
        if layer == "rms_swiglu":
            self.layers = nn.ModuleList(
                RMSDecoderLayer(dim, num_heads, ffn_dim, points_per_level, gated=gated) for _ in range(num_layers)
            )
        if shared_box_head:
            self.box_heads = nn.ModuleList([self.box_heads[0]] * num_layers)
        self._fixed_position: torch.Tensor | None = None

    def position_embedding(self, reference_boxes: torch.Tensor) -> torch.Tensor:
        """The embedding of the first references this forward saw (every layer reuses it)."""
        if self._fixed_position is None:
            self._fixed_position = super().position_embedding(reference_boxes)
        return self._fixed_position

    def run_layers(self, queries, box_logits, memory, spatial_shapes, attention_mask):
        self._fixed_position = None
        try:
            return super().run_layers(queries, box_logits, memory, spatial_shapes, attention_mask)
        finally:
            self._fixed_position = None
