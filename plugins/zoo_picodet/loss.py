"""PP-PicoDet's loss (PaddleDetection legacy ``PicoHead`` / Bo396543018's port, as LibreYOLO 1.6.0 runs it).

Per anchor of the dense head (outputs of ``model.PicoHead``), all images at once:

- **assignment**: SimOTA (``zoo_core.assigners.simota``). Candidates of an image are the anchors
  whose centre lies inside some box or within 2.5 strides of its centre; the cost of a (box,
  anchor) pair is the summed BCE of the anchor's class probabilities (clamped to [1e-7, 1 - 1e-7])
  against the box's one-hot label, plus 6 × ``-log(IoU + 1e-8)`` of its predicted box, plus 1e5
  unless the centre is inside the box *and* within 2.5 strides of its centre; dynamic k from
  the 10 best IoUs.
- **classification**: varifocal loss (alpha 0.75, gamma 2), the positive's target being the IoU
  of its current prediction with its box (at least 1e-6), the negatives' weight keeping its
  gradient (as the published code computes it); summed and divided by the number of positives
  (averaged over DDP ranks, then at least 1).
- **box**: ``1 - GIoU`` (weight 2.0) and DFL over 8 bins (weight 0.25, targets in strides clipped
  to 6.9, averaged over the 4 sides), each positive weighted by its highest class probability
  (GFL's quality weight), divided by the sum of those weights (averaged over DDP ranks).

Both normalisers are averaged over the ranks before clamping (PaddleDetection's
``all_reduce`` / trainer count / clip), so two ranks at batch B/2 give one process's gradient.

No Python loop over images or boxes, and no host synchronisation besides padding the targets.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import torch

from zoo_core.assigners.simota import bce_class_cost, centre_prior, inside_boxes, iou_cost, simota_assign
from zoo_core.losses.detection import distribution_focal_loss, pad_targets_per_image
from zoo_core.losses.iou_aware_classification import varifocal_loss
from zoo_core.ops.boxes import aligned_box_iou, boxes_to_distances, distances_to_boxes
from zoo_core.ops.distributed import mean_over_ranks

__all__ = ["PicoDetLossTerms", "PicoDetLoss"]

_IOU_EPS = 1e-16  # the published IoU/GIoU code adds 1e-16 to unions and enclosing areas
_PROBABILITY_CLAMP = 1e-7


class PicoDetLossTerms(NamedTuple):
    """The weighted, normalised terms (scalars)."""

    cls: torch.Tensor
    giou: torch.Tensor
    dfl: torch.Tensor

    def total(self) -> torch.Tensor:
        """Sum of the three terms."""
        return self.cls + self.giou + self.dfl


class PicoDetLoss:
    """PicoDet loss of one dense head's outputs (stateless, picklable)."""

    def __init__(
        self,
        num_classes: int,
        bins: int = 8,
        *,
        class_weight: float = 1.0,
        giou_weight: float = 2.0,
        dfl_weight: float = 0.25,
        iou_cost_weight: float = 6.0,
        centre_radius: float = 2.5,
        candidate_top_k: int = 10,
        outside_penalty: float = 1e5,
    ) -> None:
        self.num_classes, self.bins = num_classes, bins
        self.class_weight, self.giou_weight, self.dfl_weight = class_weight, giou_weight, dfl_weight
        self.iou_cost_weight, self.centre_radius = iou_cost_weight, centre_radius
        self.candidate_top_k, self.outside_penalty = candidate_top_k, outside_penalty

    def __call__(self, outputs: Mapping[str, torch.Tensor], targets: torch.Tensor, batch_size: int) -> PicoDetLossTerms:
        """Terms of ``outputs`` against ``targets`` (M×6: image, class, x1, y1, x2, y2 in pixels)."""
        box_logits = outputs["box_logits"].float()
        class_logits = outputs["class_logits"].float()
        points, strides = outputs["anchor_points"].float(), outputs["anchor_strides"].float()
        if class_logits.shape[-1] != self.num_classes:
            raise ValueError(f"the head predicts {class_logits.shape[-1]} classes but the loss was built for {self.num_classes}")
        gt_labels, gt_boxes, gt_mask = pad_targets_per_image(targets.to(box_logits.device, torch.float32), batch_size)
        if gt_boxes.shape[1] == 0:  # no boxes in the batch: one padding slot keeps the gathers below valid
            gt_labels, gt_boxes = gt_labels.new_zeros(batch_size, 1), gt_boxes.new_zeros(batch_size, 1, 4)
            gt_mask = gt_mask.new_zeros(batch_size, 1)

        bin_probabilities = box_logits.unflatten(-1, (4, self.bins)).softmax(dim=-1)
        levels = torch.arange(self.bins, device=box_logits.device, dtype=bin_probabilities.dtype)
        pred_boxes = distances_to_boxes((bin_probabilities * levels).sum(dim=-1) * strides, points)
        probabilities = class_logits.detach().sigmoid()

        with torch.no_grad():
            inside = inside_boxes(points, gt_boxes)
            near_centre = centre_prior(points, strides, gt_boxes, self.centre_radius)
            real = gt_mask[:, :, None]
            candidates = ((inside | near_centre) & real).any(dim=1, keepdim=True)  # B×1×A
            ious = aligned_box_iou(gt_boxes[:, :, None, :], pred_boxes.detach()[:, None, :, :], kind="iou", eps=_IOU_EPS)
            cost = (
                bce_class_cost(probabilities.clamp(_PROBABILITY_CLAMP, 1 - _PROBABILITY_CLAMP), gt_labels)
                + self.iou_cost_weight * iou_cost(ious)
                + self.outside_penalty * (~(inside & near_centre)).float()
            )
            assignment = simota_assign(cost, ious, candidates, gt_mask, candidate_top_k=self.candidate_top_k)
            foreground = assignment.foreground
            labels = gt_labels.gather(1, assignment.gt_index)
            matched = gt_boxes.gather(1, assignment.gt_index[..., None].expand(-1, -1, 4))
            quality = aligned_box_iou(pred_boxes.detach(), matched, kind="iou", eps=_IOU_EPS).clamp(min=1e-6) * foreground
            class_targets = torch.zeros_like(class_logits).scatter_(-1, labels[..., None], quality[..., None])
            box_weight = probabilities.amax(dim=-1) * foreground

        cls_sum = varifocal_loss(class_logits, class_targets, detach_weight=False).sum()
        giou = aligned_box_iou(pred_boxes, matched, kind="giou", eps=_IOU_EPS)
        giou_sum = ((1.0 - giou) * box_weight).sum()
        target_distances = (boxes_to_distances(matched, points) / strides).clamp(max=self.bins - 1 - 0.1)
        dfl_sum = (distribution_focal_loss(box_logits.unflatten(-1, (4, self.bins)), target_distances) * box_weight).sum()

        positives = mean_over_ranks(assignment.num_foreground.float().sum()).clamp(min=1.0)
        weight_sum = mean_over_ranks(box_weight.sum()).clamp(min=1e-6)
        return PicoDetLossTerms(
            cls=self.class_weight * cls_sum / positives,
            giou=self.giou_weight * giou_sum / weight_sum,
            dfl=self.dfl_weight * dfl_sum / weight_sum,
        )
