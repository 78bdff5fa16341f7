"""PP-YOLOE's detection loss, as YOLO-NAS trains with it (super-gradients ``PPYoloELoss``).

Per anchor of a dense DFL head (outputs of ``model.YoloNasHead``):

- **assignment**: the task-aligned assigner (``top_k=13, alpha=1, beta=6``, PP-YOLOE's form:
  plain IoU in the metric, a contested anchor going to the box its prediction overlaps most) on
  detached predictions, or, while ``static`` is set, ATSS (``top_k=9``) on ``5 × stride`` anchor
  boxes with the predicted-box IoU as class target (PP-YOLOE's first epochs; YOLO-NAS's recipe
  ``use_static_assigner: False`` never uses it);
- **classification**: varifocal loss (alpha 0.75, gamma 2) against the soft targets, summed; the
  negatives' weight ``alpha * p ** gamma`` keeps its gradient, as in super-gradients' code;
- **box**: ``1 - GIoU`` of predicted and assigned boxes, and DFL of the side distances (in
  strides, clipped to ``bins - 1.01``), each weighted by the anchor's target-score sum;
- every sum is divided by the batch's target-score sum averaged over DDP ranks, then clamped at
  1 (super-gradients' all-reduce / world size / clip; two ranks at batch B/2 then compute one
  process's gradient at batch B), and weighted cls 1.0, iou 2.5, dfl 0.5
  (``coco2017_yolo_nas_*`` recipes, PPYoloELoss defaults).

No Python loop over images or targets and no host synchronisation besides the padding of the
targets: positive-only terms are computed for every anchor and masked by a zero weight.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import torch

from zoo_core.assigners.atss import ATSSAssigner, grid_anchor_boxes
from zoo_core.assigners.task_aligned import TaskAlignedAssigner
from zoo_core.losses.detection import distribution_focal_loss, pad_targets_per_image
from zoo_core.losses.iou_aware_classification import varifocal_loss
from zoo_core.nn.detection_head import distribution_to_distances
from zoo_core.ops.boxes import aligned_box_iou, boxes_to_distances, distances_to_boxes
from zoo_core.ops.distributed import mean_over_ranks

__all__ = ["PPYOLOELossTerms", "PPYOLOELoss"]


class PPYOLOELossTerms(NamedTuple):
    """The weighted, normalised terms (scalars)."""

    cls: torch.Tensor
    iou: torch.Tensor
    dfl: torch.Tensor

    def total(self) -> torch.Tensor:
        """Sum of the three terms (the loss to back-propagate)."""
        return self.cls + self.iou + self.dfl


class PPYOLOELoss:
    """PP-YOLOE / YOLO-NAS loss of one dense head's outputs (stateless, picklable)."""

    def __init__(
        self,
        num_classes: int,
        bins: int = 17,
        *,
        class_weight: float = 1.0,
        iou_weight: float = 2.5,
        dfl_weight: float = 0.5,
        tal_top_k: int = 13,
        tal_alpha: float = 1.0,
        tal_beta: float = 6.0,
        atss_top_k: int = 9,
        grid_cell_scale: float = 5.0,
    ) -> None:
        self.num_classes = num_classes
        self.bins = bins
        self.class_weight, self.iou_weight, self.dfl_weight = class_weight, iou_weight, dfl_weight
        self.grid_cell_scale = grid_cell_scale
        self.assigner = TaskAlignedAssigner(
            num_classes, top_k=tal_top_k, alpha=tal_alpha, beta=tal_beta, iou_kind="iou", contested="all"
        )
        self.static_assigner = ATSSAssigner(num_classes, top_k=atss_top_k)

    def __call__(
        self,
        outputs: Mapping[str, torch.Tensor],
        targets: torch.Tensor,
        batch_size: int,
        level_sizes: Sequence[int],
        *,
        static: bool = False,
    ) -> PPYOLOELossTerms:
        """Terms of ``outputs`` against ``targets`` (M×6: image, class, x1, y1, x2, y2 in pixels)."""
        return self.compute(outputs, targets, batch_size, level_sizes, static=static)[0]

    def compute(
        self,
        outputs: Mapping[str, torch.Tensor],
        targets: torch.Tensor,
        batch_size: int,
        level_sizes: Sequence[int],
        *,
        static: bool = False,
    ) -> tuple[PPYOLOELossTerms, Any, torch.Tensor]:
        """``(terms, assignment, normaliser)``: the terms, the assignment they used (``labels``, ``boxes``, ``scores``,
        ``foreground``, ``gt_index`` per anchor) and the rank-averaged target-score sum they were divided by, for a
        loss that adds terms of its own on the same positives (YOLO-NAS-Pose's keypoints)."""
        box_logits = outputs["box_logits"].float()
        class_logits = outputs["class_logits"].float()
        anchor_points, anchor_strides = outputs["anchor_points"].float(), outputs["anchor_strides"].float()
        if class_logits.shape[-1] != self.num_classes:
            raise ValueError(f"the head predicts {class_logits.shape[-1]} classes but the loss was built for {self.num_classes}")
        gt_labels, gt_boxes, gt_mask = pad_targets_per_image(targets.to(box_logits.device, torch.float32), batch_size)

        pred_boxes = distances_to_boxes(distribution_to_distances(box_logits, self.bins) * anchor_strides, anchor_points)
        if static:
            anchor_boxes = grid_anchor_boxes(anchor_points, anchor_strides, self.grid_cell_scale)
            assignment = self.static_assigner(anchor_boxes, level_sizes, gt_labels, gt_boxes, gt_mask, pred_boxes.detach())
        else:
            assignment = self.assigner(
                class_logits.detach().sigmoid(), pred_boxes.detach(), anchor_points, gt_labels, gt_boxes, gt_mask
            )
        foreground = assignment.foreground
        positive = torch.zeros_like(class_logits, dtype=torch.bool).scatter_(-1, assignment.labels[..., None], True)
        positive &= foreground[..., None]
        cls_sum = varifocal_loss(class_logits, assignment.scores, positive, detach_weight=False).sum()

        # Box terms for every anchor, weighted by its target-score sum (zero off the positives).
        weight = assignment.scores.sum(dim=-1) * foreground
        giou = aligned_box_iou(pred_boxes, assignment.boxes, kind="giou")
        iou_sum = ((1.0 - giou) * weight).sum()
        target_distances = boxes_to_distances(assignment.boxes, anchor_points) / anchor_strides
        target_distances = target_distances.clamp(max=self.bins - 1 - 0.01)
        dfl = distribution_focal_loss(box_logits.unflatten(-1, (4, self.bins)), target_distances)
        dfl_sum = (dfl * weight).sum()

        normaliser = mean_over_ranks(assignment.scores.sum()).clamp(min=1.0)
        terms = PPYOLOELossTerms(
            cls=self.class_weight * cls_sum / normaliser,
            iou=self.iou_weight * iou_sum / normaliser,
            dfl=self.dfl_weight * dfl_sum / normaliser,
        )
        return terms, assignment, normaliser
