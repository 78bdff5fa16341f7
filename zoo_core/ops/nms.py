"""Non-maximum suppression postprocess for dense detectors (one box and C class scores per anchor)."""

from __future__ import annotations

from typing import Sequence

import torch
from torchvision.ops import batched_nms

from zoo_core.ops.boxes import ImagePlacement, boxes_to_original, drop_empty_boxes

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
    levels: torch.Tensor | None = None,
    per_level_candidates: int | None = None,
    placements: Sequence[ImagePlacement] | None = None,
    return_anchor_indices: bool = False,
) -> list[dict[str, torch.Tensor]]:
    """Per-class NMS over every image of a batch of dense predictions, in the reference order.

    For each image: the candidates above ``conf`` (one per anchor, or one per anchor and class),
    at most ``per_level_candidates`` of each feature level and ``max_candidates`` in all, the
    highest scores kept; with ``placements`` their boxes mapped back to the original image,
    clipped to it and the empty ones dropped; then ``torchvision.ops.batched_nms`` (classes never
    suppress each other) and the ``max_det`` best. Mapping before NMS is what the reference
    implementations do (LibreYOLO, Ultralytics' ``scale_boxes`` after clipping): a box that leaves
    the image is suppressed as the part of it inside the image.

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
        levels: ``A`` feature-level index of every anchor, for ``per_level_candidates``.
        per_level_candidates: cap on the candidates of one level (PicoDet's and RTMDet's
            published postprocess caps per level, before the levels are joined).
        placements: one per image; the returned boxes are then in original-image pixels.
        return_anchor_indices: also return each detection's anchor, so that a segmenter can
            read the mask parameters that anchor predicted.

    Returns:
        One dict per image: ``boxes`` (n×4), ``scores`` (n), ``labels`` (n, int64), sorted by
        decreasing score; with ``return_anchor_indices``, ``anchor_indices`` (n, int64) too.
    """
    _check_thresholds(conf, iou, max_det)
    if boxes.dim() != 3 or boxes.shape[-1] != 4 or scores.dim() != 3 or scores.shape[:2] != boxes.shape[:2]:
        raise ValueError(
            f"expected boxes N×A×4 and scores N×A×C over the same anchors, got {tuple(boxes.shape)} and {tuple(scores.shape)}"
        )
    if per_level_candidates is not None and levels is None:
        raise ValueError("per_level_candidates needs the feature level of every anchor (levels)")
    if placements is not None and len(placements) != len(boxes):
        raise ValueError(f"{len(placements)} placements for {len(boxes)} images; give one per image")
    results: list[dict[str, torch.Tensor]] = []
    for image, (image_boxes, image_scores) in enumerate(zip(boxes, scores)):
        if multi_label:
            anchor_index, labels = (image_scores > conf).nonzero(as_tuple=True)
            candidate_scores = image_scores[anchor_index, labels]
        else:
            candidate_scores, labels = image_scores.max(dim=1)
            anchor_index = (candidate_scores > conf).nonzero(as_tuple=True)[0]
            candidate_scores, labels = candidate_scores[anchor_index], labels[anchor_index]
        if per_level_candidates is not None:
            assert levels is not None
            kept = _best_per_level(candidate_scores, levels[anchor_index], per_level_candidates)
            anchor_index, labels, candidate_scores = anchor_index[kept], labels[kept], candidate_scores[kept]
        if candidate_scores.numel() > max_candidates:
            candidate_scores, order = candidate_scores.topk(max_candidates)
            anchor_index, labels = anchor_index[order], labels[order]
        candidate_boxes = image_boxes[anchor_index].float()
        if placements is not None:
            candidate_boxes = boxes_to_original(candidate_boxes, *placements[image])
            inside = drop_empty_boxes(candidate_boxes)
            candidate_boxes, candidate_scores, labels = candidate_boxes[inside], candidate_scores[inside], labels[inside]
            anchor_index = anchor_index[inside]
        keep = batched_nms(candidate_boxes, candidate_scores.float(), labels, iou)[:max_det]
        detections = {"boxes": candidate_boxes[keep], "scores": candidate_scores[keep].float(), "labels": labels[keep].to(torch.int64)}
        if return_anchor_indices:
            detections["anchor_indices"] = anchor_index[keep].to(torch.int64)
        results.append(detections)
    return results


def _best_per_level(scores: torch.Tensor, levels: torch.Tensor, limit: int) -> torch.Tensor:
    """Indices of the ``limit`` highest ``scores`` of each level (all of a level that has fewer), level by level."""
    kept = []
    for level in levels.unique(sorted=True):
        members = (levels == level).nonzero(as_tuple=True)[0]
        if len(members) > limit:
            members = members[scores[members].topk(limit).indices]
        kept.append(members)
    return torch.cat(kept) if kept else levels.new_zeros(0, dtype=torch.long)
