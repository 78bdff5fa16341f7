"""The adaptive training sample selection assigner (ATSS; Zhang et al., CVPR 2020, arXiv:1912.02424).

ATSS picks positives from fixed anchor boxes, without looking at predictions:

1. at every pyramid level, each ground truth takes the ``top_k`` anchors whose centres are
   closest (L2) to its own centre: ``top_k × levels`` candidates per box;
2. the IoU threshold of a box is the mean plus the (unbiased) standard deviation of its
   candidates' anchor-box IoUs, so a box adapts its threshold to how well anchors fit it;
3. candidates above that threshold whose centre lies strictly inside the box are positives;
4. an anchor claimed by several boxes keeps the box its anchor box overlaps most.

PP-YOLOE (and PP-PicoDet v2, RTMDet's predecessors) use it as a *static* assigner for the first
epochs, before switching to the task-aligned assigner, with anchor boxes of ``5 × stride`` side
centred on each grid cell. There the soft class target of a positive is the IoU of the anchor's
*predicted* box with its ground truth (pass ``pred_boxes``); without predictions the target is
the one-hot label. PP-YOLOE's ``force_gt_matching`` (off in every published config) is not
implemented.

The result is a ``TaskAlignedAssignment`` (the record the task-aligned assigner returns), so a
loss consumes either assigner's output the same way.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torchvision.ops import box_iou

from zoo_core.assigners.task_aligned import TaskAlignedAssignment
from zoo_core.ops.boxes import aligned_box_iou

__all__ = ["ATSSAssigner", "grid_anchor_boxes"]


def grid_anchor_boxes(anchor_points: torch.Tensor, anchor_strides: torch.Tensor, scale: float = 5.0) -> torch.Tensor:
    """Square anchor boxes of side ``scale × stride`` centred on each anchor point (A×2, A×1 → A×4 xyxy).

    ``scale=5`` is PP-YOLOE's / YOLO-NAS's ``grid_cell_scale``.
    """
    half = anchor_strides.reshape(-1, 1) * (scale / 2.0)
    return torch.cat((anchor_points - half, anchor_points + half), dim=-1)


class ATSSAssigner:
    """Assign padded ground truths to fixed anchor boxes by ATSS (stateless, picklable)."""

    def __init__(self, num_classes: int, top_k: int = 9, eps: float = 1e-9) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1 candidate per level, got {top_k}")
        self.num_classes = num_classes
        self.top_k = top_k
        self.eps = eps

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_classes={self.num_classes}, top_k={self.top_k})"

    @torch.no_grad()
    def __call__(
        self,
        anchor_boxes: torch.Tensor,
        level_sizes: Sequence[int],
        gt_labels: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_mask: torch.Tensor,
        pred_boxes: torch.Tensor | None = None,
    ) -> TaskAlignedAssignment:
        """Assign a padded batch of ground truths.

        Args:
            anchor_boxes: A×4 xyxy anchor boxes, level after level (``level_sizes`` anchors each).
            level_sizes: number of anchors of every pyramid level, summing to A.
            gt_labels: B×G class indices, padded; gt_boxes: B×G×4 xyxy; gt_mask: B×G bool.
            pred_boxes: optional B×A×4 predicted boxes (same units); when given, a positive's
                class target is the IoU of its prediction with its ground truth, else 1.
        """
        num_anchors = anchor_boxes.shape[0]
        if sum(level_sizes) != num_anchors:
            raise ValueError(f"level sizes {list(level_sizes)} do not add up to the {num_anchors} anchor boxes")
        batch_size, num_gt = gt_boxes.shape[:2]
        device = anchor_boxes.device
        dtype = pred_boxes.dtype if pred_boxes is not None else anchor_boxes.dtype
        if num_gt == 0:
            return TaskAlignedAssignment(
                labels=torch.zeros(batch_size, num_anchors, dtype=torch.int64, device=device),
                boxes=torch.zeros(batch_size, num_anchors, 4, dtype=gt_boxes.dtype, device=device),
                scores=torch.zeros(batch_size, num_anchors, self.num_classes, dtype=dtype, device=device),
                foreground=torch.zeros(batch_size, num_anchors, dtype=torch.bool, device=device),
                gt_index=torch.zeros(batch_size, num_anchors, dtype=torch.int64, device=device),
            )
        gt_labels = gt_labels.reshape(batch_size, num_gt).long()
        gt_mask = gt_mask.reshape(batch_size, num_gt).bool()

        anchor_iou = box_iou(gt_boxes.reshape(-1, 4), anchor_boxes).reshape(batch_size, num_gt, num_anchors)
        gt_centres = (gt_boxes[..., :2] + gt_boxes[..., 2:]) / 2
        anchor_centres = (anchor_boxes[:, :2] + anchor_boxes[:, 2:]) / 2
        distance = (gt_centres[:, :, None, :] - anchor_centres[None, None]).norm(dim=-1)

        # Step 1: the top_k closest anchors of every level (their global indices).
        candidate_index = []
        start = 0
        for size in level_sizes:
            k = min(self.top_k, size)
            nearest = distance[..., start : start + size].topk(k, dim=-1, largest=False).indices
            candidate_index.append(nearest + start)
            start += size
        candidate_index = torch.cat(candidate_index, dim=-1)  # B×G×(k·levels)
        is_candidate = torch.zeros_like(anchor_iou, dtype=torch.bool).scatter_(-1, candidate_index, True)

        # Step 2: per-box threshold = mean + unbiased std of the candidates' IoUs.
        candidate_iou = anchor_iou.gather(-1, candidate_index)
        threshold = candidate_iou.mean(dim=-1, keepdim=True) + candidate_iou.std(dim=-1, keepdim=True)

        # Step 3: above the threshold and centred strictly inside the box.
        left_top = anchor_centres[None, None] - gt_boxes[:, :, None, :2]
        right_bottom = gt_boxes[:, :, None, 2:] - anchor_centres[None, None]
        inside = torch.cat((left_top, right_bottom), dim=-1).amin(dim=-1) > self.eps
        positive = is_candidate & (anchor_iou > threshold) & inside & gt_mask[:, :, None]

        # Step 4: an anchor claimed twice keeps the box whose anchor IoU is largest (over all boxes).
        contested = (positive.sum(dim=1) > 1)[:, None, :]
        best_by_iou = F.one_hot(anchor_iou.argmax(dim=1), num_gt).transpose(1, 2).bool()
        positive = torch.where(contested, best_by_iou, positive)

        foreground = positive.any(dim=1)
        gt_index = positive.to(torch.uint8).argmax(dim=1)
        labels = gt_labels.gather(1, gt_index)
        boxes = gt_boxes.gather(1, gt_index[..., None].expand(-1, -1, 4))
        scores = F.one_hot(labels.clamp(0, self.num_classes - 1), self.num_classes).to(dtype)
        scores = scores * foreground[..., None]
        if pred_boxes is not None:
            quality = aligned_box_iou(gt_boxes[:, :, None, :], pred_boxes[:, None, :, :], kind="iou")
            scores = scores * (quality * positive).amax(dim=1)[..., None]
        return TaskAlignedAssignment(labels=labels, boxes=boxes, scores=scores, foreground=foreground, gt_index=gt_index)
