"""Non-maximum suppression postprocess for dense detectors (one box and C class scores per anchor)."""

from __future__ import annotations

import torch
from torchvision.ops import batched_nms

__all__ = ["dense_detections_nms"]


def _check_thresholds(conf: float, iou: float, max_det: int) -> None:
    if not 0.0 <= conf <= 1.0:
        raise ValueError(f"conf={conf} must be a score threshold between 0 and 1")
    if not 0.0 <= iou <= 1.0:
        raise ValueError(f"iou={iou} must be an IoU threshold between 0 and 1")
    if max_det < 1:
        raise ValueError(f"max_det={max_det} must be at least 1 detection per image")


def dense_detections_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    conf: float,
    iou: float,
    max_det: int,
    *,
    multi_label: bool = False,
    max_candidates: int = 30000,
) -> list[dict[str, torch.Tensor]]:
    """Per-class NMS over every image of a batch of dense predictions.

    Args:
        boxes: N×A×4 xyxy boxes, one per anchor, in input pixels.
        scores: N×A×C class probabilities (after the sigmoid).
        conf: keep candidates whose score is strictly above this.
        iou: boxes of one class overlapping a higher-scoring one by more than this are dropped.
        max_det: at most this many detections per image, the highest scores first.
        multi_label: one candidate per (anchor, class) above ``conf`` (what COCO-style mAP
            evaluation of YOLO models uses) instead of one per anchor with its best class.
        max_candidates: cap on candidates entering NMS, the highest scores kept, so a nearly
            untrained model with every score above ``conf`` stays fast.

    Returns:
        One dict per image: ``boxes`` (n×4), ``scores`` (n), ``labels`` (n, int64), sorted by
        decreasing score, computed with ``torchvision.ops.batched_nms`` (classes never suppress
        each other).
    """
    _check_thresholds(conf, iou, max_det)
    if boxes.dim() != 3 or boxes.shape[-1] != 4 or scores.dim() != 3 or scores.shape[:2] != boxes.shape[:2]:
        raise ValueError(
            f"expected boxes N×A×4 and scores N×A×C over the same anchors, got {tuple(boxes.shape)} and {tuple(scores.shape)}"
        )
    results: list[dict[str, torch.Tensor]] = []
    for image_boxes, image_scores in zip(boxes, scores):
        if multi_label:
            anchor_index, labels = (image_scores > conf).nonzero(as_tuple=True)
            candidate_scores = image_scores[anchor_index, labels]
        else:
            candidate_scores, labels = image_scores.max(dim=1)
            anchor_index = (candidate_scores > conf).nonzero(as_tuple=True)[0]
            candidate_scores, labels = candidate_scores[anchor_index], labels[anchor_index]
        if candidate_scores.numel() > max_candidates:
            candidate_scores, order = candidate_scores.topk(max_candidates)
            anchor_index, labels = anchor_index[order], labels[order]
        candidate_boxes = image_boxes[anchor_index].float()
        keep = batched_nms(candidate_boxes, candidate_scores.float(), labels, iou)[:max_det]
        results.append(
            {"boxes": candidate_boxes[keep], "scores": candidate_scores[keep].float(), "labels": labels[keep].to(torch.int64)}
        )
    return results
