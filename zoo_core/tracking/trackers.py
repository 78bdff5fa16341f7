"""ByteTrack and BoT-SORT: per-frame association of detections with tracks, each track keeping its ID.

``tracker = build_tracker(tracker_config("bytetrack"))``, then for every frame
``tracker.update(boxes, scores, classes, frame)`` returns the tracks seen in that frame as a
``TrackedBoxes`` (Kalman-filtered boxes, IDs, scores, classes, and the index of the detection each came
from, so masks and keypoints can follow their box's ID).

The association is ByteTrack's (Zhang et al., 2022): the tracks (those being tracked and those lost
within ``track_buffer`` frames) are predicted one frame ahead, then matched to the high-score boxes by
score-fused IoU; the tracks left over are matched to the low-score boxes (which recovers occluded,
blurred objects without starting tracks on them); tracks started in the previous frame and not yet
confirmed get a last chance against the high-score boxes left over; the high-score boxes still left
start new tracks. BoT-SORT (Aharon et al., 2022) changes the motion model (a ``cx, cy, w, h`` state)
and moves every predicted track with the camera's motion between the frames before matching
(``zoo_core.tracking.motion``). All the filtering and matching runs on stacked arrays; only the
bookkeeping of the few track objects loops in Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zoo_core.tracking.config import TrackerConfig
from zoo_core.tracking.kalman import BoxKalmanFilter, state_to_xyxy, xyxy_to_measurement
from zoo_core.tracking.matching import assign, box_iou, fuse_scores, iou_cost
from zoo_core.tracking.motion import CameraMotion

__all__ = ["TrackedBoxes", "Track", "ByteTracker", "BoTSORT", "build_tracker"]

_NEW, _TRACKED, _LOST = "new", "tracked", "lost"


@dataclass
class TrackedBoxes:
    """The tracks seen in one frame: ``boxes`` (``n×4`` xyxy), ``ids`` (n, from 1), ``scores``, ``classes`` and
    ``detections`` (the index, in the frame's detections, of the box each track was matched to)."""

    boxes: np.ndarray
    ids: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    detections: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def empty(cls) -> "TrackedBoxes":
        """No tracks."""
        return cls(np.zeros((0, 4)), np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64),
                   np.zeros(0, dtype=np.int64))


@dataclass(eq=False)
class Track:
    """One tracked object: its Kalman state, ID, last score and class, and its lifecycle."""

    mean: np.ndarray
    covariance: np.ndarray
    score: float
    label: int
    detection: int
    track_id: int = 0
    state: str = _NEW
    activated: bool = False
    start_frame: int = 0
    frame: int = 0  # the last frame the track was matched in
    history: list[tuple[float, float]] = field(default_factory=list)


