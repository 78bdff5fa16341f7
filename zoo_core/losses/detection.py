"""The YOLOv8/YOLOv9 detection loss: BCE classification + CIoU box + Distribution Focal Loss.

Anchors are assigned with the task-aligned assigner; every term is normalised by the sum of the
soft classification targets of the batch (so it does not grow with the batch size), and weighted
by the published gains (YOLOv9 ``hyp.scratch-high.yaml`` / ``utils/loss_tal.py``: box 7.5,
cls 0.5, dfl 1.5).

Scale of the returned loss. The published YOLO recipes (SGD, lr0 0.01) were tuned for a loss
equal to that normalised loss *times the number of images of an optimizer step* (nominal batch
64: the official code returns ``loss * batch_size`` and accumulates to 64 images). zoo's contract
forbids scaling by the actual batch (DDP averages gradients, the engine averages accumulation
steps), so families multiply by the constant ``YOLO_NOMINAL_BATCH_SIZE`` instead: at a global
batch of 64 this reproduces the published gradient magnitude exactly, and the published lr stays
valid at any batch size or world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple

import torch
import torch.nn.functional as F

from zoo_core.assigners.task_aligned import TaskAlignedAssigner, TaskAlignedAssignment
from zoo_core.nn.detection_head import distribution_to_distances
from zoo_core.ops.boxes import aligned_box_iou, boxes_to_distances, distances_to_boxes

__all__ = [
    "YOLO_NOMINAL_BATCH_SIZE",
    "DetectionLossGains",
    "DetectionLossTerms",
    "pad_targets_per_image",
    "target_rows_per_image",
    "distribution_focal_loss",
    "TaskAlignedDetectionLoss",
]

YOLO_NOMINAL_BATCH_SIZE = 64
"""Images per optimizer step that YOLO's published learning rates assume (``nbs`` in YOLO code)."""


@dataclass(frozen=True)
class DetectionLossGains:
    """Weights of the three loss terms (YOLOv9 defaults)."""

    box: float = 7.5
    cls: float = 0.5
    dfl: float = 1.5


class DetectionLossTerms(NamedTuple):
    """The three normalised, un-weighted loss terms (scalars)."""

    box: torch.Tensor
    cls: torch.Tensor
    dfl: torch.Tensor

    def weighted(self, gains: DetectionLossGains) -> "DetectionLossTerms":
        """The terms multiplied by their gains."""
        return DetectionLossTerms(self.box * gains.box, self.cls * gains.cls, self.dfl * gains.dfl)

    def scaled(self, factor: float) -> "DetectionLossTerms":
        """Every term multiplied by ``factor``."""
        return DetectionLossTerms(self.box * factor, self.cls * factor, self.dfl * factor)

    def plus(self, other: "DetectionLossTerms", weight: float = 1.0) -> "DetectionLossTerms":
        """These terms plus ``weight`` times ``other``'s, term by term."""
        return DetectionLossTerms(self.box + weight * other.box, self.cls + weight * other.cls, self.dfl + weight * other.dfl)

    def total(self) -> torch.Tensor:
        """Sum of the three terms."""
        return self.box + self.cls + self.dfl


