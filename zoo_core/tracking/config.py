"""Tracker settings: the built-in ``bytetrack.yaml`` and ``botsort.yaml`` and the user's copies of them.

``tracker_config("bytetrack")`` (or ``"bytetrack.yaml"``, ``"botsort"``, a path to a YAML file, a mapping)
gives a validated ``TrackerConfig``; an unknown key, a value out of range or a missing file is a
``TrackerConfigError`` naming the file, the key and the fix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from zoo_core.errors import TrackerConfigError, excerpt

__all__ = ["TrackerConfig", "tracker_config", "BUILTIN_TRACKERS", "builtin_tracker_path"]

#: The tracker YAMLs zoo ships (``zoo_core/tracking/trackers/``), by the names ``track(tracker=...)`` takes.
BUILTIN_TRACKERS = ("bytetrack", "botsort")


class TrackerConfig(BaseModel):
    """One tracker's settings (the keys of ``bytetrack.yaml`` / ``botsort.yaml``; their comments say what each does)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tracker_type: Literal["bytetrack", "botsort"]
    track_high_thresh: float = Field(0.25, ge=0.0, le=1.0)
    track_low_thresh: float = Field(0.1, ge=0.0, le=1.0)
    new_track_thresh: float = Field(0.25, ge=0.0, le=1.0)
    track_buffer: int = Field(30, ge=0)
    match_thresh: float = Field(0.8, ge=0.0, le=1.0)
    match_thresh_low: float = Field(0.5, ge=0.0, le=1.0)
    match_thresh_unconfirmed: float = Field(0.7, ge=0.0, le=1.0)
    fuse_score: bool = True
    frame_rate: float = Field(30.0, gt=0.0)
    # BoT-SORT only (ignored by ByteTrack).
    gmc_method: Literal["sparseOptFlow", "ecc", "none"] = "sparseOptFlow"
    gmc_downscale: int = Field(2, ge=1)
    with_reid: bool = False
    # Ultralytics' botsort.yaml carries these for its appearance matching; accepted so its files load.
    proximity_thresh: float = Field(0.5, ge=0.0, le=1.0)
    appearance_thresh: float = Field(0.8, ge=0.0, le=1.0)
    model: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "TrackerConfig":
        if self.track_low_thresh > self.track_high_thresh:
            raise ValueError(f"track_low_thresh ({self.track_low_thresh}) must not exceed track_high_thresh "
                             f"({self.track_high_thresh}): the second association takes the boxes between the two")
        if self.with_reid:
            raise ValueError("with_reid: true needs a re-identification model, which zoo does not ship; set with_reid: false "
                             "(BoT-SORT then matches by motion and camera-motion-compensated IoU)")
        return self

    @property
    def max_time_lost(self) -> int:
        """Frames a lost track is kept: ``track_buffer`` scaled to the frame rate (30 fps: ``track_buffer``)."""
        return int(self.frame_rate / 30.0 * self.track_buffer)


def builtin_tracker_path(name: str) -> Path:
    """The file of built-in tracker ``name`` (``"bytetrack"`` or ``"botsort"``)."""
    return Path(__file__).with_name("trackers") / f"{name}.yaml"


def tracker_config(tracker: "str | os.PathLike[str] | Mapping[str, Any] | TrackerConfig", **overrides: Any) -> TrackerConfig:
    """The ``TrackerConfig`` that ``tracker`` names, with ``overrides`` on top.

    ``tracker``: ``"bytetrack"``, ``"botsort"`` (with or without ``.yaml``), the path of a tracker YAML,
    a mapping of its keys, or a ``TrackerConfig``.
    """
    from zoo_core.data.dataset_yaml import load_bounded_yaml, read_yaml_text

    where = "tracker"
    if isinstance(tracker, TrackerConfig):
        content: Any = tracker.model_dump()
    elif isinstance(tracker, Mapping):
        content = dict(tracker)
    elif isinstance(tracker, (str, os.PathLike)):
        text = os.fspath(tracker)
        stem = text[:-5] if text.endswith(".yaml") else text
        path = builtin_tracker_path(stem) if stem in BUILTIN_TRACKERS and not Path(text).is_file() else Path(text)
        if not path.is_file():
            raise TrackerConfigError(
                f"tracker={text!r}: no such tracker; give {' or '.join(map(repr, BUILTIN_TRACKERS))}, or the path of a tracker "
                f"YAML (copy {builtin_tracker_path('bytetrack')} and edit it)"
            )
        where = str(path)
        try:
            content = load_bounded_yaml(read_yaml_text(path), where, TrackerConfigError)
        except TrackerConfigError:
            raise
        except ValueError as error:  # the data layer's DatasetError for an unreadable file
            raise TrackerConfigError(f"{where}: {error}") from None
    else:
        raise TrackerConfigError(f"tracker={excerpt(tracker)}: give 'bytetrack', 'botsort', a tracker YAML path or a mapping")
    if not isinstance(content, dict):
        raise TrackerConfigError(f"{where}: a tracker file is a mapping of settings (tracker_type: bytetrack, ...), "
                                 f"got {type(content).__name__}")
    content = {**content, **overrides}
    try:
        return TrackerConfig(**content)
    except ValidationError as error:
        problem = error.errors()[0]
        key = ".".join(str(part) for part in problem.get("loc", ())) or "settings"
        if problem.get("type") == "extra_forbidden":
            known = ", ".join(TrackerConfig.model_fields)
            raise TrackerConfigError(f"{where}: unknown tracker setting {key!r}; the settings are {known}") from None
        value = f" (got {excerpt(problem.get('input'))})" if key != "settings" else ""
        raise TrackerConfigError(f"{where}: {key}: {problem.get('msg')}{value}") from None