class ByteTracker:
    """ByteTrack over frames of boxes (see the module docstring); ``reset()`` starts a new sequence."""

    layout = "xyah"

    def __init__(self, config: TrackerConfig) -> None:
        self.config = config
        self.kalman = BoxKalmanFilter(self.layout)
        self.reset()

    def reset(self) -> None:
        """Forget every track; IDs start again from 1."""
        self.tracked: list[Track] = []
        self.lost: list[Track] = []
        self.frame_id = 0
        self._next_id = 0

    # ------------------------------------------------------------------ arrays of tracks
    def _boxes(self, tracks: list[Track]) -> np.ndarray:
        if not tracks:
            return np.zeros((0, 4))
        return state_to_xyxy(np.stack([track.mean for track in tracks]), self.layout)

    def _predict(self, tracks: list[Track]) -> None:
        """Move ``tracks`` one frame ahead, all in one filter step (a lost track's size velocity is held at zero)."""
        if not tracks:
            return
        means = np.stack([track.mean for track in tracks])
        covariances = np.stack([track.covariance for track in tracks])
        not_tracked = np.array([track.state != _TRACKED for track in tracks])
        means[not_tracked, 7] = 0.0  # as ByteTrack: a track not seen last frame does not keep growing or shrinking
        means, covariances = self.kalman.predict(means, covariances)
        for track, mean, covariance in zip(tracks, means, covariances):
            track.mean, track.covariance = mean, covariance

    def _compensate(self, tracks: list[Track], frame: np.ndarray | None) -> None:
        """ByteTrack assumes a still camera; BoT-SORT moves the tracks with it here."""

    def _update(self, pairs: list[tuple[Track, int]], boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray) -> None:
        """Correct each matched track with its detection, all in one filter step, and mark it tracked."""
        if not pairs:
            return
        tracks = [track for track, _ in pairs]
        chosen = np.array([index for _, index in pairs])
        means, covariances = self.kalman.update(np.stack([track.mean for track in tracks]),
                                                np.stack([track.covariance for track in tracks]),
                                                xyxy_to_measurement(boxes[chosen], self.layout))
        for track, mean, covariance, index in zip(tracks, means, covariances, chosen):
            track.mean, track.covariance = mean, covariance
            track.score, track.label, track.detection = float(scores[index]), int(labels[index]), int(index)
            track.state, track.activated, track.frame = _TRACKED, True, self.frame_id

    def _new_tracks(self, indices: np.ndarray, boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray) -> list[Track]:
        if len(indices) == 0:
            return []
        means, covariances = self.kalman.initiate(xyxy_to_measurement(boxes[indices], self.layout))
        tracks = []
        for mean, covariance, index in zip(means, covariances, indices):
            self._next_id += 1
            tracks.append(Track(mean, covariance, float(scores[index]), int(labels[index]), int(index), track_id=self._next_id,
                                state=_TRACKED, activated=self.frame_id == 1, start_frame=self.frame_id, frame=self.frame_id))
        return tracks

    # ------------------------------------------------------------------ one frame
    def update(self, boxes: Any, scores: Any, labels: Any, frame: np.ndarray | None = None) -> TrackedBoxes:
        """Associate one frame's detections (``n×4`` xyxy pixels, scores, class indices) and return its tracks.

        ``frame`` (``H×W×3`` uint8 RGB) is what BoT-SORT estimates the camera's motion from; ByteTrack ignores it.
        """
        config = self.config
        self.frame_id += 1
        boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        scores = np.asarray(scores, dtype=np.float64).reshape(-1)
        labels = np.asarray(labels).reshape(-1).astype(np.int64)
        if not len(boxes) == len(scores) == len(labels):
            raise ValueError(f"update() needs one score and one class per box: got {len(boxes)} boxes, {len(scores)} scores, "
                             f"{len(labels)} classes")
        high = np.flatnonzero(scores >= config.track_high_thresh)
        low = np.flatnonzero((scores > config.track_low_thresh) & (scores < config.track_high_thresh))

        unconfirmed = [track for track in self.tracked if not track.activated]
        confirmed = [track for track in self.tracked if track.activated]
        pool = confirmed + [track for track in self.lost if track not in confirmed]
        self._predict(pool)
        self._compensate(pool + unconfirmed, frame)

        # 1. every track against the high-score boxes, IoU weighed by the box's score
        cost = iou_cost(self._boxes(pool), boxes[high])
        if config.fuse_score:
            cost = fuse_scores(cost, scores[high])
        matches, left_tracks, left_high = assign(cost, config.match_thresh)
        matched = [(pool[row], int(high[column])) for row, column in matches]

        # 2. the tracks being tracked that found nothing, against the low-score boxes
        remaining = [pool[row] for row in left_tracks if pool[row].state == _TRACKED]
        matches, left_remaining, _ = assign(iou_cost(self._boxes(remaining), boxes[low]), config.match_thresh_low)
        matched += [(remaining[row], int(low[column])) for row, column in matches]
        newly_lost = [remaining[row] for row in left_remaining]

        # 3. tracks seen only in their first frame, against the high-score boxes still free
        free_high = high[left_high]
        cost = iou_cost(self._boxes(unconfirmed), boxes[free_high])
        if config.fuse_score:
            cost = fuse_scores(cost, scores[free_high])
        matches, _, left_free = assign(cost, config.match_thresh_unconfirmed)
        matched += [(unconfirmed[row], int(free_high[column])) for row, column in matches]
        self._update(matched, boxes, scores, labels)

        # 4. the high-score boxes nobody took, confident enough, start tracks
        starters = free_high[left_free]
        started = self._new_tracks(starters[scores[starters] >= config.new_track_thresh], boxes, scores, labels)

        for track in newly_lost:
            track.state = _LOST
        self.tracked = [track for track, _ in matched] + started  # unconfirmed tracks that found nothing are dropped
        kept_lost = [track for track in self.lost + newly_lost
                     if track.state == _LOST and self.frame_id - track.frame <= config.max_time_lost]
        self.tracked, self.lost = self._without_duplicates(self.tracked, kept_lost)
        return self._output()

    def _without_duplicates(self, tracked: list[Track], lost: list[Track]) -> tuple[list[Track], list[Track]]:
        """Of a tracked and a lost track on the same object (IoU > 0.85), keep the one followed longer."""
        if not tracked or not lost:
            return tracked, lost
        overlap = box_iou(self._boxes(tracked), self._boxes(lost)) > 0.85
        drop_tracked: set[int] = set()
        drop_lost: set[int] = set()
        for row, column in zip(*np.nonzero(overlap)):
            if tracked[row].frame - tracked[row].start_frame > lost[column].frame - lost[column].start_frame:
                drop_lost.add(int(column))
            else:
                drop_tracked.add(int(row))
        return ([track for index, track in enumerate(tracked) if index not in drop_tracked],
                [track for index, track in enumerate(lost) if index not in drop_lost])

    def _output(self) -> TrackedBoxes:
        shown = [track for track in self.tracked if track.activated and track.frame == self.frame_id]
        if not shown:
            return TrackedBoxes.empty()
        boxes = self._boxes(shown)
        for track, box in zip(shown, boxes):
            track.history.append((float(box[0] + box[2]) / 2, float(box[1] + box[3]) / 2))
            del track.history[:-30]  # the trail drawn behind a box: its last 30 centres
        return TrackedBoxes(boxes=boxes, ids=np.array([track.track_id for track in shown], dtype=np.int64),
                            scores=np.array([track.score for track in shown]),
                            classes=np.array([track.label for track in shown], dtype=np.int64),
                            detections=np.array([track.detection for track in shown], dtype=np.int64))

    def trails(self) -> dict[int, list[tuple[float, float]]]:
        """The recent centres of every track shown in the last frame, by ID (what ``track(save=True)`` draws)."""
        return {track.track_id: list(track.history) for track in self.tracked if track.activated and track.frame == self.frame_id}