def pad_targets_per_image(
    targets: torch.Tensor, batch_size: int, num_classes: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Turn the task's M×6 targets (image index, class, x1, y1, x2, y2) into padded per-image tensors.

    Returns ``labels`` (B×G int64), ``boxes`` (B×G×4) and ``mask`` (B×G bool, False for padding),
    with G the largest number of boxes of one image (0 when there are no targets). With
    ``num_classes`` the class ids are checked to lie in ``[0, num_classes)`` too. The tensor shapes
    depend on the data, so this reads three numbers from the device once (one synchronisation,
    none for an empty batch); every check rides on that read.
    """
    if targets.dim() != 2 or targets.shape[1] != 6:
        raise ValueError(f"targets must be M×6 (image index, class, x1, y1, x2, y2), got shape {tuple(targets.shape)}")
    device = targets.device
    image_index = targets[:, 0].long()
    max_boxes = 0
    if image_index.numel():
        counts = torch.bincount(image_index.clamp(min=0), minlength=batch_size)
        class_ids = targets[:, 1].long()
        first_index, last_index, max_boxes, first_class, last_class = torch.stack(
            (image_index.min(), image_index.max(), counts.max(), class_ids.min(), class_ids.max())
        ).tolist()
        if first_index < 0 or last_index >= batch_size:
            raise ValueError(f"target image indices must lie in [0, {batch_size}) for a batch of {batch_size} images")
        if num_classes is not None and (first_class < 0 or last_class >= num_classes):
            raise ValueError(f"target classes must lie in [0, {num_classes}); got {first_class}..{last_class}")
    labels = torch.zeros(batch_size, max_boxes, dtype=torch.int64, device=device)
    boxes = torch.zeros(batch_size, max_boxes, 4, dtype=targets.dtype, device=device)
    mask = torch.zeros(batch_size, max_boxes, dtype=torch.bool, device=device)
    if max_boxes:
        order = torch.argsort(image_index, stable=True)
        sorted_index = image_index[order]
        first_of_image = torch.cumsum(counts, 0) - counts
        slot = torch.arange(len(order), device=device) - first_of_image[sorted_index]
        labels[sorted_index, slot] = targets[order, 1].long()
        boxes[sorted_index, slot] = targets[order, 2:6]
        mask[sorted_index, slot] = True
    return labels, boxes, mask


def target_rows_per_image(targets: torch.Tensor, batch_size: int, max_boxes: int) -> torch.Tensor:
    """B×G int64: the row of ``targets`` (M×6) that ``pad_targets_per_image`` put in each slot, -1 for padding.

    A family that learns per-target data beside the boxes (the segment task's ``masks`` row i belongs
    to targets row i) reads it through this map after the assignment chose slots.
    """
    rows = torch.full((batch_size, max_boxes), -1, dtype=torch.int64, device=targets.device)
    if max_boxes and len(targets):
        image_index = targets[:, 0].long()
        counts = torch.bincount(image_index, minlength=batch_size)
        order = torch.argsort(image_index, stable=True)
        sorted_index = image_index[order]
        first_of_image = torch.cumsum(counts, 0) - counts
        slot = torch.arange(len(order), device=targets.device) - first_of_image[sorted_index]
        rows[sorted_index, slot] = order
    return rows


def distribution_focal_loss(bin_logits: torch.Tensor, target_distances: torch.Tensor) -> torch.Tensor:
    """DFL (Li et al., 2020): cross-entropy towards the two bins bracketing each target distance,
    weighted by proximity. ``bin_logits`` P×4×R, ``target_distances`` P×4 in ``[0, R-1)``;
    returns the mean over the four sides, shape P."""
    reg_max = bin_logits.shape[-1]
    left = target_distances.long().clamp(max=reg_max - 2)
    right = left + 1
    left_weight = right.to(target_distances.dtype) - target_distances
    right_weight = 1 - left_weight
    log_probabilities = bin_logits.log_softmax(dim=-1)
    loss = -(
        log_probabilities.gather(-1, left[..., None]).squeeze(-1) * left_weight
        + log_probabilities.gather(-1, right[..., None]).squeeze(-1) * right_weight
    )
    return loss.mean(dim=-1)


class TaskAlignedDetectionLoss:
    """The normalised loss terms of one dense head's outputs (stateless, picklable).

    Consumes the dict of ``zoo_core.nn.detection_head.DecoupledDetectionHead`` and the task's
    M×6 pixel targets; returns ``DetectionLossTerms`` before gains. The assigner sees detached
    predictions; the box term is ``1 - CIoU`` and DFL targets are clipped just below the last bin,
    each weighted by the anchor's soft target.
    """

    def __init__(self, num_classes: int, reg_max: int = 16, assigner: TaskAlignedAssigner | None = None) -> None:
        self.num_classes = num_classes
        self.reg_max = reg_max
        self.assigner = assigner or TaskAlignedAssigner(num_classes, top_k=10, alpha=0.5, beta=6.0)

    def __call__(self, outputs: Mapping[str, torch.Tensor], targets: torch.Tensor, batch_size: int) -> DetectionLossTerms:
        """Loss terms of ``outputs`` (head dict) against ``targets`` (M×6, input pixels)."""
        return self.terms_and_assignment(outputs, targets, batch_size)[0]

    def terms_and_assignment(
        self, outputs: Mapping[str, torch.Tensor], targets: torch.Tensor, batch_size: int
    ) -> tuple[DetectionLossTerms, TaskAlignedAssignment]:
        """The loss terms and the assignment behind them (a segmenter's mask loss reads which
        ground truth each positive anchor learns: ``gt_index`` is its slot among its image's
        targets, in the order of ``targets``)."""
        box_logits = outputs["box_logits"].float()
        class_logits = outputs["class_logits"].float()
        anchor_points, anchor_strides = outputs["anchor_points"], outputs["anchor_strides"]
        if class_logits.shape[-1] != self.num_classes:
            raise ValueError(f"the head predicts {class_logits.shape[-1]} classes but the loss was built for {self.num_classes}")
        gt_labels, gt_boxes, gt_mask = pad_targets_per_image(
            targets.to(box_logits.device, torch.float32), batch_size, num_classes=self.num_classes
        )

        pred_distances = distribution_to_distances(box_logits, self.reg_max) * anchor_strides
        pred_boxes = distances_to_boxes(pred_distances, anchor_points)
        assignment = self.assigner(
            class_logits.detach().sigmoid(), pred_boxes.detach(), anchor_points, gt_labels, gt_boxes, gt_mask
        )
        score_sum = assignment.scores.sum().clamp(min=1.0)

        cls_loss = F.binary_cross_entropy_with_logits(class_logits, assignment.scores, reduction="none").sum() / score_sum
        # Box and DFL terms over every anchor, weighted by its soft-target sum: zero for background
        # anchors, whose terms are finite (boxes and distances are clamped, IoUs eps-guarded), so they
        # add exact zeros. No data-dependent indexing, hence no device synchronisation; the box branch
        # also stays in the graph on batches without positives (DDP expects a gradient for every
        # parameter on every rank).
        weight = assignment.scores.sum(dim=-1)  # B×A
        ciou = aligned_box_iou(pred_boxes, assignment.boxes, kind="ciou")
        box_loss = ((1.0 - ciou) * weight).sum() / score_sum
        target_distances = boxes_to_distances(assignment.boxes, anchor_points) / anchor_strides
        target_distances = target_distances.clamp(min=0.0, max=self.reg_max - 1 - 0.01)
        bin_logits = box_logits.unflatten(-1, (4, self.reg_max))
        dfl_loss = (distribution_focal_loss(bin_logits, target_distances) * weight).sum() / score_sum
        return DetectionLossTerms(box=box_loss, cls=cls_loss, dfl=dfl_loss), assignment
