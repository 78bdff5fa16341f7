"""Multi-scale deformable attention (Zhu et al., Deformable DETR, ICLR 2021) in pure PyTorch.

Each query attends to a few sampled points per feature level instead of every position: a linear
layer predicts, per head, sampling offsets around the query's reference point and softmax weights
over all its points; the output is the weighted sum of bilinearly sampled values
(``F.grid_sample``, zero padding, ``align_corners=False``). No compiled kernel is needed, and the
same code runs on CPU, CUDA and in ONNX export.

``MultiScaleDeformableAttention`` covers the variants of the RT-DETR family:

- value and output projections (Deformable DETR, RT-DETR) or none (D-FINE, DEIM: the decoder
  passes the encoder memory directly, split per head once per forward with ``split_value``);
- the same number of points on every level, or a per-level count (D-FINE's ``(3, 6, 3)``);
- reference points as centres ``(x, y)`` (offsets in units of the level's pixels) or as boxes
  ``(cx, cy, w, h)`` (offsets scaled by the box size, ``offset_scale / points_of_the_level``).

Layouts: ``value`` levels are ``(batch·heads, head_dim, h, w)``; sampling locations are
``(batch, queries, heads, points, 2)`` in [0, 1] image fractions, points ordered level by level;
weights are ``(batch, queries, heads, points)``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["deformable_sampling", "MultiScaleDeformableAttention"]

SpatialShapes = Sequence[tuple[int, int]]


def deformable_sampling(
    value_levels: Sequence[torch.Tensor],
    spatial_shapes: SpatialShapes,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    points_per_level: Sequence[int],
) -> torch.Tensor:
    """The attention core: sample every level, weight and sum; returns ``(batch, queries, heads·head_dim)``.

    Args:
        value_levels: one ``(batch·heads, head_dim, h_l, w_l)`` tensor per level.
        spatial_shapes: ``(h_l, w_l)`` per level.
        sampling_locations: ``(batch, queries, heads, sum(points_per_level), 2)``, x then y in [0, 1].
        attention_weights: ``(batch, queries, heads, sum(points_per_level))`` (already normalised).
        points_per_level: sampling points of each level.
    """
    batch, queries, heads, total_points, _ = sampling_locations.shape
    head_dim = value_levels[0].shape[1]
    # grid_sample wants [-1, 1] coordinates and one grid per (batch, head) image.
    grids = (2 * sampling_locations - 1).transpose(1, 2).reshape(batch * heads, queries, total_points, 2)
    sampled = [
        F.grid_sample(level_value, level_grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        for level_value, level_grid in zip(value_levels, grids.split(list(points_per_level), dim=2))
    ]  # each (batch·heads, head_dim, queries, points_l)
    weights = attention_weights.transpose(1, 2).reshape(batch * heads, 1, queries, total_points)
    output = (torch.cat(sampled, dim=-1) * weights).sum(-1)  # (batch·heads, head_dim, queries)
    return output.reshape(batch, heads * head_dim, queries).transpose(1, 2)


class MultiScaleDeformableAttention(nn.Module):
    """Deformable cross-attention of ``queries`` over a multi-level feature memory.

    Args:
        embed_dim: query and value width.
        num_heads: attention heads (``embed_dim`` divisible by it).
        points_per_level: sampling points per head on each level (its length is the level count).
        value_projection: a linear projection of the memory before sampling (and of the output
            after it); False samples the memory as it is (D-FINE).
        offset_scale: box references only: offsets are multiplied by ``offset_scale · size /
            points_of_the_level`` (0.5 in every published model).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        points_per_level: Sequence[int],
        *,
        value_projection: bool = True,
        offset_scale: float = 0.5,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.points_per_level = tuple(int(p) for p in points_per_level)
        self.num_levels = len(self.points_per_level)
        self.total_points = sum(self.points_per_level)
        self.offset_scale = offset_scale
        self.sampling_offsets = nn.Linear(embed_dim, num_heads * self.total_points * 2)
        self.attention_weights = nn.Linear(embed_dim, num_heads * self.total_points)
        self.value_proj = nn.Linear(embed_dim, embed_dim) if value_projection else None
        self.output_proj = nn.Linear(embed_dim, embed_dim) if value_projection else None
        # 1 / (points of its level), per point: box-reference offsets are divided by the level's count.
        scale = torch.cat([torch.full((p,), 1.0 / p) for p in self.points_per_level])
        self.register_buffer("point_scale", scale, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Published initialisation: offsets start on a ring of directions, one per head, at radius 1..P."""
        nn.init.zeros_(self.sampling_offsets.weight)
        angles = torch.arange(self.num_heads, dtype=torch.float32) * (2.0 * math.pi / self.num_heads)
        directions = torch.stack([angles.cos(), angles.sin()], -1)
        directions = directions / directions.abs().max(-1, keepdim=True).values
        radii = torch.cat([torch.arange(1, p + 1, dtype=torch.float32) for p in self.points_per_level])
        with torch.no_grad():
            self.sampling_offsets.bias.copy_((directions[:, None, :] * radii[None, :, None]).flatten())
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for projection in (self.value_proj, self.output_proj):
            if projection is not None:
                nn.init.xavier_uniform_(projection.weight)
                nn.init.zeros_(projection.bias)

    def split_value(self, memory: torch.Tensor, spatial_shapes: SpatialShapes) -> list[torch.Tensor]:
        """``(batch, Σ h·w, embed_dim)`` memory → per-level ``(batch·heads, head_dim, h, w)`` values.

        Applies the value projection when the module has one. A decoder whose layers have none
        can call this once and pass the result to every layer (``value_levels``).
        """
        if self.value_proj is not None:
            memory = self.value_proj(memory)
        batch = memory.shape[0]
        # (batch, tokens, heads, head_dim) → (batch, heads, head_dim, tokens)
        per_head = memory.reshape(batch, memory.shape[1], self.num_heads, self.head_dim).permute(0, 2, 3, 1)
        levels = per_head.split([h * w for h, w in spatial_shapes], dim=-1)
        return [level.reshape(batch * self.num_heads, self.head_dim, h, w) for level, (h, w) in zip(levels, spatial_shapes)]

    def sampling_locations(self, query: torch.Tensor, reference_points: torch.Tensor, spatial_shapes: SpatialShapes) -> torch.Tensor:
        """Where each head samples: ``(batch, queries, heads, points, 2)`` in image fractions."""
        batch, queries = query.shape[:2]
        offsets = self.sampling_offsets(query).reshape(batch, queries, self.num_heads, self.total_points, 2)
        if reference_points.shape[-1] == 4:  # (batch, queries, 1, 4) boxes: offsets relative to the box size
            scaled = offsets * self.point_scale.to(query.dtype)[:, None] * reference_points[:, :, None, :, 2:] * self.offset_scale
            return reference_points[:, :, None, :, :2] + scaled
        if reference_points.shape[-1] == 2:  # (batch, queries, levels, 2) centres: offsets in level pixels
            sizes = torch.tensor([[w, h] for h, w in spatial_shapes], dtype=query.dtype, device=query.device)
            per_point_size = sizes.repeat_interleave(torch.tensor(self.points_per_level, device=query.device), dim=0)
            per_point_ref = reference_points.repeat_interleave(torch.tensor(self.points_per_level, device=query.device), dim=2)
            return per_point_ref[:, :, None] + offsets / per_point_size
        raise ValueError(f"reference points must end in 2 (x, y) or 4 (cx, cy, w, h) values, got {tuple(reference_points.shape)}")

    def forward(
        self,
        query: torch.Tensor,
        reference_points: torch.Tensor,
        memory: torch.Tensor | None,
        spatial_shapes: SpatialShapes,
        value_levels: Sequence[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``(batch, queries, embed_dim)`` attended features.

        Args:
            query: ``(batch, queries, embed_dim)`` (position embedding already added).
            reference_points: ``(batch, queries, 1, 4)`` boxes or ``(batch, queries, levels, 2)`` centres.
            memory: ``(batch, Σ h·w, embed_dim)`` flattened levels; unused when ``value_levels`` is given.
            spatial_shapes: ``(h, w)`` of each level.
            value_levels: ``split_value(memory, spatial_shapes)`` computed once by the caller.
        """
        if value_levels is None:
            if memory is None:
                raise ValueError("pass the memory or its split value_levels")
            value_levels = self.split_value(memory, spatial_shapes)
        batch, queries = query.shape[:2]
        weights = self.attention_weights(query).reshape(batch, queries, self.num_heads, self.total_points).softmax(-1)
        locations = self.sampling_locations(query, reference_points, spatial_shapes)
        output = deformable_sampling(value_levels, spatial_shapes, locations, weights, self.points_per_level)
        return self.output_proj(output) if self.output_proj is not None else output
