"""Association between tracks and detections: IoU cost matrices and a thresholded optimal assignment.

The cost matrix of ``m`` tracks against ``n`` detections is built in one broadcast (no loop over
pairs). The assignment is SciPy's ``linear_sum_assignment`` (the Jonker-Volgenant algorithm that
``lap.lapjv`` also implements; SciPy is already a dependency of zoo's dependencies, ``lap`` is not
installed here) on the cost matrix extended so that any track or detection may stay unmatched at half the
cost limit, which is what ``lapjv(extend_cost=True, cost_limit=...)`` solves for ByteTrack.
"""

from __future__ import annotations

import numpy as np

__all__ = ["box_iou", "iou_cost", "fuse_scores", "assign"]


def box_iou(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The ``m×n`` IoU of ``m`` and ``n`` xyxy boxes."""
    first = np.asarray(first, dtype=np.float64).reshape(-1, 4)
    second = np.asarray(second, dtype=np.float64).reshape(-1, 4)
    top_left = np.maximum(first[:, None, :2], second[None, :, :2])
    bottom_right = np.minimum(first[:, None, 2:], second[None, :, 2:])
    overlap = np.clip(bottom_right - top_left, 0, None).prod(axis=2)
    area_first = np.clip(first[:, 2:] - first[:, :2], 0, None).prod(axis=1)
    area_second = np.clip(second[:, 2:] - second[:, :2], 0, None).prod(axis=1)
    union = area_first[:, None] + area_second[None, :] - overlap
    return np.where(union > 0, overlap / np.maximum(union, 1e-12), 0.0)


def iou_cost(tracks: np.ndarray, detections: np.ndarray) -> np.ndarray:
    """``1 - IoU`` of track boxes against detection boxes (``m×n``)."""
    return 1.0 - box_iou(tracks, detections)


def fuse_scores(cost: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """ByteTrack's score fusion: the IoU similarity times each detection's score, back as a cost."""
    if cost.size == 0:
        return cost
    return 1.0 - (1.0 - cost) * np.asarray(scores, dtype=np.float64)[None, :]


def assign(cost: np.ndarray, limit: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cheapest one-to-one matching whose every pair costs at most ``limit``.

    Returns ``(matches, unmatched rows, unmatched columns)``: ``matches`` is ``k×2`` (row, column).
    """
    from scipy.optimize import linear_sum_assignment

    rows, columns = cost.shape
    if rows == 0 or columns == 0:
        return np.zeros((0, 2), dtype=np.int64), np.arange(rows), np.arange(columns)
    # Every row and column may stay unmatched at half the limit each (the extended square matrix of
    # lapjv's cost_limit): a pair is taken only where it costs less than leaving both of its ends alone,
    # so a pair over the limit never displaces an allowed one, which merely pricing it out would not ensure.
    side = rows + columns
    extended = np.full((side, side), limit / 2.0)
    extended[rows:, columns:] = 0.0
    extended[:rows, :columns] = np.minimum(cost, limit + 1.0)  # over the limit: never better than no match
    matched_rows, matched_columns = linear_sum_assignment(extended)
    real = (matched_rows < rows) & (matched_columns < columns)
    matched_rows, matched_columns = matched_rows[real], matched_columns[real]
    allowed = cost[matched_rows, matched_columns] <= limit
    matches = np.stack([matched_rows[allowed], matched_columns[allowed]], axis=1).astype(np.int64)
    unmatched_rows = np.setdiff1d(np.arange(rows), matches[:, 0])
    unmatched_columns = np.setdiff1d(np.arange(columns), matches[:, 1])
    return matches, unmatched_rows, unmatched_columns
