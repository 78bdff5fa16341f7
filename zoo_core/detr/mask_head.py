"""A query-conditioned instance-mask head for the DETR line (D-FINE-seg's; usable by any ``DETRDecoderBase``).

Two parts:

- ``MaskFeatureFusion``: the maps given to it (finest first; the encoder's outputs, optionally
  with a finer backbone map in front) are each projected by a 1×1 conv and GroupNorm(32), the
  coarser ones upsampled bilinearly to the finest and summed; a 3×3 conv, GroupNorm and ReLU
  smooth the sum, which is upsampled 2× and refined by a second 3×3 conv, GroupNorm and ReLU.
  With a stride-8 finest map the result is at stride 4 (the resolution LibreYOLO's D-FINE-seg
  predicts masks at): ``mask_features``, B×D×H/4×W/4.
- ``QueryMaskHead``: the fusion above plus a 3-layer MLP from each decoder query to a D-vector,
  scaled by ``D^-1/2`` (``mask_coefficients``, B×Q×D); a query's mask logits are its coefficients
  dotted with ``mask_features`` at every pixel (``query_mask_logits``).

The coefficients and features are the segment task's export outputs
(``zoo_core/tasks/segment.py``): the dot product happens in ``postprocess``, so an exported graph
stays small and its masks are computed only for the kept queries.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.detr.decoder import MLP

__all__ = ["MaskFeatureFusion", "QueryMaskHead", "query_mask_logits"]

_GROUPS = 32


class MaskFeatureFusion(nn.Module):
    """Maps (finest first) → one ``dim``-channel map at half the finest map's stride (see the module docstring)."""

    def __init__(self, in_channels: Sequence[int], dim: int = 256) -> None:
        super().__init__()
        if dim % _GROUPS:
            raise ValueError(f"the mask feature width must be a multiple of {_GROUPS} (GroupNorm groups), got {dim}")
        self.lateral = nn.ModuleList(nn.Conv2d(channels, dim, 1, bias=False) for channels in in_channels)
        self.lateral_norms = nn.ModuleList(nn.GroupNorm(_GROUPS, dim) for _ in in_channels)
        self.fusion = nn.Conv2d(dim, dim, 3, padding=1, bias=False)
        self.fusion_norm = nn.GroupNorm(_GROUPS, dim)
        self.refine = nn.Conv2d(dim, dim, 3, padding=1, bias=False)
        self.refine_norm = nn.GroupNorm(_GROUPS, dim)
        # He initialisation for the conv that feeds a ReLU at full resolution (as published)
        nn.init.kaiming_normal_(self.refine.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, maps: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(maps) != len(self.lateral):
            raise ValueError(f"the mask feature fusion takes {len(self.lateral)} maps, got {len(maps)}")
        fused = self.lateral_norms[0](self.lateral[0](maps[0]))
        size = fused.shape[-2:]
        for projection, norm, level in zip(self.lateral[1:], self.lateral_norms[1:], maps[1:]):
            fused = fused + F.interpolate(norm(projection(level)), size=size, mode="bilinear", align_corners=False)
        fused = F.relu(self.fusion_norm(self.fusion(fused)))
        fused = F.interpolate(fused, scale_factor=2.0, mode="bilinear", align_corners=False)
        return F.relu(self.refine_norm(self.refine(fused)))


def query_mask_logits(coefficients: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Mask logits ``B×Q×h×w`` of ``coefficients`` (B×Q×D) over ``features`` (B×D×h×w)."""
    return torch.einsum("bqc,bchw->bqhw", coefficients, features)


class QueryMaskHead(nn.Module):
    """``features`` (``MaskFeatureFusion``) and ``embedding`` (queries → mask coefficients).

    Args:
        in_channels: channels of the maps the fusion takes (finest first).
        query_dim: the decoder's width.
        dim: the mask feature / coefficient width (D-FINE-seg: 128 at N, 256 otherwise).
        activation: the MLP's activation (the decoder's).
    """

    def __init__(self, in_channels: Sequence[int], query_dim: int, dim: int = 256, activation: str = "relu") -> None:
        super().__init__()
        self.dim = dim
        self.features = MaskFeatureFusion(in_channels, dim)
        self.embedding = MLP(query_dim, query_dim, dim, 3, activation)

    def coefficients(self, queries: torch.Tensor) -> torch.Tensor:
        """Each query's mask coefficients (``…×dim``), scaled by ``dim^-1/2`` so the logits' scale does not grow with the width."""
        return self.embedding(queries) * self.dim**-0.5
