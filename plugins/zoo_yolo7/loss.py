"""YOLOv7's training loss (the official ``ComputeLossOTA``): anchor-matched candidates, SimOTA selection.

1. **Candidates** (YOLOv5's ``build_targets``, "find_3_positive"): at every level, a ground truth
   may use an anchor box whose width and height ratios to it are both within ``anchor_threshold``
   (4.0) either way, in the cell holding its centre and in the two neighbouring cells nearest to
   its centre (left or right, up or down: a neighbour counts when the centre lies in that half of
   its cell, not in the outermost cell row/column).
2. **Selection** (SimOTA, ``zoo_core.assigners.simota``) among the image's candidates:
   ``cost = BCE(sqrt(sigmoid(cls)·sigmoid(obj)), one-hot) + 3·(-log(IoU + 1e-8))``, no geometric
   penalty; dynamic k from the 10 best IoUs; contested anchors go to the cheapest ground truth.
   (The official code keeps its candidate list with repetitions, one entry per (ground truth,
   anchor, cell); here candidates are a set, so an anchor is counted once.)
3. **Loss**, per level ``l`` (means over the positives, or over all anchors, of that level in the
   batch): ``box_l = mean(1 - CIoU)``, ``cls_l = mean BCE(class logits, one-hot)``, ``obj_l =
   mean BCE(objectness logits, CIoU of the positives clamped at 0, else 0)``; ``obj`` levels are
   balanced ``4.0, 1.0, 0.4``. Gains (``hyp.scratch.p5.yaml``: box 0.05, obj 0.7, cls 0.3;
   ``hyp.scratch.tiny.yaml``: 0.05, 1.0, 0.5) are rescaled as official ``train.py`` does: box
   ``× 3/L``, cls ``× C/80 · 3/L``, obj ``× (image_size/640)² · 3/L``.

Scale: the official code returns ``(box + obj + cls) × batch size``; like zoo's YOLOv9 this loss
returns the terms times the constant nominal batch ``YOLO_NOMINAL_BATCH_SIZE`` (64), so the
published learning rate holds at any batch size and world size (see zoo_core.losses.detection).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F

from zoo_core.assigners.simota import bce_class_cost, iou_cost, simota_assign
from zoo_core.losses.detection import YOLO_NOMINAL_BATCH_SIZE, pad_targets_per_image
from zoo_core.ops.boxes import aligned_box_iou

__all__ = ["LossGains", "decode_yolo7_boxes", "anchor_matching_candidates", "YOLOv7OTALoss"]

OBJECTNESS_BALANCE = (4.0, 1.0, 0.4)  # official ComputeLossOTA, three levels
IOU_COST_WEIGHT = 3.0
CANDIDATE_TOP_K = 10
NEIGHBOUR_OFFSET = 0.5  # "g" of find_3_positive


@dataclass(frozen=True)
class LossGains:
    """Published gains of the three terms (before the official 3/L, C/80 and image-size rescaling)."""

    box: float = 0.05
    obj: float = 0.7
    cls: float = 0.3


def decode_yolo7_boxes(
    raw: torch.Tensor, cells: torch.Tensor, anchor_sizes: torch.Tensor, strides: torch.Tensor
) -> torch.Tensor:
    """xyxy boxes (pixels) of raw ``t``: centre ``(2σ(t_xy) - 0.5 + cell)·stride``, size ``(2σ(t_wh))²·anchor``."""
    t = raw.sigmoid() * 2
    centre = (t[..., :2] - 0.5 + cells) * strides
    half_size = t[..., 2:].pow(2) * anchor_sizes / 2
    return torch.cat((centre - half_size, centre + half_size), dim=-1)


@torch.no_grad()
def anchor_matching_candidates(
    gt_boxes: torch.Tensor,
    gt_mask: torch.Tensor,
    anchors: torch.Tensor,
    level_shapes: list[tuple[int, int]],
    strides: tuple[int, ...],
    anchor_threshold: float = 4.0,
) -> torch.Tensor:
    """B×A boolean: anchors (level, anchor, row, column order) that some ground truth may use.

    ``gt_boxes`` B×G×4 xyxy pixels, ``gt_mask`` B×G, ``anchors`` L×K×2 (w, h pixels),
    ``level_shapes`` the (H, W) of each level. See the module docstring, step 1.
    """
    batch_size = gt_boxes.shape[0]
    device = gt_boxes.device
    shapes = list(level_shapes)
    num_anchors = anchors.shape[1]
    total = sum(num_anchors * h * w for h, w in shapes)
    hits = torch.zeros(batch_size, total, dtype=torch.int32, device=device)
    if gt_boxes.shape[1] == 0:
        return hits.bool()
    centres = (gt_boxes[..., :2] + gt_boxes[..., 2:]) / 2
    sizes = gt_boxes[..., 2:] - gt_boxes[..., :2]
    offset = 0
    anchor_index = torch.arange(num_anchors, device=device)
    for level, ((height, width), stride) in enumerate(zip(shapes, strides)):
        x, y = centres[..., 0] / stride, centres[..., 1] / stride  # B×G, in cells
        ratio = (sizes / stride)[:, :, None, :] / (anchors[level] / stride)[None, None]  # B×G×K×2
        shape_ok = torch.maximum(ratio, 1 / ratio).amax(dim=-1) < anchor_threshold
        shape_ok = shape_ok & gt_mask[:, :, None]
        x_far, y_far = width - x, height - y  # measured from the right / bottom edge
        choices = (  # (usable, shift of the centre before flooring to a cell)
            (torch.ones_like(shape_ok[..., 0]), 0.0, 0.0),
            ((x % 1 < NEIGHBOUR_OFFSET) & (x > 1), NEIGHBOUR_OFFSET, 0.0),  # left neighbour
            ((y % 1 < NEIGHBOUR_OFFSET) & (y > 1), 0.0, NEIGHBOUR_OFFSET),  # upper neighbour
            ((x_far % 1 < NEIGHBOUR_OFFSET) & (x_far > 1), -NEIGHBOUR_OFFSET, 0.0),  # right neighbour
            ((y_far % 1 < NEIGHBOUR_OFFSET) & (y_far > 1), 0.0, -NEIGHBOUR_OFFSET),  # lower neighbour
        )
        for usable, shift_x, shift_y in choices:
            column = (x - shift_x).long().clamp(0, width - 1)
            row = (y - shift_y).long().clamp(0, height - 1)
            flat = offset + anchor_index[None, None, :] * (height * width) + (row * width + column)[:, :, None]
            valid = shape_ok & usable[:, :, None]
            hits.scatter_add_(1, flat.reshape(batch_size, -1), valid.reshape(batch_size, -1).to(torch.int32))
        offset += num_anchors * height * width
    return hits > 0


class YOLOv7OTALoss:
    """YOLOv7's ComputeLossOTA on zoo's outputs dict (stateless apart from ``image_size``; picklable).

    ``image_size`` is the training input size the objectness gain is rescaled for (official
    ``hyp['obj'] *= (imgsz / 640) ** 2``), default 640; ``YOLOv7.loss`` passes the batch's size.
    """

    def __init__(
        self, num_classes: int, gains: LossGains | None = None, *, anchor_threshold: float = 4.0, image_size: int = 640
    ) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.gains = gains or LossGains()
        self.anchor_threshold = anchor_threshold
        self.image_size = image_size

    def scaled_gains(self, num_levels: int, image_size: int | None = None) -> LossGains:
        """The gains after the official train.py rescaling for ``num_levels`` levels, C classes and
        ``image_size`` (default: the loss's ``image_size``)."""
        per_level = 3.0 / num_levels
        size = self.image_size if image_size is None else image_size
        return LossGains(
            box=self.gains.box * per_level,
            obj=self.gains.obj * (size / 640) ** 2 * per_level,
            cls=self.gains.cls * self.num_classes / 80 * per_level,
        )

    def __call__(
        self, outputs: Mapping[str, torch.Tensor], targets: torch.Tensor, batch_size: int, *, image_size: int | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)``: ``(box + obj + cls) × 64`` and the gained terms ``box``, ``obj``, ``cls``.

        ``image_size`` (default: the loss's ``image_size``) is the training input size the
        objectness gain is rescaled for.
        """
        predictions = outputs["predictions"].float()
        cells, anchor_sizes = outputs["anchor_cells"].float(), outputs["anchor_sizes"].float()
        strides, levels = outputs["anchor_strides"].float(), outputs["anchor_levels"]
        level_shapes = [(int(h), int(w)) for h, w in outputs["level_shapes"].tolist()]  # a CPU tensor: no sync
        level_strides = tuple(int(s) for s in outputs["level_strides"].tolist())
        num_levels = len(level_shapes)
        device = predictions.device
        if predictions.shape[-1] != 5 + self.num_classes:
            raise ValueError(
                f"the head predicts {predictions.shape[-1] - 5} classes but the loss was built for {self.num_classes}"
            )
        gt_labels, gt_boxes, gt_mask = pad_targets_per_image(targets.to(device, torch.float32), batch_size, self.num_classes)
        objectness, class_logits = predictions[..., 4], predictions[..., 5:]
        pred_boxes = decode_yolo7_boxes(predictions[..., :4], cells, anchor_sizes, strides)  # B×A×4

        with torch.no_grad():
            candidates = anchor_matching_candidates(
                gt_boxes, gt_mask, outputs["anchors"].float(), level_shapes, level_strides, self.anchor_threshold
            )
            ious = aligned_box_iou(gt_boxes[:, :, None, :], pred_boxes.detach()[:, None, :, :], kind="iou", eps=1e-16)
            probabilities = (class_logits.sigmoid() * objectness.sigmoid()[..., None]).sqrt()
            cost = bce_class_cost(probabilities, gt_labels) + IOU_COST_WEIGHT * iou_cost(ious)
            assignment = simota_assign(cost, ious, candidates[:, None, :], gt_mask, candidate_top_k=CANDIDATE_TOP_K)

        foreground = assignment.foreground
        positive = foreground.to(predictions.dtype)
        anchor_levels = levels.expand(batch_size, -1)
        flat_levels = anchor_levels.reshape(-1)
        positives_per_level = torch.zeros(num_levels, device=device).index_add(0, flat_levels, positive.reshape(-1))
        per_positive = 1.0 / positives_per_level.clamp(min=1.0)  # a level without positives adds 0

        # Box term and objectness target over every anchor (masked): no data-dependent shapes.
        if gt_boxes.shape[1] > 0:
            matched_boxes = gt_boxes.gather(1, assignment.gt_index[..., None].expand(-1, -1, 4))
            matched_labels = gt_labels.gather(1, assignment.gt_index)
        else:
            matched_boxes = torch.zeros_like(pred_boxes)
            matched_labels = torch.zeros_like(foreground, dtype=torch.int64)
        ciou = aligned_box_iou(pred_boxes, matched_boxes, kind="ciou")  # B×A
        box_terms = ((1.0 - ciou) * positive).reshape(-1)
        box_per_level = torch.zeros(num_levels, device=device).index_add(0, flat_levels, box_terms)
        box_loss = (box_per_level * per_positive).sum()
        object_target = ciou.detach().clamp(min=0) * positive

        # Class term over the positives only (the B×A×C dense form would be large).
        positive_labels = matched_labels[foreground]
        class_targets = (positive_labels[:, None] == torch.arange(self.num_classes, device=device)).to(predictions.dtype)
        class_bce = F.binary_cross_entropy_with_logits(class_logits[foreground], class_targets, reduction="none").mean(dim=1)
        cls_per_level = torch.zeros(num_levels, device=device).index_add(0, anchor_levels[foreground], class_bce)
        cls_loss = (cls_per_level * per_positive).sum()

        object_bce = F.binary_cross_entropy_with_logits(objectness, object_target, reduction="none").sum(dim=0)  # A
        obj_sum = torch.zeros(num_levels, device=device).index_add(0, levels, object_bce)
        anchors_per_cell = outputs["anchors"].shape[1]
        obj_loss = sum(
            obj_sum[level] * (OBJECTNESS_BALANCE[level] / (anchors_per_cell * h * w * batch_size))
            for level, (h, w) in enumerate(level_shapes)
        )

        gains = self.scaled_gains(num_levels, image_size)
        box_term, obj_term, cls_term = box_loss * gains.box, obj_loss * gains.obj, cls_loss * gains.cls
        items = {"box": box_term.detach(), "obj": obj_term.detach(), "cls": cls_term.detach()}
        return (box_term + obj_term + cls_term) * YOLO_NOMINAL_BATCH_SIZE, items
