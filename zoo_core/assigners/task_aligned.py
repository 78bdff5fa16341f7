"""The task-aligned assigner of TOOD (Feng et al., ICCV 2021), as YOLOv8/YOLOv9 use it.

For every ground-truth box, the anchors whose centre lies inside it are ranked by the alignment
metric ``t = s**alpha * u**beta`` (``s``: the anchor's predicted probability of the box's class,
``u``: the CIoU of the anchor's predicted box with the ground truth, clipped at 0); the ``top_k``
best become positives. An anchor claimed by several boxes keeps the one its prediction overlaps
most. Positives learn a soft class target, ``t`` rescaled per box so that its best anchor's
target equals that box's best IoU (the "normalised alignment"). YOLOv9 uses ``top_k=10,
alpha=0.5, beta=6.0``.

PP-YOLOE and YOLO-NAS (``top_k=13, alpha=1, beta=6``) differ in two details, both keywords here:
they measure ``u`` with the plain IoU (``iou_kind="iou"``), and an anchor claimed twice goes to
the box its prediction overlaps most among *all* boxes of the image, claimant or not
(``contested="all"``, PaddleDetection's ``compute_max_iou_anchor``).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

from zoo_core.ops.boxes import aligned_box_iou

__all__ = ["TaskAlignedAssignment", "TaskAlignedAssigner"]


class TaskAlignedAssignment(NamedTuple):
    """What each anchor of a batch learns (B images, A anchors, C classes).

    ``labels`` (B×A, int64) and ``boxes`` (B×A×4, xyxy, in the units of the ground truth) are
    those of the assigned ground truth (of ground truth 0 for background anchors: read them through
    ``foreground``); ``scores`` (B×A×C) is the soft classification target, zero for background;
    ``foreground`` (B×A, bool) marks positives; ``gt_index`` (B×A, int64) is the assigned slot
    in the padded ground-truth tensors.
    """

    labels: torch.Tensor
    boxes: torch.Tensor
    scores: torch.Tensor
    foreground: torch.Tensor
    gt_index: torch.Tensor


class TaskAlignedAssigner:
    """Assign ground-truth boxes to anchors by the task-alignment metric (stateless, picklable)."""

    def __init__(
        self,
        num_classes: int,
        top_k: int = 10,
        alpha: float = 0.5,
        beta: float = 6.0,
        eps: float = 1e-9,
        *,
        iou_kind: Literal["ciou", "iou"] = "ciou",
        contested: Literal["claimants", "all"] = "claimants",
    ) -> None:
        """``iou_kind``: the overlap in the metric and the soft target (``"ciou"``: YOLOv8/v9;
        ``"iou"``: PP-YOLOE/YOLO-NAS). ``contested``: an anchor claimed by several boxes keeps the
        claimant its prediction overlaps most (``"claimants"``), or the best-overlapping box of
        the image (``"all"``: PP-YOLOE/YOLO-NAS)."""
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1 anchor per box, got {top_k}")
        if iou_kind not in ("ciou", "iou"):
            raise ValueError(f"iou_kind must be 'ciou' or 'iou', got {iou_kind!r}")
        if contested not in ("claimants", "all"):
            raise ValueError(f"contested must be 'claimants' or 'all', got {contested!r}")
        self.num_classes = num_classes
        self.top_k = top_k
        self.alpha = alpha
        self.beta = beta
        self.eps = eps
        self.iou_kind = iou_kind
        self.contested = contested

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_classes={self.num_classes}, top_k={self.top_k}, alpha={self.alpha}, "
            f"beta={self.beta}, iou_kind={self.iou_kind!r}, contested={self.contested!r})"
        )

    @torch.no_grad()
    def __call__(
        self,
        pred_scores: torch.Tensor,
        pred_boxes: torch.Tensor,
        anchor_points: torch.Tensor,
        gt_labels: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_mask: torch.Tensor,
    ) -> TaskAlignedAssignment:
        """Assign a padded batch of ground truths to anchors.

        Args:
            pred_scores: B×A×C predicted class probabilities (after the sigmoid).
            pred_boxes: B×A×4 predicted xyxy boxes, in the same units as ``gt_boxes``.
            anchor_points: A×2 anchor centres (x, y), same units.
            gt_labels: B×G class indices (any integer or float dtype), padded.
            gt_boxes: B×G×4 xyxy ground-truth boxes, padded.
            gt_mask: B×G bool, True for real (non-padding) ground truths.
        """
        batch_size, num_anchors, num_classes = pred_scores.shape
        if num_classes != self.num_classes:
            raise ValueError(f"pred_scores has {num_classes} classes but the assigner was built for {self.num_classes}")
        device = pred_scores.device
        num_gt = gt_boxes.shape[1]
        if num_gt == 0:
            return TaskAlignedAssignment(
                labels=torch.zeros(batch_size, num_anchors, dtype=torch.int64, device=device),
                boxes=torch.zeros(batch_size, num_anchors, 4, dtype=gt_boxes.dtype, device=device),
                scores=torch.zeros_like(pred_scores),
                foreground=torch.zeros(batch_size, num_anchors, dtype=torch.bool, device=device),
                gt_index=torch.zeros(batch_size, num_anchors, dtype=torch.int64, device=device),
            )
        gt_labels = gt_labels.reshape(batch_size, num_gt).long()
        gt_mask = gt_mask.reshape(batch_size, num_gt).bool()

        # B×G×A: anchors whose centre lies strictly inside a real ground truth.
        left_top = anchor_points[None, None] - gt_boxes[:, :, None, :2]
        right_bottom = gt_boxes[:, :, None, 2:] - anchor_points[None, None]
        inside = torch.cat((left_top, right_bottom), dim=-1).amin(dim=-1).gt(self.eps) & gt_mask[:, :, None]

        if self.iou_kind == "ciou":
            raw_overlaps = aligned_box_iou(gt_boxes[:, :, None, :], pred_boxes[:, None, :, :], kind="ciou").clamp(min=0)
        else:  # PP-YOLOE's batch_iou_similarity (eps 1e-9)
            raw_overlaps = aligned_box_iou(gt_boxes[:, :, None, :], pred_boxes[:, None, :, :], kind="iou", eps=self.eps)
        overlaps = raw_overlaps * inside
        class_scores = pred_scores.transpose(1, 2).gather(1, gt_labels[:, :, None].expand(-1, -1, num_anchors))
        # The metric of every (box, anchor) pair; candidates are the anchors inside the box. (A
        # contested anchor given to the best box of the image may lie outside it: its target is
        # still measured by this metric, as PP-YOLOE does.)
        raw_alignment = class_scores.pow(self.alpha) * raw_overlaps.pow(self.beta)
        alignment = raw_alignment * inside

        top_k = min(self.top_k, num_anchors)
        top_index = alignment.topk(top_k, dim=-1).indices
        in_top_k = torch.zeros_like(inside).scatter_(-1, top_index, True)
        positive = in_top_k & inside

        # An anchor claimed by several ground truths keeps the one its prediction overlaps most
        # (among its claimants, or among all real boxes of the image).
        claims = positive.sum(dim=1)
        if self.contested == "claimants":
            best_gt = overlaps.masked_fill(~positive, -1.0).argmax(dim=1)
        else:
            best_gt = raw_overlaps.masked_fill(~gt_mask[:, :, None], -1.0).argmax(dim=1)
        contested = (claims > 1)[:, None, :]
        positive = torch.where(contested, F.one_hot(best_gt, num_gt).transpose(1, 2).bool(), positive)

        foreground = positive.any(dim=1)
        gt_index = positive.to(torch.uint8).argmax(dim=1)
        labels = gt_labels.gather(1, gt_index)
        boxes = gt_boxes.gather(1, gt_index[..., None].expand(-1, -1, 4))
        scores = F.one_hot(labels.clamp(min=0, max=num_classes - 1), num_classes).to(pred_scores.dtype)
        scores = scores * foreground[..., None]

        alignment = raw_alignment * positive
        best_alignment = alignment.amax(dim=-1, keepdim=True)
        best_overlap = (raw_overlaps * positive).amax(dim=-1, keepdim=True)
        normalised = (alignment * best_overlap / (best_alignment + self.eps)).amax(dim=1)
        return TaskAlignedAssignment(
            labels=labels, boxes=boxes, scores=scores * normalised[..., None], foreground=foreground, gt_index=gt_index
        )
