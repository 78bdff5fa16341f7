"""DEIMv2's training criterion: DEIM's (``zoo_core.detr.criterion.SetCriterion`` with MAL) plus two switches.

- **Epoch-aware matcher** (DEIMv2 ``change_matcher``): from ``matcher_change_epoch`` on, the
  Hungarian cost of query ``q`` for target ``t`` is ``−p_q[c_t] · IoU(q, t)^α`` (α = 4,
  ``iou_order_alpha``) instead of the focal + L1 + GIoU cost. ``SwitchingHungarianMatcher`` holds
  the flag; the training recipe's ``on_epoch_start`` flips it (``zoo_deimv2.recipe``).
- **Local losses and GO-union** per size: the HGNetv2 Atto/Femto/Pico recipes train without FGL/DDF
  (``losses: [mal, boxes]``) and without the GO-LSD match union (``use_uni_set: False``); N-X use
  both.
"""

from __future__ import annotations

import torch
from torchvision.ops import box_iou

from zoo_core.detr.criterion import CriterionConfig, SetCriterion
from zoo_core.detr.geometry import cxcywh_to_xyxy
from zoo_core.detr.matcher import HungarianMatcher
from zoo_core.detr.targets import DETRTargets

__all__ = ["SwitchingHungarianMatcher", "DEIMv2Criterion", "criterion_config"]


def criterion_config(go_union: bool) -> CriterionConfig:
    """DEIMv2's weights: MAL (γ 1.5) 1, L1 5, GIoU 2, FGL 0.15, DDF 1.5; matcher 2/5/2 (focal α .25, γ 2)."""
    return CriterionConfig(classification="mal", gamma=1.5, mal_alpha=None, go_union=go_union)


class SwitchingHungarianMatcher(HungarianMatcher):
    """``HungarianMatcher`` whose cost becomes ``−p·IoU^α`` while ``iou_ordered`` is set."""

    def __init__(self, *args, iou_order_alpha: float = 4.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.iou_order_alpha = iou_order_alpha
        self.iou_ordered = False

    @torch.no_grad()
    def cost_matrix(self, logits: torch.Tensor, boxes: torch.Tensor, targets: DETRTargets) -> torch.Tensor:
        if not self.iou_ordered:
            return super().cost_matrix(logits, boxes, targets)
        batch, queries = logits.shape[:2]
        probability = logits.flatten(0, 1).float().sigmoid()[:, targets.labels]
        iou = box_iou(cxcywh_to_xyxy(boxes.flatten(0, 1).float()), cxcywh_to_xyxy(targets.boxes))
        return (-probability * iou.pow(self.iou_order_alpha)).reshape(batch, queries, -1)


class DEIMv2Criterion(SetCriterion):
    """``SetCriterion`` with the switching matcher and, for ``local=False``, no FGL/DDF terms (they read 0)."""

    def __init__(self, num_classes: int, *, go_union: bool, local: bool, iou_order_alpha: float = 4.0, distributed: bool = True) -> None:
        super().__init__(num_classes, criterion_config(go_union), distributed=distributed)
        c = self.config
        self.matcher = SwitchingHungarianMatcher(c.cost_class, c.cost_bbox, c.cost_giou, c.matcher_alpha, c.matcher_gamma, iou_order_alpha=iou_order_alpha)
        self.use_local = local

    def local(self, outputs, layers, match, targets, normaliser, positives_scale):
        if not self.use_local:
            zero = layers[-1]["corners"].sum() * 0
            return zero, zero, positives_scale
        return super().local(outputs, layers, match, targets, normaliser, positives_scale)
