"""Detections from DETR outputs without NMS: the top-k (query, class) pairs by score.

A DETR predicts a set: each query is one candidate, its class scores independent sigmoids. The
published post-processing ranks all ``queries × classes`` scores of an image and keeps the best
``max_det`` (a query may appear with several classes); no suppression is needed.
"""

from __future__ import annotations

import torch

__all__ = ["topk_detections"]


@torch.no_grad()
def topk_detections(scores: torch.Tensor, boxes: torch.Tensor, conf: float = 0.25, max_det: int = 300, *,
                    return_queries: bool = False) -> list[dict[str, torch.Tensor]]:
    """Per image ``boxes`` (n×4, as given), ``scores`` (n) and ``labels`` (n, int64), best first; with
    ``return_queries`` also ``queries`` (n, int64: the query of each detection, for per-query masks).

    Args:
        scores: ``(B, Q, C)`` probabilities.
        boxes: ``(B, Q, 4)`` boxes of the queries (any format; copied per kept pair).
        conf: keep pairs scoring above this (after the top-k, as published).
        max_det: pairs kept per image before the threshold.
    """
    if max_det < 1:
        raise ValueError(f"max_det must be at least 1, got {max_det}")
    batch, queries, classes = scores.shape
    k = min(max_det, queries * classes)
    top_scores, top_index = scores.reshape(batch, -1).topk(k, dim=1)
    query = torch.div(top_index, classes, rounding_mode="floor")
    labels = top_index % classes
    top_boxes = boxes.gather(1, query[..., None].expand(-1, -1, 4))
    keep = top_scores > conf
    found = [
        {"boxes": top_boxes[i][keep[i]], "scores": top_scores[i][keep[i]], "labels": labels[i][keep[i]].long()}
        for i in range(batch)
    ]
    if return_queries:
        for i, detection in enumerate(found):
            detection["queries"] = query[i][keep[i]].long()
    return found
