"""``shapes`` videos: short clips of moving shapes with ground-truth identities, for measuring trackers.

``shapes_video("crossing")`` renders, deterministically from ``seed``, the classes of the ``shapes`` set
(circle, square, triangle, cross) on a textured background, moving in straight lines, and returns a
``ShapesVideo``: the frames and, per frame, each visible object's ID (from 1), box and class. Scenarios:

- ``"crossing"``: objects travel across the picture on lines through its middle, so their paths cross and
  they pass over one another;
- ``"occlusion"``: objects travel sideways behind a pillar in the middle, which hides each of them
  completely for several frames (fewer than ByteTrack's 30-frame buffer at the default speed);
- ``"shaking"``: objects drift slowly while the camera shakes, moving the whole picture by up to 8 % of its side
  either way, a fresh offset every frame (what camera-motion compensation is for).

An object is in a frame's ground truth when at least ``MIN_VISIBLE`` of its pixels show; its box is the
extent of the whole shape, hidden parts included, as MOT benchmarks annotate (the ``shapes`` detection set
boxes the visible pixels, so a detector trained there boxes a half-hidden object smaller). ``ShapesVideo.write(path)`` writes the
clip as an ``.mp4`` (``zoo_core.data.video``) for ``zoo track`` and ``model.track``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from zoo_core.data.shapes import SHAPES_CLASSES, _distinct_colour, _shape_mask

__all__ = ["ShapesVideo", "shapes_video", "SCENARIOS", "MIN_VISIBLE"]

Scenario = Literal["crossing", "occlusion", "shaking"]
SCENARIOS: tuple[str, ...] = ("crossing", "occlusion", "shaking")
#: The share of an object's pixels that must show for it to be in a frame's ground truth.
MIN_VISIBLE = 0.3


@dataclass
class ShapesVideo:
    """A rendered clip: ``frames`` (``T×H×W×3`` uint8 RGB) and per frame the visible objects' ``ids``, ``boxes``
    (``n×4`` xyxy pixels) and ``classes``."""

    scenario: str
    frames: np.ndarray
    ids: list[np.ndarray]
    boxes: list[np.ndarray]
    classes: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.frames)

    def write(self, path: str | Path, fps: float = 10.0) -> Path:
        """The clip as an ``.mp4`` at ``path`` (written whole or not at all)."""
        from zoo_core.data.video import VideoWriter

        with VideoWriter(path, fps) as writer:
            for frame in self.frames:
                writer.write(frame)
        return Path(path)


def _textured_background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A gradient with smooth blotches and scattered small marks: texture enough for optical flow to hold on to."""
    from PIL import Image

    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    start, end = rng.uniform(60, 190, 3), rng.uniform(60, 190, 3)
    background = start + (end - start) * ((xs + ys) / 2)[..., None]
    grid = rng.normal(0, 1, (8, 8, 3)).astype(np.float32)
    blotches = np.stack([np.asarray(Image.fromarray(grid[..., c], mode="F").resize((size, size), Image.BICUBIC))
                         for c in range(3)], axis=-1)
    background += 14 * blotches
    marks = max(8, size * size // 400)
    for x, y, shade in zip(rng.integers(0, size - 3, marks), rng.integers(0, size - 3, marks), rng.uniform(-45, 45, marks)):
        background[y:y + 3, x:x + 3] += shade
    return background


@dataclass
class _Mover:
    class_id: int
    extent: float
    angle: float
    colour: np.ndarray
    start: np.ndarray  # centre at frame 0 (world pixels)
    velocity: np.ndarray  # pixels per frame


def _movers(scenario: str, rng: np.random.Generator, size: int, frames: int, objects: int, margin: int,
            background: np.ndarray) -> list[_Mover]:
    movers = []
    centre = np.array([margin + size / 2, margin + size / 2])
    for index in range(objects):
        class_id = int(rng.integers(0, len(SHAPES_CLASSES)))
        extent = float(rng.uniform(0.13, 0.18) * size)
        angle = float(rng.uniform(-0.3, 0.3))
        if scenario == "crossing":
            # Lines through the middle, shifted a little sideways, at spread-out headings: paths cross there.
            heading = (index + rng.uniform(-0.25, 0.25)) * math.pi / objects
            direction = np.array([math.cos(heading), math.sin(heading)])
            normal = np.array([-direction[1], direction[0]])
            reach = 0.36 * size
            offset = normal * rng.uniform(-0.1, 0.1) * size + direction * rng.uniform(-0.2, 0.2) * size
            start = centre - direction * reach + offset
            end = centre + direction * reach + offset
            if index % 2:
                start, end = end, start
        elif scenario == "occlusion":
            # Rows across the picture, behind the pillar in the middle; alternate rows go the other way.
            row = margin + size * (0.2 + 0.6 * (index + 0.5) / objects)
            left, right = margin + 0.12 * size, margin + 0.88 * size
            start, end = np.array([left, row]), np.array([right, row])
            if index % 2:
                start, end = end, start
            start = start + np.array([rng.uniform(-0.04, 0.04) * size, 0])
        else:  # shaking: slow drifts from spread-out places
            cell = np.array([(index % 2) + 0.5, (index // 2 % 2) + 0.5]) / 2
            start = margin + size * (0.2 + 0.6 * cell) + rng.uniform(-0.05, 0.05, 2) * size
            end = start + rng.uniform(-0.15, 0.15, 2) * size
        velocity = (end - start) / max(1, frames - 1)
        under = background[int(np.clip(start[1], 0, len(background) - 1)), int(np.clip(start[0], 0, len(background) - 1))]
        movers.append(_Mover(class_id, extent, angle, _distinct_colour(rng, under), start, velocity))
    return movers


def shapes_video(scenario: Scenario = "crossing", frames: int = 48, size: int = 160, seed: int = 0,
                 objects: int | None = None) -> ShapesVideo:
    """Render a ``scenario`` clip of ``frames`` frames of ``size``×``size`` pixels (see the module docstring).

    ``objects`` defaults to 4 (crossing), 3 (occlusion) or 4 (shaking).
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario={scenario!r}: the shapes video scenarios are {', '.join(SCENARIOS)}")
    if frames < 2 or size < 64:
        raise ValueError(f"a shapes video needs at least 2 frames of 64×64 pixels; got frames={frames}, size={size}")
    rng = np.random.default_rng(seed)
    objects = objects or {"crossing": 4, "occlusion": 3, "shaking": 4}[scenario]
    shake = int(round(0.08 * size)) if scenario == "shaking" else 0
    world = size + 2 * shake
    background = _textured_background(rng, world)
    movers = _movers(scenario, rng, size, frames, objects, shake, background)
    pillar = None
    if scenario == "occlusion":
        half = 0.1 * size
        pillar = (int(world / 2 - half), int(world / 2 + half))
        pillar_colour = _distinct_colour(rng, background[:, pillar[0]:pillar[1]].reshape(-1, 3).mean(0))
    offsets = rng.integers(-shake, shake + 1, (frames, 2)) if shake else np.zeros((frames, 2), dtype=np.int64)
    rendered, all_ids, all_boxes, all_classes = [], [], [], []
    for t in range(frames):
        canvas = background.copy()
        owner = np.full((world, world), -1, dtype=np.int16)
        areas, extents = [], []
        for index, mover in enumerate(movers):
            centre = mover.start + mover.velocity * t
            mask = _shape_mask(mover.class_id, world, (float(centre[0]), float(centre[1])), mover.extent, mover.angle)
            canvas[mask] = mover.colour
            owner[mask] = index
            areas.append(int(mask.sum()))
            extents.append(mask)
        if pillar is not None:
            canvas[:, pillar[0]:pillar[1]] = pillar_colour
            owner[:, pillar[0]:pillar[1]] = -1
        dx, dy = int(offsets[t, 0]) + shake, int(offsets[t, 1]) + shake
        view = canvas[dy:dy + size, dx:dx + size]
        view_owner = owner[dy:dy + size, dx:dx + size]
        noise = rng.normal(0, 3, view.shape)
        rendered.append(np.clip(np.rint(view + noise), 0, 255).astype(np.uint8))
        ids, boxes, classes = [], [], []
        for index, mover in enumerate(movers):
            visible = view_owner == index
            count = int(visible.sum())
            if areas[index] == 0 or count < MIN_VISIBLE * areas[index]:
                continue
            # The box is the whole shape's extent in the frame, hidden parts included (as MOT ground truth
            # boxes are): an object half behind the pillar keeps its size instead of shrinking to a sliver.
            rows, columns = np.nonzero(extents[index][dy:dy + size, dx:dx + size])
            ids.append(index + 1)
            boxes.append((columns.min(), rows.min(), columns.max() + 1, rows.max() + 1))
            classes.append(mover.class_id)
        all_ids.append(np.array(ids, dtype=np.int64))
        all_boxes.append(np.array(boxes, dtype=np.float64).reshape(-1, 4))
        all_classes.append(np.array(classes, dtype=np.int64))
    return ShapesVideo(scenario, np.stack(rendered), all_ids, all_boxes, all_classes)
