"""Prediction results: one object per image, in original-image coordinates, that can draw itself.

``LibreYOLO.predict`` returns a list of these. Every result has ``orig_image`` (uint8 ``3×H×W``
RGB tensor), ``path`` (the file, or ``None`` for in-memory images), ``name``, ``names``,
``plot()`` (an ``H×W×3`` uint8 RGB NumPy array with the prediction drawn), ``save(path)``,
``summary()`` (one line), ``to_dict()`` / ``to_json()`` (plain data), ``rows()`` / ``to_df()``
(a table) and ``orig_img`` (``H×W×3`` RGB array). ``save_path`` is set when ``predict(save=True)``
wrote the drawing, ``save_dir`` when predict wrote anything for it (the drawing, ``labels/``, ``crops/``). Detection's ``boxes`` and classification's ``probs`` are tensors that also
offer Ultralytics' views (``boxes.xyxy``, ``boxes.xywh``, ``boxes.conf``, ``boxes.cls``,
``probs.top1``, ``probs.top5``...); instance segmentation's ``masks`` offers ``masks.data``
(n×H×W bool at the original size), ``masks.xy`` and ``masks.xyn`` (one polygon per object).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from zoo_core.reports.drawing import (
    as_numpy_image, class_colour, draw_boxes, draw_caption, draw_instance_masks, draw_keypoints, draw_mask, draw_rotated_boxes,
    draw_trails, mask_outlines,
)

__all__ = [
    "Result", "DetectionResult", "InstanceSegmentationResult", "PoseResult", "Keypoints", "PointsResult", "ClassificationResult",
    "SegmentationResult", "RestorationResult", "Boxes", "Masks", "Probs", "OrientedBoxes", "OrientedBoxResult",
]


class Boxes(torch.Tensor):
    """A detection result's boxes: the ``n×4`` xyxy tensor (original-image pixels) with the views
    Ultralytics users reach for: ``xyxy``, ``xywh`` (centre, size), ``xyxyn``/``xywhn`` (divided by
    the image size), ``conf`` (scores), ``cls`` (class indices, float as Ultralytics gives them) and, for
    the results of ``track()``, ``id`` (each box's track ID; ``None`` for ``predict()``) and ``is_track``.

    It is a tensor, so code that used ``result.boxes`` as one keeps working; the views are tensors.
    """

    @staticmethod
    def of(xyxy: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, shape: tuple[int, int],
           ids: torch.Tensor | None = None) -> "Boxes":
        """Boxes for ``xyxy`` with their scores, labels, the image's ``(height, width)`` and the track ``ids`` if tracked."""
        boxes = xyxy.as_subclass(Boxes)
        boxes._scores, boxes._labels, boxes._shape, boxes._ids = scores, labels, shape, ids
        return boxes

    @property
    def xyxy(self) -> torch.Tensor:
        """``n×4`` x1, y1, x2, y2 in pixels."""
        return self.as_subclass(torch.Tensor)

    @property
    def xywh(self) -> torch.Tensor:
        """``n×4`` centre x, centre y, width, height in pixels."""
        x1, y1, x2, y2 = self.xyxy.unbind(-1)
        return torch.stack(((x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1), dim=-1)

    @property
    def xyxyn(self) -> torch.Tensor:
        """``xyxy`` divided by the image's width and height."""
        height, width = self._shape
        return self.xyxy / torch.tensor([width, height, width, height], dtype=self.dtype)

    @property
    def xywhn(self) -> torch.Tensor:
        """``xywh`` divided by the image's width and height."""
        height, width = self._shape
        return self.xywh / torch.tensor([width, height, width, height], dtype=self.dtype)

    @property
    def conf(self) -> torch.Tensor:
        """The detections' scores."""
        return self._scores

    @property
    def cls(self) -> torch.Tensor:
        """The detections' class indices, as floats (Ultralytics' convention; ``labels`` has them as int64)."""
        return self._labels.float()

    @property
    def id(self) -> torch.Tensor | None:
        """Each box's track ID (int64, from 1) when the result comes from ``track()``; ``None`` otherwise (Ultralytics'
        ``boxes.id``)."""
        return getattr(self, "_ids", None)

    @property
    def is_track(self) -> bool:
        """Whether the boxes carry track IDs (the result comes from ``track()``)."""
        return self.id is not None


class OrientedBoxes(torch.Tensor):
    """An oriented-box result's boxes: the ``n×5`` ``cx, cy, w, h, angle`` tensor (original-image pixels, radians,
    long side first, angle in ``[-pi/2, pi/2)``: ``zoo_core/ops/rotated_boxes.py``) with Ultralytics' ``result.obb``
    views: ``xywhr``, ``xyxyxyxy`` (``n×4×2`` corners), ``xyxyxyxyn`` (divided by the image size), ``xyxy`` (the
    enclosing axis-aligned boxes), ``conf`` and ``cls``."""

    @staticmethod
    def of(xywhr: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, shape: tuple[int, int]) -> "OrientedBoxes":
        """Oriented boxes for ``xywhr`` with their scores, labels and the image's ``(height, width)``."""
        boxes = xywhr.as_subclass(OrientedBoxes)
        boxes._scores, boxes._labels, boxes._shape = scores, labels, shape
        return boxes

    @property
    def xywhr(self) -> torch.Tensor:
        """``n×5`` centre x, centre y, width, height (pixels) and angle (radians)."""
        return self.as_subclass(torch.Tensor)

    @property
    def xyxyxyxy(self) -> torch.Tensor:
        """``n×4×2`` corners in pixels, in loop order."""
        from zoo_core.ops.rotated_boxes import xywhr_to_corners

        return xywhr_to_corners(self.xywhr)

    @property
    def xyxyxyxyn(self) -> torch.Tensor:
        """``xyxyxyxy`` divided by the image's width and height."""
        height, width = self._shape
        return self.xyxyxyxy / torch.tensor([width, height], dtype=self.dtype)

    @property
    def xyxy(self) -> torch.Tensor:
        """``n×4`` the axis-aligned boxes enclosing the oriented ones."""
        from zoo_core.ops.rotated_boxes import xywhr_to_xyxy

        return xywhr_to_xyxy(self.xywhr)

    @property
    def conf(self) -> torch.Tensor:
        """The detections' scores."""
        return self._scores

    @property
    def cls(self) -> torch.Tensor:
        """The detections' class indices, as floats (Ultralytics' convention; ``labels`` has them as int64)."""
        return self._labels.float()


class Masks:
    """An instance segmentation result's masks, as Ultralytics users know them: ``data`` (``n×H×W`` bool at the
    original image size, row i the mask of box i), ``xy`` (one ``k×2`` float32 polygon per mask, in pixels) and
    ``xyn`` (the polygons divided by the image's width and height).

    A mask's polygon is its largest outer contour (OpenCV ``findContours``, the one of the largest
    ``contourArea``, as LibreYOLO 1.6's ``Masks.xy`` picks it); an empty mask has a ``0×2`` polygon.
    """

    def __init__(self, data: torch.Tensor) -> None:
        if data.ndim != 3:
            raise ValueError(f"masks must be n×H×W, got a tensor of shape {tuple(data.shape)}")
        self.data = data.detach().cpu().bool()
        self._xy: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.data)

    @property
    def shape(self) -> torch.Size:
        """``(n, H, W)``."""
        return self.data.shape

    def __getitem__(self, index: Any) -> "Masks":
        """The masks picked by ``index`` (a boolean or integer selection of rows)."""
        picked = self.data[index]
        return Masks(picked if picked.ndim == 3 else picked[None])

    @property
    def xy(self) -> list[np.ndarray]:
        """One ``k×2`` float32 ``x, y`` polygon per mask, in original-image pixels."""
        if self._xy is None:
            import cv2

            polygons = []
            for mask in self.data:
                outlines = mask_outlines(mask)
                largest = max(outlines, key=cv2.contourArea) if outlines else np.zeros((0, 2))
                polygons.append(largest.astype(np.float32))
            self._xy = polygons
        return self._xy

    @property
    def xyn(self) -> list[np.ndarray]:
        """``xy`` divided by the image's width and height."""
        height, width = int(self.data.shape[-2]), int(self.data.shape[-1])
        scale = np.array([width, height], dtype=np.float32)
        return [polygon / scale for polygon in self.xy]

    def __repr__(self) -> str:
        """``Masks(n=2, shape=480×640)``."""
        return f"Masks(n={len(self)}, shape={self.data.shape[-2]}×{self.data.shape[-1]})"


class Probs(torch.Tensor):
    """A classification result's class probabilities (a ``C`` tensor) with ``top1``, ``top5``,
    ``top1conf`` and ``top5conf``, as Ultralytics users know them."""

    @property
    def top1(self) -> int:
        """The most probable class index."""
        return int(self.as_subclass(torch.Tensor).argmax())

    @property
    def top5(self) -> list[int]:
        """Up to five class indices, most probable first."""
        plain = self.as_subclass(torch.Tensor)
        return plain.topk(min(5, len(plain))).indices.tolist()

    @property
    def top1conf(self) -> torch.Tensor:
        """The probability of ``top1``."""
        return self.as_subclass(torch.Tensor).max()

    @property
    def top5conf(self) -> torch.Tensor:
        """The probabilities of ``top5``."""
        plain = self.as_subclass(torch.Tensor)
        return plain.topk(min(5, len(plain))).values


# repr=False here and on every subclass: the generated repr printed the whole image tensor (and the
# names table); Result.__repr__ is one short line instead.
@dataclass(repr=False)
class Result:
    """What every prediction result has: the original image, where it came from, the class names."""

    task: ClassVar[str] = ""
    orig_image: torch.Tensor
    path: Path | None
    name: str
    names: dict[int, str]
    save_path: Path | None = field(default=None, init=False)
    save_dir: Path | None = field(default=None, init=False)

    @property
    def orig_shape(self) -> tuple[int, int]:
        """``(height, width)`` of the original image."""
        return int(self.orig_image.shape[-2]), int(self.orig_image.shape[-1])

    def plot(self) -> np.ndarray:
        """The original image with the prediction drawn, ``H×W×3`` uint8 RGB."""
        return as_numpy_image(self.orig_image)

    def save(self, path: str | Path, **drawing: Any) -> Path:
        """Write ``plot(**drawing)`` to ``path`` (format from the suffix) and return the path."""
        from PIL import Image

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(self.plot(**drawing)).save(path)
        return path

    def summary(self) -> str:
        """One line describing the prediction."""
        return self.name

    def __repr__(self) -> str:
        """``DetectionResult(path='a.jpg', image=3×480×640, boxes=2)``: what the result is, never its tensors."""
        shape = "×".join(str(side) for side in self.orig_image.shape)
        where = str(self.path) if self.path is not None else self.name
        contents = self._repr_contents()
        return f"{type(self).__name__}(path={where!r}, image={shape}{', ' + contents if contents else ''})"

    def _repr_contents(self) -> str:
        """What ``repr`` says about the prediction itself (subclasses: the count of boxes, the top class...)."""
        return ""

    def to_dict(self) -> dict[str, Any]:
        """The prediction as plain Python data (JSON-friendly)."""
        return {"name": self.name, "path": str(self.path) if self.path else None, "shape": list(self.orig_shape)}

    @property
    def orig_img(self) -> np.ndarray:
        """The original image as an ``H×W×3`` uint8 RGB array (Ultralytics' name; note: RGB, not BGR)."""
        return as_numpy_image(self.orig_image)

    def to_json(self, indent: int | None = None) -> str:
        """``to_dict()`` as a JSON string."""
        import json

        return json.dumps(self.to_dict(), indent=indent)

    def to_df(self) -> Any:
        """The prediction as a pandas ``DataFrame`` (one row per detection, point or class); needs pandas."""
        try:
            import pandas
        except ImportError:
            raise ImportError("Result.to_df() needs pandas: pip install pandas (to_dict() and to_json() need nothing)") from None
        return pandas.DataFrame(self.rows())

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per detection, point or class (what ``to_df`` tabulates)."""
        return [self.to_dict()]


@dataclass(repr=False)
class LabelledItemsResult(Result):
    """A result of ``n`` found items, each with a score and a class: ``scores`` (n) and ``labels`` (n, int64)
    beside the items' own geometry (the attribute ``geometry`` names: boxes, points)."""

    #: The attribute that holds the items (an ``n×k`` tensor).
    geometry: ClassVar[str] = ""
    #: What the items are called in a summary that found none ("no detections").
    items: ClassVar[str] = "items"
    scores: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    labels: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    def summary(self) -> str:
        """``name: 2 circle, 1 square`` (or ``name: no detections``)."""
        if len(self.labels) == 0:
            return f"{self.name}: no {self.items}"
        counts: dict[str, int] = {}
        for label in self.labels.tolist():
            class_name = str(self.names.get(int(label), label))
            counts[class_name] = counts.get(class_name, 0) + 1
        return f"{self.name}: " + ", ".join(f"{count} {class_name}" for class_name, count in counts.items())

    def _repr_contents(self) -> str:
        """``boxes=3`` (the geometry's name and the item count)."""
        return f"{self.geometry or 'items'}={len(self.labels)}"

    def to_dict(self) -> dict[str, Any]:
        """The items, scores and class names as lists."""
        return {
            **super().to_dict(),
            self.geometry: getattr(self, self.geometry).tolist(),
            "scores": self.scores.tolist(),
            "labels": self.labels.tolist(),
            "classes": [self.names.get(int(label), str(label)) for label in self.labels.tolist()],
        }

    def _per_item(self) -> dict[str, Any]:
        """The fields that hold one entry per item, by name (what ``select`` indexes); subclasses add theirs."""
        return {self.geometry: getattr(self, self.geometry).as_subclass(torch.Tensor), "scores": self.scores, "labels": self.labels}

    def select(self, keep: torch.Tensor) -> "LabelledItemsResult":
        """A copy holding the items ``keep`` picks (a bool mask, or indices in the order wanted), with everything that
        belongs to them (masks, keypoints, track IDs)."""
        return dataclasses.replace(self, **{name: value[keep] for name, value in self._per_item().items()})

    def keep_classes(self, classes: "list[int]") -> "LabelledItemsResult":
        """A copy holding only the items whose class index is in ``classes`` (``predict(classes=[...])``)."""
        return self.select(torch.isin(self.labels, torch.tensor(classes, dtype=self.labels.dtype)))


class YoloLabelFile:
    """``save_txt``: a result's ``yolo_lines`` written as a YOLO label file (what ``predict(save_txt=True)`` writes).

    The result class it is mixed into defines ``yolo_lines(save_conf)``, the lines of its own task's label format.
    """

    def save_txt(self, path: str | Path, save_conf: bool = False) -> Path:
        """Write ``yolo_lines(save_conf)`` to ``path`` (one line per box; an empty file when nothing was found)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{line}\n" for line in self.yolo_lines(save_conf)), encoding="utf-8")
        return path


@dataclass(repr=False)
class DetectionResult(YoloLabelFile, LabelledItemsResult):
    """Boxes (``n×4`` xyxy, original-image pixels), ``scores`` (n) and ``labels`` (n, int64)."""

    task: ClassVar[str] = "detect"
    geometry: ClassVar[str] = "boxes"
    items: ClassVar[str] = "detections"
    boxes: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 4))
    #: Set by ``track()``: each box's track ID (``n``, int64), and the centres it passed through lately (``n×k×2``
    #: pixels, oldest first, padded with NaN to one length), which ``plot`` draws as its trail.
    track_ids: torch.Tensor | None = None
    trails: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.track_ids is not None and len(self.track_ids) != len(self.labels):
            raise ValueError(f"a tracked result needs one track ID per box; got {len(self.track_ids)} IDs for {len(self.labels)} boxes")
        # result.boxes stays the n×4 tensor it always was, with Ultralytics' views on top (.xywh, .conf, .cls, .id...).
        self.boxes = Boxes.of(self.boxes.as_subclass(torch.Tensor), self.scores, self.labels, self.orig_shape, self.track_ids)

    def _per_item(self) -> dict[str, Any]:
        tracked = {name: value for name, value in (("track_ids", self.track_ids), ("trails", self.trails)) if value is not None}
        return {**super()._per_item(), **tracked}

    def to_dict(self) -> dict[str, Any]:
        """The boxes, scores and class names as lists, and ``ids`` (the track IDs) for a result of ``track()``."""
        return {**super().to_dict(), **({"ids": self.track_ids.tolist()} if self.track_ids is not None else {})}

    def rows(self) -> list[dict[str, Any]]:
        """One row per detection: class, name, score and the box (and ``id``, its track ID, when tracked)."""
        rows = [
            {"name": self.name, "class": int(label), "class_name": self.names.get(int(label), str(int(label))),
             "score": float(score), "x1": float(box[0]), "y1": float(box[1]), "x2": float(box[2]), "y2": float(box[3])}
            for box, score, label in zip(self.boxes.xyxy.tolist(), self.scores.tolist(), self.labels.tolist())
        ]
        if self.track_ids is not None:
            rows = [{**row, "id": int(track_id)} for row, track_id in zip(rows, self.track_ids.tolist())]
        return rows

    def _draw_boxes(self, image: torch.Tensor, line_width: int | None) -> torch.Tensor:
        """``image`` with this result's trails (when tracked) under its captioned boxes (``id:3 name score`` when tracked)."""
        labels = self.labels.tolist()
        if self.trails is not None:
            image = draw_trails(image, self.trails, labels, line_width=line_width)
        ids = self.track_ids.tolist() if self.track_ids is not None else None
        return draw_boxes(image, self.boxes.xyxy, labels, self.names, scores=self.scores.tolist(), line_width=line_width, ids=ids)

    def plot(self, line_width: int | None = None) -> np.ndarray:
        """Boxes with ``name score`` captions on a filled box in the class colour, sized to the image; a tracked result
        captions ``id:3 name score`` and draws each box's trail.

        ``line_width`` (pixels) sets the boxes' line width instead of the one chosen for the image's size.
        """
        return as_numpy_image(self._draw_boxes(self.orig_image, line_width))

    def yolo_lines(self, save_conf: bool = False) -> list[str]:
        """One line per box in the YOLO label format: ``class cx cy w h`` (normalised to the image), then the score
        with ``save_conf``; numbers written as Ultralytics' ``save_txt`` writes them (``%g``)."""
        lines = []
        for label, box, score in zip(self.labels.tolist(), self.boxes.xywhn.tolist(), self.scores.tolist()):
            values = (label, *box, score) if save_conf else (label, *box)
            lines.append(" ".join(f"{value:g}" for value in values))
        return lines

    def save_crops(self, directory: str | Path, stem: str) -> list[Path]:
        """Each box's region of the original image, saved as ``directory/<class name>/<stem>.jpg`` (``<stem>_2.jpg``...
        for the second box of a class); boxes are rounded outwards to whole pixels and clipped to the image."""
        from PIL import Image

        image = as_numpy_image(self.orig_image)
        height, width = self.orig_shape
        written: list[Path] = []
        for box, label in zip(self.boxes.xyxy.tolist(), self.labels.tolist()):
            x1, y1 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
            x2, y2 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
            if x2 <= x1 or y2 <= y1:
                continue  # a box outside the image, or of no area: nothing to crop
            folder = Path(directory) / str(self.names.get(int(label), label))
            folder.mkdir(parents=True, exist_ok=True)
            path, counter = folder / f"{stem}.jpg", 2
            while path in written or path.exists():
                path, counter = folder / f"{stem}_{counter}.jpg", counter + 1
            Image.fromarray(image[y1:y2, x1:x2]).save(path)
            written.append(path)
        return written


@dataclass(repr=False)
class InstanceSegmentationResult(DetectionResult):
    """A detection result whose every box has a mask: ``masks`` (a ``Masks``: ``.data`` ``n×H×W`` bool at the
    original size, ``.xy``/``.xyn`` polygons), given as an ``n×H×W`` bool tensor."""

    task: ClassVar[str] = "segment"
    masks: Any = field(default_factory=lambda: torch.zeros(0, 0, 0, dtype=torch.bool))

    def __post_init__(self) -> None:
        super().__post_init__()
        data = self.masks.data if isinstance(self.masks, Masks) else torch.as_tensor(self.masks)
        if data.numel() == 0 and len(self.labels) == 0:
            data = torch.zeros((0, *self.orig_shape), dtype=torch.bool)
        if data.ndim != 3 or len(data) != len(self.labels) or tuple(data.shape[-2:]) != self.orig_shape:
            raise ValueError(
                f"an instance segmentation result needs one mask of the image's size {self.orig_shape} per box; got masks of "
                f"shape {tuple(data.shape)} for {len(self.labels)} boxes"
            )
        self.masks = self.masks if isinstance(self.masks, Masks) else Masks(data)

    def _per_item(self) -> dict[str, Any]:
        return {**super()._per_item(), "masks": self.masks.data}

    def plot(self, line_width: int | None = None, alpha: float = 0.4) -> np.ndarray:
        """Each object's mask filled translucently (``alpha``) in its class colour and outlined, under its box and
        ``name score`` caption; ``line_width`` (pixels) sets the lines' width instead of the one chosen for the image."""
        filled = draw_instance_masks(self.orig_image, self.masks.data, self.labels.tolist(), alpha=alpha, line_width=line_width)
        return as_numpy_image(self._draw_boxes(filled, line_width))

    def _repr_contents(self) -> str:
        """``boxes=3, masks=3``."""
        return f"{super()._repr_contents()}, masks={len(self.masks)}"

    def to_dict(self) -> dict[str, Any]:
        """The detection's boxes, scores and classes, plus each mask's polygon (``polygons``: lists of ``[x, y]`` pixels)."""
        return {**super().to_dict(), "polygons": [polygon.tolist() for polygon in self.masks.xy]}

    def rows(self) -> list[dict[str, Any]]:
        """One row per object: the detection's columns plus its polygon (a list of ``[x, y]`` pixels)."""
        return [{**row, "polygon": polygon.tolist()} for row, polygon in zip(super().rows(), self.masks.xy)]

    def yolo_lines(self, save_conf: bool = False) -> list[str]:
        """One line per object in the YOLO segmentation label format: ``class x1 y1 x2 y2 ...`` (its polygon, normalised
        to the image), then the score with ``save_conf``; numbers as ``%g``. An object whose mask has no polygon of three
        points or more (it vanished at the original size) gets no line: a line without a polygon is no label."""
        lines = []
        for label, polygon, score in zip(self.labels.tolist(), self.masks.xyn, self.scores.tolist()):
            if len(polygon) < 3:
                continue
            values = (label, *polygon.reshape(-1).tolist(), score) if save_conf else (label, *polygon.reshape(-1).tolist())
            lines.append(" ".join(f"{value:g}" for value in values))
        return lines


class Keypoints:
    """A pose result's keypoints, Ultralytics' views of them: ``data`` (``n×K×3``: x, y in original-image pixels and
    each point's confidence), ``xy`` (``n×K×2``), ``xyn`` (divided by the image's width and height) and ``conf``
    (``n×K``)."""

    def __init__(self, data: torch.Tensor, shape: tuple[int, int]) -> None:
        if data.ndim != 3 or data.shape[-1] != 3:
            raise ValueError(f"keypoints must be n×K×3 (x, y, confidence), got shape {tuple(data.shape)}")
        self.data = data
        self.orig_shape = shape

    @property
    def xy(self) -> torch.Tensor:
        """``n×K×2`` x, y in pixels."""
        return self.data[..., :2]

    @property
    def xyn(self) -> torch.Tensor:
        """``n×K×2`` x, y divided by the image's width and height."""
        height, width = self.orig_shape
        return self.xy / self.xy.new_tensor([width, height])

    @property
    def conf(self) -> torch.Tensor:
        """``n×K`` each point's confidence (visibility)."""
        return self.data[..., 2]

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        return f"Keypoints(objects={len(self.data)}, points={self.data.shape[1]})"


@dataclass(repr=False)
class PoseResult(DetectionResult):
    """A detection result whose every box has K keypoints: ``keypoints`` (a ``Keypoints``: ``.data`` ``n×K×3``, ``.xy``,
    ``.xyn``, ``.conf``), given as an ``n×K×3`` tensor; ``skeleton`` (index pairs) joins them in the drawing."""

    task: ClassVar[str] = "pose"
    keypoints: Any = field(default_factory=lambda: torch.zeros(0, 1, 3))
    skeleton: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        data = self.keypoints.data if isinstance(self.keypoints, Keypoints) else torch.as_tensor(self.keypoints).float()
        if data.ndim != 3 or len(data) != len(self.labels):
            raise ValueError(f"a pose result needs n×K×3 keypoints for its {len(self.labels)} boxes; got shape {tuple(data.shape)}")
        self.keypoints = self.keypoints if isinstance(self.keypoints, Keypoints) else Keypoints(data, self.orig_shape)

    def _per_item(self) -> dict[str, Any]:
        return {**super()._per_item(), "keypoints": self.keypoints.data}

    def plot(self, line_width: int | None = None) -> np.ndarray:
        """Boxes with captions (``DetectionResult.plot``), each object's confident keypoints as dots and the skeleton."""
        boxed = self._draw_boxes(self.orig_image, line_width)
        return as_numpy_image(draw_keypoints(boxed, self.keypoints.data, self.labels.tolist(), self.skeleton, line_width=line_width))

    def _repr_contents(self) -> str:
        """``boxes=3, keypoints=3×17``."""
        return f"{super()._repr_contents()}, keypoints={len(self.keypoints)}×{self.keypoints.data.shape[1]}"

    def to_dict(self) -> dict[str, Any]:
        """The detection's boxes, scores and classes, plus each object's keypoints (``[x, y, confidence]`` lists)."""
        return {**super().to_dict(), "keypoints": self.keypoints.data.tolist()}

    def rows(self) -> list[dict[str, Any]]:
        """One row per object: the detection's columns plus its keypoints (a list of ``[x, y, confidence]``)."""
        return [{**row, "keypoints": points} for row, points in zip(super().rows(), self.keypoints.data.tolist())]

    def yolo_lines(self, save_conf: bool = False) -> list[str]:
        """One line per object in the YOLO pose label format: ``class cx cy w h`` then K × ``x y v`` (normalised; ``v`` the
        point's confidence), then the score with ``save_conf``; numbers as ``%g`` (Ultralytics' pose ``save_txt``)."""
        lines = []
        points = torch.cat([self.keypoints.xyn, self.keypoints.conf[..., None]], dim=-1)
        for label, box, object_points, score in zip(self.labels.tolist(), self.boxes.xywhn.tolist(), points.tolist(), self.scores.tolist()):
            values = [label, *box, *(value for point in object_points for value in point)]
            if save_conf:
                values.append(score)
            lines.append(" ".join(f"{value:g}" for value in values))
        return lines


@dataclass(repr=False)
class OrientedBoxResult(YoloLabelFile, LabelledItemsResult):
    """Oriented boxes: ``obb`` (an ``OrientedBoxes``: ``n×5`` ``cx, cy, w, h, angle`` in original-image pixels with
    ``.xywhr``, ``.xyxyxyxy``, ``.conf``, ``.cls``), ``scores`` (n) and ``labels`` (n, int64)."""

    task: ClassVar[str] = "obb"
    geometry: ClassVar[str] = "obb"
    items: ClassVar[str] = "detections"
    obb: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 5))

    def __post_init__(self) -> None:
        data = self.obb.as_subclass(torch.Tensor).reshape(-1, 5)
        if len(data) != len(self.labels) or len(data) != len(self.scores):
            raise ValueError(f"an oriented-box result needs one score and one label per box; got {len(data)} boxes, "
                             f"{len(self.scores)} scores and {len(self.labels)} labels")
        self.obb = OrientedBoxes.of(data, self.scores, self.labels, self.orig_shape)

    def to_dict(self) -> dict[str, Any]:
        """The boxes (``obb``: ``[cx, cy, w, h, angle]``), their corners (``corners``), scores and class names."""
        return {**super().to_dict(), "corners": self.obb.xyxyxyxy.tolist()}

    def rows(self) -> list[dict[str, Any]]:
        """One row per detection: class, name, score, the rotated box and its four corners."""
        return [
            {"name": self.name, "class": int(label), "class_name": self.names.get(int(label), str(int(label))),
             "score": float(score), "cx": box[0], "cy": box[1], "w": box[2], "h": box[3], "angle": box[4],
             **{f"{axis}{corner + 1}": corners[corner][position] for corner in range(4) for position, axis in enumerate("xy")}}
            for box, corners, score, label in zip(self.obb.xywhr.tolist(), self.obb.xyxyxyxy.tolist(), self.scores.tolist(),
                                                   self.labels.tolist())
        ]

    def plot(self, line_width: int | None = None) -> np.ndarray:
        """Each rotated box outlined in its class colour with a ``name score`` caption; ``line_width`` in pixels."""
        drawn = draw_rotated_boxes(self.orig_image, self.obb.xyxyxyxy, self.labels.tolist(), self.names,
                                   scores=self.scores.tolist(), line_width=line_width)
        return as_numpy_image(drawn)

    def yolo_lines(self, save_conf: bool = False) -> list[str]:
        """One line per box in the YOLO OBB label format: ``class x1 y1 x2 y2 x3 y3 x4 y4`` (corners normalised to the
        image), then the score with ``save_conf``; numbers as ``%g``, as Ultralytics' ``save_txt`` writes them."""
        lines = []
        for label, corners, score in zip(self.labels.tolist(), self.obb.xyxyxyxyn.reshape(-1, 8).tolist(), self.scores.tolist()):
            values = (label, *corners, score) if save_conf else (label, *corners)
            lines.append(" ".join(f"{value:g}" for value in values))
        return lines


