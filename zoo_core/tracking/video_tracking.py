"""``track``: ``predict`` frame by frame with a tracker giving every box an ID that holds across frames.

What ``LibreYOLO.track`` and ``zoo track`` run. Each frame's result (after ``classes``) goes to the tracker
(``zoo_core.tracking.trackers``); the result kept is the detections the tracker followed this frame, in its order,
with its Kalman-filtered boxes, ``boxes.id`` and the recent centres ``plot`` draws as trails. Masks and keypoints
stay with their box (``Result.select``). A video saved with ``save=True`` is one annotated ``.mp4``.

The tracker lives on the model between calls (a ``TrackingSession``): ``persist=True`` continues it, for loops
that feed one frame per call; it still starts afresh when the tracker settings change or the source is another
video file or folder. ``persist=False`` (the default) starts every call with a new tracker.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from zoo_core.errors import ArgumentError
from zoo_core.tasks import get_task
from zoo_core.tracking.config import TrackerConfig, tracker_config
from zoo_core.tracking.trackers import ByteTracker, build_tracker

if TYPE_CHECKING:
    from zoo_core.data.images import SourceImage
    from zoo_core.tasks.predictions import DetectionResult, Result

__all__ = ["TrackingSession", "track", "DEFAULT_TRACKER"]

#: The tracker ``track`` uses when none is named (LibreYOLO's and Ultralytics' default).
DEFAULT_TRACKER = "bytetrack"


@dataclass
class TrackingSession:
    """A tracker and what it was started for: its settings and the source whose frames it has seen."""

    config: TrackerConfig
    tracker: ByteTracker
    source: str | None

    def accepts(self, config: TrackerConfig, source: str | None) -> bool:
        """Whether a ``persist=True`` call with ``config`` on ``source`` continues this session."""
        return config == self.config and (source is None or self.source is None or source == self.source)


def _source_key(source: Any) -> str | None:
    """The file or folder a source names (two calls on one video continue one stream); None for in-memory frames."""
    if isinstance(source, (str, os.PathLike)):
        return str(Path(source).resolve())
    return None


def track(
    libre: Any,
    source: Any,
    tracker: "str | os.PathLike[str] | Mapping[str, Any] | TrackerConfig" = DEFAULT_TRACKER,
    persist: bool = False,
    stream: bool = False,
    conf: float | None = None,
    **predict_options: Any,
) -> "list[Result] | Iterator[Result]":
    """Track the objects of ``source`` (a video, a folder or list of frames in order, or one frame with ``persist``).

    Args:
        libre: the ``LibreYOLO`` model; its task must yield boxes (detect, segment, pose).
        source: what ``predict`` takes; its images are the consecutive frames of one stream.
        tracker: ``"bytetrack"``, ``"botsort"`` (with or without ``.yaml``), a tracker YAML you copied and
            edited, a mapping of its settings, or a ``TrackerConfig``.
        persist: continue the tracker (and so the IDs) of this model's previous ``track`` call.
        stream: a generator of the per-frame results instead of their list.
        conf: the detector's score threshold; by default the tracker's ``track_low_thresh``, so the boxes its second
            association recovers occluded objects from reach it.
        predict_options: ``predict``'s other arguments (``iou``, ``imgsz``, ``device``, ``classes``, ``save``,
            ``project``, ``name`` (default ``"track"``), ``max_det``, ``line_width``, ``verbose`` ...).
    """
    from zoo_core.tasks.runner import predict

    task = get_task(libre.task, input_pipeline=libre.input_pipeline)
    if not task.trackable:
        raise ArgumentError(f"track() follows boxes from frame to frame, and {libre.task!r} models do not find boxes; "
                            "track with a detect, segment or pose model")
    if not isinstance(persist, bool):
        raise ArgumentError(f"track(persist={persist!r}): give True (continue the previous call's tracks) or False")
    config = tracker_config(tracker)
    key = _source_key(source)
    session = libre.tracking_session if persist else None
    if session is None or not session.accepts(config, key):
        session = TrackingSession(config, build_tracker(config), key)
    elif key is not None:
        session.source = key
    libre.tracking_session = session
    threshold = config.track_low_thresh if conf is None else conf

    def follow(result: "DetectionResult", frame: "SourceImage") -> "DetectionResult":
        return _followed(session.tracker, result)

    predict_options.setdefault("name", "track")
    return predict(libre, source, conf=threshold, stream=stream, follow=follow, **predict_options)


def _followed(tracker: ByteTracker, result: "DetectionResult") -> "DetectionResult":
    """``result`` as the tracker sees it after this frame: the detections it follows, their filtered boxes, IDs, trails."""
    import numpy as np
    import torch

    frame = result.orig_img
    tracked = tracker.update(result.boxes.xyxy.numpy(), result.scores.numpy(), result.labels.numpy(), frame)
    kept = result.select(torch.as_tensor(tracked.detections, dtype=torch.long))
    trails = tracker.trails()
    length = max((len(trails[int(track_id)]) for track_id in tracked.ids), default=1)
    centres = np.full((len(tracked), length, 2), np.nan, dtype=np.float32)
    for row, track_id in enumerate(tracked.ids.tolist()):
        points = np.asarray(trails[track_id], dtype=np.float32).reshape(-1, 2)
        centres[row, length - len(points):] = points
    return dataclasses.replace(kept, boxes=torch.as_tensor(tracked.boxes, dtype=torch.float32).reshape(-1, 4),
                               track_ids=torch.as_tensor(tracked.ids, dtype=torch.long), trails=torch.from_numpy(centres))
