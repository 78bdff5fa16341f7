"""Fine-grained distribution refinement (FDR) primitives of D-FINE (Peng et al., arXiv:2410.13842).

D-FINE predicts, for each of a box's four edges, a distribution over ``reg_max + 1`` bins; the
edge offset is the expectation under the non-uniform weighting function ``W(n)`` (fine steps
near 0, coarse near the ends). Offsets are in units of the reference box size / ``reg_scale``
and move each edge outward from half the reference box.

- ``edge_weighting(reg_max, up, reg_scale)``: the bin values ``W(0..reg_max)``;
- ``expected_offsets(logits, weights)``: softmax over bins, expectation → 4 offsets;
- ``offsets_to_boxes`` / ``boxes_to_offsets``: decode offsets against reference boxes, and
  encode target boxes as offsets (the FGL targets);
- ``offsets_to_bins``: a continuous offset as two neighbouring bins and their weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zoo_core.detr.geometry import xyxy_to_cxcywh

__all__ = ["edge_weighting", "expected_offsets", "offsets_to_boxes", "boxes_to_offsets", "offsets_to_bins"]


def edge_weighting(reg_max: int, up: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """``W(n)`` for ``n = 0..reg_max``: ``±2·|up·reg_scale|`` at the ends, 0 in the middle.

    In between, ``±(step^k − 1)`` for ``k = 1..reg_max/2 − 1`` with ``step = (|up·reg_scale| + 1)^(2/(reg_max − 2))``
    (D-FINE Eq. 5). ``up`` and ``reg_scale`` are 1-element tensors (the model's buffers).
    """
    bound = up[0].abs() * reg_scale.abs()
    outer = bound * 2
    step = (bound + 1) ** (2 / (reg_max - 2))
    half = reg_max // 2
    left = [-(step**k) + 1 for k in range(half - 1, 0, -1)]
    right = [step**k - 1 for k in range(1, half)]
    values = [-outer.reshape(1)] + [v.reshape(1) for v in left] + [torch.zeros_like(up[:1])] + [v.reshape(1) for v in right] + [outer.reshape(1)]
    return torch.cat(values, 0)


def expected_offsets(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(..., 4·(reg_max+1))`` bin logits → ``(..., 4)`` expected edge offsets ``Σ softmax·W``."""
    bins = weights.shape[0]
    probabilities = F.softmax(logits.reshape(-1, bins), dim=1)
    return F.linear(probabilities, weights).reshape(*logits.shape[:-1], 4)


def offsets_to_boxes(reference: torch.Tensor, offsets: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """Decode left/top/right/bottom ``offsets`` against cxcywh ``reference`` boxes → cxcywh boxes."""
    reg_scale = reg_scale.abs()
    centre_x, centre_y, width, height = reference.unbind(-1)
    x1 = centre_x - (0.5 * reg_scale + offsets[..., 0]) * (width / reg_scale)
    y1 = centre_y - (0.5 * reg_scale + offsets[..., 1]) * (height / reg_scale)
    x2 = centre_x + (0.5 * reg_scale + offsets[..., 2]) * (width / reg_scale)
    y2 = centre_y + (0.5 * reg_scale + offsets[..., 3]) * (height / reg_scale)
    return xyxy_to_cxcywh(torch.stack([x1, y1, x2, y2], -1))


def offsets_to_bins(offsets: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each offset as ``(left bin index, weight of the right bin, weight of the left bin)``.

    ``left`` is the last bin whose value is at most the offset; the two weights interpolate
    linearly between ``W(left)`` and ``W(left+1)``. Offsets below ``W(0)`` go wholly to bin 0;
    offsets at or beyond ``W(reg_max)`` wholly to the last bin (index ``reg_max − 0.1``, so that
    ``left + 1`` still names a valid bin for the loss).
    """
    reg_max = weights.shape[0] - 1
    flat = offsets.reshape(-1)
    left = (weights[None, :] <= flat[:, None]).sum(1) - 1
    inside = (left >= 0) & (left < reg_max)
    safe = left.clamp(0, reg_max - 1)
    low, high = weights[safe], weights[safe + 1]
    to_low, to_high = (flat - low).abs(), (high - flat).abs()
    weight_right = torch.where(inside, to_low / (to_low + to_high), (left >= reg_max).to(flat.dtype))
    weight_left = torch.where(inside, 1.0 - weight_right, (left < 0).to(flat.dtype))
    index = torch.where(left < 0, torch.zeros_like(flat), left.to(flat.dtype))
    index = torch.where(left >= reg_max, torch.full_like(flat, reg_max - 0.1), index)
    return index, weight_right, weight_left


def boxes_to_offsets(
    reference: torch.Tensor, boxes_xyxy: torch.Tensor, weights: torch.Tensor, reg_scale: torch.Tensor, eps: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FGL targets: the target boxes' edges as offsets from the reference boxes, as bins.

    Returns ``(bin index, right weight, left weight)``, each ``(4·n,)``, the index clamped to
    ``[0, reg_max − eps]`` (detached: targets carry no gradient).
    """
    reg_max = weights.shape[0] - 1
    reg_scale = reg_scale.abs()
    width_unit = reference[:, 2] / reg_scale + 1e-16
    height_unit = reference[:, 3] / reg_scale + 1e-16
    left = (reference[:, 0] - boxes_xyxy[:, 0]) / width_unit - 0.5 * reg_scale
    top = (reference[:, 1] - boxes_xyxy[:, 1]) / height_unit - 0.5 * reg_scale
    right = (boxes_xyxy[:, 2] - reference[:, 0]) / width_unit - 0.5 * reg_scale
    bottom = (boxes_xyxy[:, 3] - reference[:, 1]) / height_unit - 0.5 * reg_scale
    index, weight_right, weight_left = offsets_to_bins(torch.stack([left, top, right, bottom], -1), weights)
    index = index.clamp(min=0, max=reg_max - eps)
    return index.detach(), weight_right.detach(), weight_left.detach()
