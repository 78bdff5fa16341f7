"""RTMDet's loss: dynamic soft-label assignment, quality focal loss (weight 1) + GIoU loss (weight 2).

Following mmdetection's ``RTMDetHead.loss_by_feat`` (``configs/rtmdet/rtmdet_l_8xb32-300e_coco.py``:
``QualityFocalLoss(beta=2.0, loss_weight=1.0)``, ``GIoULoss(loss_weight=2.0)``,
``DynamicSoftLabelAssigner(topk=13)``):

- the class target of a positive is the IoU of its predicted box with its ground truth (0
  elsewhere), learnt with the quality focal loss summed over anchors and classes;
- the box term is ``1 - GIoU`` of the positives' predicted boxes, each weighted by that IoU;
- both are divided by the sum of the positives' IoUs, averaged over the ranks of a distributed
  run (mmdetection's ``reduce_mean``) and clamped at 1: the normaliser is then the same on every
  rank, so DDP's gradient average equals the single-process gradient of the whole batch.

The loss is computed for the whole padded batch with tensor operations only: no loop over
images, no host synchronisation (background anchors carry a zero box weight instead of being
filtered out).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import torch

from zoo_core.assigners.dynamic_soft_label import DynamicSoftLabelAssigner
from zoo_core.losses.detection import pad_targets_per_image
from zoo_core.losses.iou_aware_classification import quality_focal_loss
from zoo_core.ops.boxes import aligned_box_iou, distances_to_boxes
from zoo_core.ops.distributed import mean_over_ranks

__all__ = ["RTMDetLossTerms", "RTMDetLoss"]

CLASS_WEIGHT, BOX_WEIGHT, QFL_BETA = 1.0, 2.0, 2.0


class RTMDetLossTerms(NamedTuple):
    """The two weighted, normalised loss terms (scalars)."""

    cls: torch.Tensor
    box: torch.Tensor


class RTMDetLoss:
    """The loss terms of RTMDet head outputs against the task's M×6 pixel targets (picklable)."""

    def __init__(
        self,
        num_classes: int,
        assigner: DynamicSoftLabelAssigner | None = None,
        *,
        class_weight: float = CLASS_WEIGHT,
        box_weight: float = BOX_WEIGHT,
        beta: float = QFL_BETA,
    ) -> None:
        self.num_classes = num_classes
        self.assigner = assigner or DynamicSoftLabelAssigner(num_classes, top_k=13, iou_weight=3.0, soft_center_radius=3.0)
        self.class_weight = class_weight
        self.box_weight = box_weight
        self.beta = beta

    def __call__(self, outputs: Mapping[str, torch.Tensor], targets: torch.Tensor, batch_size: int) -> RTMDetLossTerms:
        """Weighted loss terms of ``outputs`` (the head dict) against ``targets`` (M×6, input pixels)."""
        class_logits = outputs["class_logits"].float()
        distances = outputs["box_distances"].float()
        anchor_points, anchor_strides = outputs["anchor_points"], outputs["anchor_strides"]
        if class_logits.shape[-1] != self.num_classes:
            raise ValueError(f"the head predicts {class_logits.shape[-1]} classes but the loss was built for {self.num_classes}")
        gt_labels, gt_boxes, gt_mask = pad_targets_per_image(
            targets.to(class_logits.device, torch.float32), batch_size, num_classes=self.num_classes
        )
        pred_boxes = distances_to_boxes(distances, anchor_points)
        assignment = self.assigner(
            class_logits.detach(), pred_boxes.detach(), anchor_points, anchor_strides, gt_labels, gt_boxes, gt_mask
        )
        normaliser = mean_over_ranks(assignment.quality.sum()).clamp(min=1.0)

        cls_loss = quality_focal_loss(class_logits, assignment.scores, beta=self.beta).sum() / normaliser
        # Every anchor enters the GIoU term; background anchors weigh 0, so no data-dependent filtering
        # (and no host sync) is needed and the regression branch always stays in the graph.
        giou = aligned_box_iou(pred_boxes, assignment.boxes, kind="giou")
        box_loss = ((1.0 - giou) * assignment.quality).sum() / normaliser
        return RTMDetLossTerms(cls=cls_loss * self.class_weight, box=box_loss * self.box_weight)
