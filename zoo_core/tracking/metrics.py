"""Multi-object tracking metrics: HOTA (Luiten et al., 2021), CLEAR MOT's MOTA and the identity metrics' IDF1.

Why written here: the two packages people use cannot be dependencies. ``motmetrics`` 1.4.0 (the newest
release) calls ``np.asfarray``, which NumPy 2 removed, and needs pandas; ``trackeval`` was for years
installable only from its repository, and the release now on PyPI (1.3.0, a community fork) prints its
configuration on every construction and pulls its dataset readers in. The definitions below follow
TrackEval's (the reference implementation of HOTA's paper), and ``tests/test_tracking.py`` checks them
against ``trackeval`` 1.3.0 on random sequences.

Every metric takes per-frame ground truth and tracker output: for frame ``t``, ``gt_ids[t]`` (``n``
integers), ``gt_boxes[t]`` (``n×4`` xyxy), and the same for the tracker. Similarity is box IoU. Per frame
the work is one IoU matrix and one optimal assignment; HOTA's 19 thresholds are evaluated together on
arrays, and IDF1's global ID matching is one assignment over the ID-pair co-occurrence counts.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from zoo_core.tracking.matching import box_iou

__all__ = ["tracking_metrics", "hota", "clear_mot", "identity", "HOTA_ALPHAS"]

#: The localisation thresholds HOTA averages over: 0.05, 0.10, ..., 0.95.
HOTA_ALPHAS = np.arange(0.05, 0.99, 0.05)
_EPS = np.finfo(float).eps


def _dense_ids(gt_ids: Sequence[np.ndarray], tracker_ids: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray], int, int]:
    """IDs renumbered 0..k-1 (ground truth and tracker separately), so they index count arrays."""
    def renumber(frames: Sequence[np.ndarray]) -> tuple[list[np.ndarray], int]:
        arrays = [np.asarray(ids, dtype=np.int64).reshape(-1) for ids in frames]
        unique = np.unique(np.concatenate(arrays)) if arrays else np.zeros(0, dtype=np.int64)
        return [np.searchsorted(unique, ids) for ids in arrays], len(unique)

    gt, num_gt = renumber(gt_ids)
    tracker, num_tracker = renumber(tracker_ids)
    return gt, tracker, num_gt, num_tracker


def _similarities(gt_boxes: Sequence[np.ndarray], tracker_boxes: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [box_iou(np.asarray(gt).reshape(-1, 4), np.asarray(found).reshape(-1, 4)) for gt, found in zip(gt_boxes, tracker_boxes)]


def _check(gt_ids: Sequence[np.ndarray], gt_boxes: Sequence[np.ndarray], tracker_ids: Sequence[np.ndarray],
           tracker_boxes: Sequence[np.ndarray]) -> None:
    if not len(gt_ids) == len(gt_boxes) == len(tracker_ids) == len(tracker_boxes):
        raise ValueError(f"tracking metrics need one entry per frame in each sequence: got {len(gt_ids)} ground-truth ID "
                         f"frames, {len(gt_boxes)} box frames, {len(tracker_ids)} tracker ID frames, {len(tracker_boxes)} box frames")
    for t, (ids, boxes) in enumerate(zip([*gt_ids, *tracker_ids], [*gt_boxes, *tracker_boxes])):
        ids = np.asarray(ids).reshape(-1)
        if len(ids) != len(np.asarray(boxes).reshape(-1, 4)):
            raise ValueError(f"frame {t % max(1, len(gt_ids))}: {len(ids)} IDs for {len(np.asarray(boxes).reshape(-1, 4))} boxes")
        if len(np.unique(ids)) != len(ids):
            raise ValueError(f"frame {t % max(1, len(gt_ids))}: an ID appears twice in one frame ({ids.tolist()})")


def hota(gt_ids: Sequence[np.ndarray], gt_boxes: Sequence[np.ndarray], tracker_ids: Sequence[np.ndarray],
         tracker_boxes: Sequence[np.ndarray]) -> dict[str, float]:
    """HOTA, DetA, AssA and LocA, each averaged over ``HOTA_ALPHAS``."""
    from scipy.optimize import linear_sum_assignment

    gt, tracker, num_gt, num_tracker = _dense_ids(gt_ids, tracker_ids)
    similarities = _similarities(gt_boxes, tracker_boxes)
    alphas = HOTA_ALPHAS
    # Pass 1: how well each pair of IDs aligns over the whole sequence (soft co-occurrence, Jaccard-normalised).
    potential = np.zeros((num_gt, num_tracker))
    gt_count, tracker_count = np.zeros(num_gt), np.zeros(num_tracker)
    for gt_t, tracker_t, similarity in zip(gt, tracker, similarities):
        if len(gt_t) and len(tracker_t):
            denominator = similarity.sum(0)[None, :] + similarity.sum(1)[:, None] - similarity
            share = np.where(denominator > _EPS, similarity / np.maximum(denominator, _EPS), 0.0)
            potential[gt_t[:, None], tracker_t[None, :]] += share
        gt_count[gt_t] += 1
        tracker_count[tracker_t] += 1
    alignment = potential / np.maximum(gt_count[:, None] + tracker_count[None, :] - potential, _EPS)
    # Pass 2: per frame, the matching that favours well-aligned IDs; counted at every alpha at once.
    true_positives, false_negatives, false_positives = (np.zeros(len(alphas)) for _ in range(3))
    localisation = np.zeros(len(alphas))
    matches = np.zeros((len(alphas), num_gt, num_tracker))
    for gt_t, tracker_t, similarity in zip(gt, tracker, similarities):
        if not len(gt_t) or not len(tracker_t):
            false_negatives += len(gt_t)
            false_positives += len(tracker_t)
            continue
        score = alignment[gt_t[:, None], tracker_t[None, :]] * similarity
        rows, columns = linear_sum_assignment(-score)
        matched_similarity = similarity[rows, columns]
        accepted = matched_similarity[None, :] >= alphas[:, None] - _EPS  # alphas × matches
        counts = accepted.sum(1)
        true_positives += counts
        false_negatives += len(gt_t) - counts
        false_positives += len(tracker_t) - counts
        localisation += (accepted * matched_similarity[None, :]).sum(1)
        alpha_index, match_index = np.nonzero(accepted)
        np.add.at(matches, (alpha_index, gt_t[rows[match_index]], tracker_t[columns[match_index]]), 1)
    union = np.maximum(1, gt_count[None, :, None] + tracker_count[None, None, :] - matches)
    association = (matches * (matches / union)).sum((1, 2)) / np.maximum(1, true_positives)
    detection = true_positives / np.maximum(1, true_positives + false_negatives + false_positives)
    localisation = np.maximum(1e-10, localisation) / np.maximum(1e-10, true_positives)
    hota_alpha = np.sqrt(detection * association)
    return {"HOTA": float(hota_alpha.mean()), "DetA": float(detection.mean()), "AssA": float(association.mean()),
            "LocA": float(localisation.mean())}


def clear_mot(gt_ids: Sequence[np.ndarray], gt_boxes: Sequence[np.ndarray], tracker_ids: Sequence[np.ndarray],
              tracker_boxes: Sequence[np.ndarray], threshold: float = 0.5) -> dict[str, float]:
    """MOTA, MOTP and the counts behind them (true and false positives, misses, ID switches) at IoU ``threshold``.

    A ground-truth object keeps last frame's match when it still overlaps enough; an ID switch is an object
    matched to another tracker ID than the one it was last matched to.
    """
    from scipy.optimize import linear_sum_assignment

    gt, tracker, num_gt, _ = _dense_ids(gt_ids, tracker_ids)
    similarities = _similarities(gt_boxes, tracker_boxes)
    last_matched = np.full(num_gt, -1)  # the tracker ID each object was last matched to, ever
    previous_frame = np.full(num_gt, -1)  # ... in the previous frame only
    true_positives = false_negatives = false_positives = switches = 0
    similarity_sum = 0.0
    for gt_t, tracker_t, similarity in zip(gt, tracker, similarities):
        if not len(gt_t) or not len(tracker_t):
            false_negatives += len(gt_t)
            false_positives += len(tracker_t)
            continue  # as TrackEval: an empty frame does not break a continuing match
        continuing = tracker_t[None, :] == previous_frame[gt_t][:, None]
        score = np.where(similarity >= threshold - _EPS, 1000.0 * continuing + similarity, 0.0)
        rows, columns = linear_sum_assignment(-score)
        accepted = score[rows, columns] > _EPS
        rows, columns = rows[accepted], columns[accepted]
        matched_gt, matched_tracker = gt_t[rows], tracker_t[columns]
        before = last_matched[matched_gt]
        switches += int(((before >= 0) & (before != matched_tracker)).sum())
        last_matched[matched_gt] = matched_tracker
        previous_frame[:] = -1
        previous_frame[matched_gt] = matched_tracker
        true_positives += len(rows)
        false_negatives += len(gt_t) - len(rows)
        false_positives += len(tracker_t) - len(rows)
        similarity_sum += float(similarity[rows, columns].sum())
    objects = true_positives + false_negatives
    return {"MOTA": (true_positives - false_positives - switches) / max(1, objects),
            "MOTP": similarity_sum / max(1, true_positives), "IDSW": float(switches), "TP": float(true_positives),
            "FN": float(false_negatives), "FP": float(false_positives)}


def identity(gt_ids: Sequence[np.ndarray], gt_boxes: Sequence[np.ndarray], tracker_ids: Sequence[np.ndarray],
             tracker_boxes: Sequence[np.ndarray], threshold: float = 0.5) -> dict[str, float]:
    """IDF1, IDP and IDR: the one-to-one matching of whole ground-truth tracks to whole tracker tracks that
    maximises the frames in which matched pairs overlap by IoU ``threshold`` or more."""
    from scipy.optimize import linear_sum_assignment

    gt, tracker, num_gt, num_tracker = _dense_ids(gt_ids, tracker_ids)
    together = np.zeros((num_gt, num_tracker))
    gt_detections = tracker_detections = 0
    for gt_t, tracker_t, similarity in zip(gt, tracker, _similarities(gt_boxes, tracker_boxes)):
        gt_detections += len(gt_t)
        tracker_detections += len(tracker_t)
        if len(gt_t) and len(tracker_t):
            rows, columns = np.nonzero(similarity >= threshold - _EPS)
            np.add.at(together, (gt_t[rows], tracker_t[columns]), 1)
    # Minimising IDFN + IDFP over ID matchings is maximising the frames the matched pairs share (IDTP).
    rows, columns = linear_sum_assignment(-together) if together.size else (np.zeros(0, int), np.zeros(0, int))
    id_true = float(together[rows, columns].sum())
    return {"IDF1": 2 * id_true / max(1, gt_detections + tracker_detections), "IDP": id_true / max(1, tracker_detections),
            "IDR": id_true / max(1, gt_detections)}


def tracking_metrics(gt_ids: Sequence[np.ndarray], gt_boxes: Sequence[np.ndarray], tracker_ids: Sequence[np.ndarray],
                     tracker_boxes: Sequence[np.ndarray]) -> dict[str, float]:
    """HOTA (with DetA, AssA, LocA), MOTA (with MOTP, IDSW and counts) and IDF1 (with IDP, IDR) of one sequence."""
    _check(gt_ids, gt_boxes, tracker_ids, tracker_boxes)
    return {**hota(gt_ids, gt_boxes, tracker_ids, tracker_boxes), **clear_mot(gt_ids, gt_boxes, tracker_ids, tracker_boxes),
            **identity(gt_ids, gt_boxes, tracker_ids, tracker_boxes)}