@dataclass(repr=False)
class PointsResult(LabelledItemsResult):
    """Object centroids: ``points`` (``n×2`` x, y, original-image pixels), ``scores`` (n), ``labels`` (n, int64)."""

    task: ClassVar[str] = "points"
    geometry: ClassVar[str] = "points"
    items: ClassVar[str] = "points"
    points: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 2))

    def plot(self, radius: int | None = None) -> np.ndarray:
        """A filled dot per point in its class colour, outlined in white, with ``name score`` beside it.

        ``radius`` defaults to about 1.5 % of the shorter image side (at least 3 pixels).
        """
        from PIL import Image, ImageDraw

        canvas = Image.fromarray(as_numpy_image(self.orig_image))
        if len(self.points) == 0:
            return np.asarray(canvas).copy()
        height, width = self.orig_shape
        radius = radius if radius is not None else max(3, round(min(height, width) * 0.015))
        draw = ImageDraw.Draw(canvas)
        for (x, y), score, label in zip(self.points.tolist(), self.scores.tolist(), self.labels.tolist()):
            box = (x - radius, y - radius, x + radius, y + radius)
            draw.ellipse(box, fill=class_colour(int(label)), outline=(255, 255, 255), width=max(1, radius // 3))
            draw.text((x + radius + 2, y - radius), f"{self.names.get(int(label), label)} {score:.2f}", fill=class_colour(int(label)))
        return np.asarray(canvas).copy()


@dataclass(repr=False)
class ClassificationResult(Result):
    """Class probabilities ``probs`` (C), with ``top1``/``top5`` indices and ``top1_conf``."""

    task: ClassVar[str] = "classify"
    probs: torch.Tensor = field(default_factory=lambda: torch.zeros(0))

    def __post_init__(self) -> None:
        self.probs = self.probs.as_subclass(Probs)  # result.probs.top1, .top5, .top1conf as Ultralytics has them

    def rows(self) -> list[dict[str, Any]]:
        """One row per class of the top five: rank, class, name and probability."""
        return [{"name": self.name, "rank": rank, "class": index, "class_name": self.names.get(index, str(index)),
                 "probability": float(self.probs[index])} for rank, index in enumerate(self.top5, start=1)]

    @property
    def top1(self) -> int:
        """The most probable class index."""
        return int(self.probs.argmax())

    @property
    def top5(self) -> list[int]:
        """Up to five class indices, most probable first."""
        return self.probs.topk(min(5, len(self.probs))).indices.tolist()

    @property
    def top1_conf(self) -> float:
        """The probability of ``top1``."""
        return float(self.probs.max())

    def plot(self) -> np.ndarray:
        """The image with its top-5 classes and probabilities written in the corner."""
        lines = [f"{self.names.get(index, index)} {float(self.probs[index]):.2f}" for index in self.top5]
        return as_numpy_image(draw_caption(self.orig_image, lines))

    def _repr_contents(self) -> str:
        """``classes=1000, top1='cat' 0.93``."""
        if len(self.probs) == 0:
            return "classes=0"
        return f"classes={len(self.probs)}, top1={str(self.names.get(self.top1, self.top1))!r} {self.top1_conf:.2f}"

    def summary(self) -> str:
        """``name: cat 0.93, dog 0.05, ...``."""
        return f"{self.name}: " + ", ".join(f"{self.names.get(index, index)} {float(self.probs[index]):.2f}" for index in self.top5)

    def to_dict(self) -> dict[str, Any]:
        """Top-1/top-5 and every probability."""
        return {
            **super().to_dict(),
            "top1": self.top1,
            "top1_name": self.names.get(self.top1, str(self.top1)),
            "top1_conf": self.top1_conf,
            "top5": self.top5,
            "probs": self.probs.tolist(),
        }


@dataclass(repr=False)
class SegmentationResult(Result):
    """``mask``: ``H×W`` int64 class index per pixel at the original size."""

    task: ClassVar[str] = "semantic"
    mask: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.long))

    @property
    def classes(self) -> list[int]:
        """The class indices present in ``mask``, in order."""
        return [int(value) for value in torch.unique(self.mask)]

    @property
    def masks(self) -> torch.Tensor:
        """One boolean ``H×W`` mask per class in ``classes`` (stacked: ``len(classes)×H×W``)."""
        return torch.stack([self.mask == value for value in self.classes]) if self.mask.numel() else torch.zeros(0, 0, 0, dtype=torch.bool)

    def rows(self) -> list[dict[str, Any]]:
        """One row per class present: its name and share of the pixels."""
        return [{"name": self.name, "class_name": class_name, "pixel_share": share}
                for class_name, share in self.to_dict()["class_pixel_share"].items()]

    def plot(self, alpha: float = 0.5) -> np.ndarray:
        """The image with every predicted class overlaid in its colour."""
        return as_numpy_image(draw_mask(self.orig_image, self.mask, alpha=alpha))

    def _repr_contents(self) -> str:
        """``mask=480×640, classes=3`` (the classes present)."""
        return f"mask={'×'.join(str(side) for side in self.mask.shape)}, classes={len(self.classes)}"

    def summary(self) -> str:
        """``name: road 62%, car 8%, ...`` (share of pixels per class)."""
        values, counts = torch.unique(self.mask, return_counts=True)
        total = float(self.mask.numel())
        order = counts.argsort(descending=True)
        parts = [f"{self.names.get(int(values[i]), int(values[i]))} {100 * float(counts[i]) / total:.0f}%" for i in order]
        return f"{self.name}: " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Pixel share per class name (the mask itself is ``mask``)."""
        values, counts = torch.unique(self.mask, return_counts=True)
        shares = {str(self.names.get(int(v), int(v))): float(c) / self.mask.numel() for v, c in zip(values, counts)}
        return {**super().to_dict(), "class_pixel_share": shares}


@dataclass(repr=False)
class RestorationResult(Result):
    """``image``: the restored uint8 ``3×H×W`` image at the original size."""

    task: ClassVar[str] = "restore"
    image: torch.Tensor = field(default_factory=lambda: torch.zeros(3, 0, 0, dtype=torch.uint8))

    def plot(self) -> np.ndarray:
        """The restored image."""
        return as_numpy_image(self.image)

    def _repr_contents(self) -> str:
        """``restored=3×480×640``."""
        return f"restored={'×'.join(str(side) for side in self.image.shape)}"

    def summary(self) -> str:
        """``name: restored 640×480``."""
        height, width = self.orig_shape
        return f"{self.name}: restored {width}×{height}"
