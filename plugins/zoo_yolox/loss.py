"""The YOLOX training loss: SimOTA assignment, IoU loss, objectness and class BCE, optional L1.

Follows the published code (Megvii YOLOX >= 0.3 ``yolox/models/yolo_head.py``; LibreYOLO 1.6.0
``models/yolox/nn.py`` computes the same):

- assignment per image with ``zoo_core.assigners.simota``: the geometric prior is "cell centre
  within 1.5 strides of the box centre"; candidates are the cells inside the prior of any box;
  ``cost = BCE(sqrt(sigmoid(cls)·sigmoid(obj)), one-hot) + 3·(-log(IoU + 1e-8)) + 1e6·(outside
  the box's prior)``; dynamic k from the 10 best IoUs;
- ``iou``: ``1 - IoU²`` of each positive's decoded box with its ground truth, weight 5;
- ``obj``: BCE of every anchor's objectness logit against 1 (positive) / 0;
- ``cls``: BCE of the positives' class logits against the one-hot label times the IoU of the
  prediction with its ground truth (soft target);
- ``l1`` (only once switched on; the recipe does it for the last 15 epochs, when mosaic and
  mixup stop): L1 between the positives' raw outputs and the encoded ground truth
  ``(cx/s - i, cy/s - j, log(w/s), log(h/s))``.

Each term is a sum divided by the number of positives of the local batch (at least 1), as in the
official code (which does not all-reduce it; LibreYOLO averages it across ranks). That is a mean
per positive, so it does not grow with the batch size (zoo's per-sample normalisation).
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

from zoo_core.assigners.simota import bce_class_cost, centre_prior, iou_cost, simota_assign
from zoo_core.losses.detection import pad_targets_per_image
from zoo_core.ops.boxes import aligned_box_iou

__all__ = ["decode_yolox_boxes", "YOLOXLoss"]

BOX_WEIGHT = 5.0  # "reg_weight" of the official head
CENTRE_RADIUS = 1.5  # strides
IOU_COST_WEIGHT = 3.0
OUTSIDE_PRIOR_COST = 1e6
CANDIDATE_TOP_K = 10
L1_EPS = 1e-8


def decode_yolox_boxes(regression: torch.Tensor, grid_cells: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
    """xyxy boxes (input pixels) of raw ``(t_x, t_y, t_w, t_h)``: centre ``(t_xy + cell)·s``, size ``exp(t_wh)·s``."""
    centre = (regression[..., :2] + grid_cells) * strides
    half_size = regression[..., 2:].exp() * strides / 2
    return torch.cat((centre - half_size, centre + half_size), dim=-1)


class YOLOXLoss:
    """YOLOX's loss of one batch (stateless apart from the ``use_l1`` switch; picklable)."""

    def __init__(self, num_classes: int, *, use_l1: bool = False) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.use_l1 = use_l1

    def __call__(
        self, outputs: Mapping[str, torch.Tensor], targets: torch.Tensor, batch_size: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)``: the weighted sum and its detached terms ``iou`` (×5), ``obj``, ``cls``, ``l1``."""
        regression = outputs["box_regression"].float()
        objectness = outputs["objectness_logits"].float()
        class_logits = outputs["class_logits"].float()
        grid_cells, strides = outputs["grid_cells"].float(), outputs["anchor_strides"].float()
        if class_logits.shape[-1] != self.num_classes:
            raise ValueError(f"the head predicts {class_logits.shape[-1]} classes but the loss was built for {self.num_classes}")
        gt_labels, gt_boxes, gt_mask = pad_targets_per_image(
            targets.to(regression.device, torch.float32), batch_size, num_classes=self.num_classes
        )

        pred_boxes = decode_yolox_boxes(regression, grid_cells, strides)  # B×A×4, differentiable
        with torch.no_grad():
            centres = (grid_cells + 0.5) * strides
            prior = centre_prior(centres, strides, gt_boxes, CENTRE_RADIUS) & gt_mask[:, :, None]  # B×G×A
            candidates = prior.any(dim=1, keepdim=True)  # B×1×A
            ious = aligned_box_iou(gt_boxes[:, :, None, :], pred_boxes.detach()[:, None, :, :], kind="iou", eps=1e-16)
            probabilities = (class_logits.sigmoid() * objectness.sigmoid()[..., None]).sqrt()
            cost = (
                bce_class_cost(probabilities, gt_labels)
                + IOU_COST_WEIGHT * iou_cost(ious)
                + OUTSIDE_PRIOR_COST * (~prior).float()
            )
            assignment = simota_assign(cost, ious, candidates, gt_mask, candidate_top_k=CANDIDATE_TOP_K)

        foreground = assignment.foreground
        num_positives = assignment.num_foreground.clamp(min=1).to(regression.dtype)
        obj_targets = foreground.to(objectness.dtype)
        obj_loss = F.binary_cross_entropy_with_logits(objectness, obj_targets, reduction="sum") / num_positives

        if gt_boxes.shape[1] == 0:  # no ground truth in the batch: only the objectness term learns
            zero = (regression.sum() + class_logits.sum()) * 0.0 + 0.0
            iou_loss = cls_loss = l1_loss = zero
        else:
            gt_index = assignment.gt_index
            matched_boxes = gt_boxes.gather(1, gt_index[..., None].expand(-1, -1, 4))[foreground]
            matched_labels = gt_labels.gather(1, gt_index)[foreground]
            positive_ious = aligned_box_iou(pred_boxes[foreground], matched_boxes, kind="iou", eps=1e-16)
            iou_loss = (1.0 - positive_ious.pow(2)).sum() / num_positives
            classes = torch.arange(self.num_classes, device=matched_labels.device)
            class_targets = (matched_labels[:, None] == classes).to(class_logits.dtype)  # one-hot
            class_targets = class_targets * assignment.matched_iou[foreground][:, None]
            cls_bce = F.binary_cross_entropy_with_logits(class_logits[foreground], class_targets, reduction="sum")
            cls_loss = cls_bce / num_positives
            if self.use_l1:
                positive_strides = strides.expand(batch_size, -1, -1)[foreground]
                positive_cells = grid_cells.expand(batch_size, -1, -1)[foreground]
                centre = (matched_boxes[:, :2] + matched_boxes[:, 2:]) / 2
                size = matched_boxes[:, 2:] - matched_boxes[:, :2]
                encoded = torch.cat(
                    (centre / positive_strides - positive_cells, torch.log(size / positive_strides + L1_EPS)), dim=-1
                )
                l1_loss = (regression[foreground] - encoded).abs().sum() / num_positives
            else:
                l1_loss = regression.sum() * 0.0 + 0.0  # keeps the graph (DDP), reads +0
        iou_term = BOX_WEIGHT * iou_loss
        total = iou_term + obj_loss + cls_loss + l1_loss
        items = {"iou": iou_term.detach(), "obj": obj_loss.detach(), "cls": cls_loss.detach(), "l1": l1_loss.detach()}
        return total, items