class BoTSORT(ByteTracker):
    """BoT-SORT without appearance: ByteTrack's association, a ``cx, cy, w, h`` Kalman state, and camera-motion
    compensation of the predicted tracks (``gmc_method``)."""

    layout = "xywh"

    def __init__(self, config: TrackerConfig) -> None:
        self.motion = CameraMotion(config.gmc_method, config.gmc_downscale)
        super().__init__(config)

    def reset(self) -> None:
        """Forget every track and the previous frame."""
        super().reset()
        self.motion.reset()

    def _predict(self, tracks: list[Track]) -> None:
        # BoT-SORT's state holds the width, not the aspect ratio: a lost track's width and height velocities stop.
        for track in tracks:
            if track.state != _TRACKED:
                track.mean[6] = 0.0
        super()._predict(tracks)

    def _compensate(self, tracks: list[Track], frame: np.ndarray | None) -> None:
        affine = self.motion.estimate(frame)
        if not tracks or np.allclose(affine, np.eye(2, 3)):
            return
        means, covariances = BoxKalmanFilter.warp(np.stack([track.mean for track in tracks]),
                                                  np.stack([track.covariance for track in tracks]), affine)
        for track, mean, covariance in zip(tracks, means, covariances):
            track.mean, track.covariance = mean, covariance


def build_tracker(config: TrackerConfig) -> ByteTracker:
    """The tracker ``config.tracker_type`` names."""
    return BoTSORT(config) if config.tracker_type == "botsort" else ByteTracker(config)
