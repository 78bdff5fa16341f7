"""Mask terms of the DETR set criterion and matcher (D-FINE-seg's, as LibreYOLO 1.6.0 trains it).

- **Matching**: for every decoder layer whose outputs carry ``masks`` (B×Q×h×w logits), each
  query/target pair's cost gains ``cost_mask · focal`` (the sigmoid focal cost of the matcher's
  α and γ, averaged over the pixels) and ``cost_dice · (1 − dice)`` of the mask probabilities;
  the target masks are resized bilinearly to the logits' size. The proposals (encoder) and the
  initial boxes carry no masks and keep the box costs only.
- **Loss** (each layer with masks, matched by its own match; the denoising layers by their
  ground-truth pairs): BCE over the pixels inside the target's box divided by the box's area in
  mask pixels, and a dice loss on the box-cropped probabilities and target; both averaged over
  the matched pairs (no normalisation by the box count), weights 1 and 1.

``MaskSetCriterion`` adds these to ``SetCriterion`` through its ``extra_match_costs`` and
``extra_terms`` hooks; its items gain ``mask_bce`` and ``mask_dice``. The targets must carry the
masks (``DETRTargets.with_masks``, at the logits' size).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zoo_core.detr.criterion import CriterionConfig, SetCriterion
from zoo_core.detr.matcher import Match
from zoo_core.detr.targets import DETRTargets

__all__ = [
    "MaskLossConfig",
    "MaskSetCriterion",
    "mask_focal_cost",
    "mask_dice_cost",
    "box_regions",
    "cropped_mask_bce",
    "cropped_mask_dice",
    "resize_target_masks",
]


@dataclass(frozen=True)
class MaskLossConfig:
    """Weights of the mask terms (LibreYOLO 1.6.0's ``DFINEConfig`` defaults: all 1)."""

    weight_bce: float = 1.0
    weight_dice: float = 1.0
    cost_mask: float = 1.0
    cost_dice: float = 1.0
    eps: float = 1e-6


def resize_target_masks(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``masks`` (T×H×W, 0/1) as float at ``size`` (bilinear, ``align_corners=False``, clamped to [0, 1])."""
    masks = masks.float()
    if tuple(masks.shape[-2:]) == tuple(size):
        return masks
    if len(masks) == 0:
        return masks.new_zeros((0, *size))
    return F.interpolate(masks[:, None], size=tuple(size), mode="bilinear", align_corners=False)[:, 0].clamp(0, 1)


def mask_focal_cost(logits: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0) -> torch.Tensor:
    """``(Q, T)`` sigmoid focal cost, averaged over the ``P`` pixels, of ``logits`` (Q×P) against ``targets`` (T×P)."""
    logits, targets = logits.float(), targets.float()
    probability = logits.sigmoid()
    negative = (1 - alpha) * probability**gamma * -(1 - probability + 1e-8).log()
    positive = alpha * (1 - probability) ** gamma * -(probability + 1e-8).log()
    return (positive @ targets.T + negative @ (1 - targets).T) / logits.shape[1]


def mask_dice_cost(probabilities: torch.Tensor, targets: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``(Q, T)`` ``1 − dice`` of ``probabilities`` (Q×P) against ``targets`` (T×P)."""
    probabilities, targets = probabilities.float(), targets.float()
    overlap = 2 * probabilities @ targets.T
    total = probabilities.sum(1, keepdim=True) + targets.sum(1)[None]
    return 1 - (overlap + eps) / (total + eps)


def box_regions(boxes: torch.Tensor, size: tuple[int, int], dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(n×h×w inside-the-box 0/1 maps, n box areas ≥ 1)`` of normalised cxcywh ``boxes`` in mask pixels of ``size``.

    Corners are clamped so a box keeps at least one pixel column and row: ``x1`` to ``[0, w − 1]``,
    ``x2`` to ``[1, w]`` (rows alike); a pixel is inside when ``x1 ≤ column < x2`` and ``y1 ≤ row < y2``.
    """
    height, width = size
    cx, cy, w, h = boxes.float().unbind(-1)
    x1 = ((cx - w * 0.5) * width).clamp(0, width - 1)
    y1 = ((cy - h * 0.5) * height).clamp(0, height - 1)
    x2 = ((cx + w * 0.5) * width).clamp(1, width)
    y2 = ((cy + h * 0.5) * height).clamp(1, height)
    columns = torch.arange(width, device=boxes.device, dtype=dtype)[None, None, :]
    rows = torch.arange(height, device=boxes.device, dtype=dtype)[None, :, None]
    x1, y1, x2, y2 = (value.to(dtype)[:, None, None] for value in (x1, y1, x2, y2))
    inside = ((columns >= x1) & (columns < x2)).to(dtype) * ((rows >= y1) & (rows < y2)).to(dtype)
    area = ((x2 - x1) * (y2 - y1)).flatten().clamp(min=1.0)
    return inside, area


def cropped_mask_bce(logits: torch.Tensor, targets: torch.Tensor, inside: torch.Tensor, area: torch.Tensor) -> torch.Tensor:
    """Mean over instances of the BCE summed inside each box and divided by the box's area."""
    bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    return (bce * inside).sum(dim=(1, 2)).div(area).mean()


def cropped_mask_dice(logits: torch.Tensor, targets: torch.Tensor, inside: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Mean over instances of ``1 − dice`` between the box-cropped probabilities and the box-cropped target."""
    predicted = (logits.sigmoid() * inside).flatten(1)
    target = (targets * inside).flatten(1)
    overlap = (predicted * target).sum(1)
    return (1.0 - (2.0 * overlap + eps) / (predicted.sum(1) + target.sum(1) + eps)).mean()


class MaskSetCriterion(SetCriterion):
    """``SetCriterion`` with the mask matching costs and losses of the module docstring."""

    def __init__(self, num_classes: int, config: CriterionConfig | None = None, masks: MaskLossConfig | None = None, *,
                 distributed: bool = True) -> None:
        super().__init__(num_classes, config, distributed=distributed)
        self.masks = masks or MaskLossConfig()

    @staticmethod
    def _target_masks(targets: DETRTargets) -> torch.Tensor:
        if targets.masks is None:
            raise ValueError("mask losses need the targets' masks: pack them with DETRTargets.with_masks (a segmenter's loss does)")
        return targets.masks

    @torch.no_grad()
    def extra_match_costs(self, levels: list[dict[str, torch.Tensor]], targets: DETRTargets) -> list[torch.Tensor | None] | None:
        if not any("masks" in item for item in levels) or targets.total == 0:
            return None
        target_masks = self._target_masks(targets)
        costs: list[torch.Tensor | None] = []
        offsets = targets.offsets
        m = self.masks
        for item in levels:
            if "masks" not in item:
                costs.append(None)
                continue
            logits = item["masks"]
            batch, queries = logits.shape[:2]
            resized = resize_target_masks(target_masks, tuple(logits.shape[-2:])).flatten(1)
            cost = logits.new_zeros((batch, queries, targets.total), dtype=torch.float32)
            for image, count in enumerate(targets.counts):
                if count == 0:
                    continue
                start = offsets[image]
                own = resized[start : start + count]
                flat = logits[image].flatten(1).float()
                block = m.cost_dice * mask_dice_cost(flat.sigmoid(), own, m.eps) if m.cost_dice else 0.0
                if m.cost_mask:
                    block = block + m.cost_mask * mask_focal_cost(flat, own, self.config.matcher_alpha, self.config.matcher_gamma)
                cost[image, :, start : start + count] = block
            costs.append(cost)
        return costs

    def _mask_terms(self, logits: torch.Tensor, match: Match, targets: DETRTargets) -> tuple[torch.Tensor, torch.Tensor]:
        if len(match) == 0:
            zero = logits.sum() * 0.0
            return zero, zero
        size = tuple(logits.shape[-2:])
        predicted = logits[match.batch, match.query].float()
        target = resize_target_masks(self._target_masks(targets)[match.target], size)
        inside, area = box_regions(targets.boxes[match.target], size)
        return cropped_mask_bce(predicted, target, inside, area), cropped_mask_dice(predicted, target, inside, self.masks.eps)

    def extra_terms(self, levels, matches, denoising_layers, denoising_match, targets) -> dict[str, torch.Tensor]:
        pairs = [(item, match) for item, match in zip(levels, matches) if "masks" in item]
        if denoising_match is not None:
            pairs += [(item, denoising_match) for item in denoising_layers if "masks" in item]
        if not pairs:
            return {}
        bce: torch.Tensor | float = 0.0
        dice: torch.Tensor | float = 0.0
        for item, match in pairs:
            level_bce, level_dice = self._mask_terms(item["masks"], match, targets)
            bce, dice = bce + level_bce, dice + level_dice
        return {"mask_bce": self.masks.weight_bce * bce, "mask_dice": self.masks.weight_dice * dice}
