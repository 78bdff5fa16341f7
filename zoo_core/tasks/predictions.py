"""Prediction results: one object per image, in original-image coordinates, that can draw itself.

``LibreYOLO.predict`` returns a list of these. Every result has ``orig_image`` (uint8 ``3×H×W``
RGB tensor), ``path`` (the file, or ``None`` for in-memory images), ``name``, ``names``,
``plot()`` (an ``H×W×3`` uint8 RGB NumPy array with the prediction drawn), ``save(path)``,
``summary()`` (one line) and ``to_dict()`` (plain data). ``save_path`` is set when
``predict(save=True)`` wrote the drawing.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

__all__ = ["Result", "DetectionResult", "ClassificationResult", "SegmentationResult", "RestorationResult", "class_colour"]


def class_colour(index: int) -> tuple[int, int, int]:
    """A distinct, stable RGB colour for class ``index`` (golden-ratio steps around the hue circle)."""
    hue = (index * 0.618033988749895 + 0.1) % 1.0
    red, green, blue = colorsys.hsv_to_rgb(hue, 0.8, 0.95)
    return int(red * 255), int(green * 255), int(blue * 255)


def _to_numpy_image(image: torch.Tensor) -> np.ndarray:
    return image.detach().cpu().permute(1, 2, 0).contiguous().numpy()


@dataclass
class Result:
    """What every prediction result has: the original image, where it came from, the class names."""

    task: ClassVar[str] = ""
    orig_image: torch.Tensor
    path: Path | None
    name: str
    names: dict[int, str]
    save_path: Path | None = field(default=None, init=False)

    @property
    def orig_shape(self) -> tuple[int, int]:
        """``(height, width)`` of the original image."""
        return int(self.orig_image.shape[-2]), int(self.orig_image.shape[-1])

    def plot(self) -> np.ndarray:
        """The original image with the prediction drawn, ``H×W×3`` uint8 RGB."""
        return _to_numpy_image(self.orig_image)

    def save(self, path: str | Path) -> Path:
        """Write ``plot()`` to ``path`` (format from the suffix) and return the path."""
        from PIL import Image

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(self.plot()).save(path)
        return path

    def summary(self) -> str:
        """One line describing the prediction."""
        return self.name

    def to_dict(self) -> dict[str, Any]:
        """The prediction as plain Python data (JSON-friendly)."""
        return {"name": self.name, "path": str(self.path) if self.path else None, "shape": list(self.orig_shape)}


@dataclass
class DetectionResult(Result):
    """Boxes (``n×4`` xyxy, original-image pixels), ``scores`` (n) and ``labels`` (n, int64)."""

    task: ClassVar[str] = "detect"
    boxes: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 4))
    scores: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    labels: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    def plot(self) -> np.ndarray:
        """Boxes with ``name score`` captions, one colour per class."""
        from torchvision.utils import draw_bounding_boxes

        if len(self.boxes) == 0:
            return _to_numpy_image(self.orig_image)
        labels = [int(label) for label in self.labels]
        captions = [f"{self.names.get(label, label)} {float(score):.2f}" for label, score in zip(labels, self.scores)]
        drawn = draw_bounding_boxes(
            self.orig_image, self.boxes.float(), labels=captions, colors=[class_colour(label) for label in labels], width=2
        )
        return _to_numpy_image(drawn)

    def summary(self) -> str:
        """``name: 2 circle, 1 square`` (or ``no detections``)."""
        if len(self.labels) == 0:
            return f"{self.name}: no detections"
        counts: dict[str, int] = {}
        for label in self.labels.tolist():
            class_name = str(self.names.get(int(label), label))
            counts[class_name] = counts.get(class_name, 0) + 1
        return f"{self.name}: " + ", ".join(f"{count} {class_name}" for class_name, count in counts.items())

    def to_dict(self) -> dict[str, Any]:
        """Boxes, scores and class names as lists."""
        return {
            **super().to_dict(),
            "boxes": self.boxes.tolist(),
            "scores": self.scores.tolist(),
            "labels": self.labels.tolist(),
            "classes": [self.names.get(int(label), str(label)) for label in self.labels.tolist()],
        }


@dataclass
class ClassificationResult(Result):
    """Class probabilities ``probs`` (C), with ``top1``/``top5`` indices and ``top1_conf``."""

    task: ClassVar[str] = "classify"
    probs: torch.Tensor = field(default_factory=lambda: torch.zeros(0))

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
        from PIL import Image, ImageDraw

        canvas = Image.fromarray(_to_numpy_image(self.orig_image))
        draw = ImageDraw.Draw(canvas)
        lines = [f"{self.names.get(index, index)} {float(self.probs[index]):.2f}" for index in self.top5]
        top = 2
        for line in lines:
            left, upper, right, lower = draw.textbbox((4, top), line)
            draw.rectangle((left - 2, upper - 1, right + 2, lower + 1), fill=(0, 0, 0))
            draw.text((4, top), line, fill=(255, 255, 255))
            top = lower + 3
        return np.asarray(canvas).copy()

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


@dataclass
class SegmentationResult(Result):
    """``mask``: ``H×W`` int64 class index per pixel at the original size."""

    task: ClassVar[str] = "semantic"
    mask: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.long))

    def plot(self, alpha: float = 0.5) -> np.ndarray:
        """The image with every predicted class overlaid in its colour."""
        from torchvision.utils import draw_segmentation_masks

        present = [int(value) for value in torch.unique(self.mask)]
        masks = torch.stack([self.mask == value for value in present])
        drawn = draw_segmentation_masks(self.orig_image, masks, alpha=alpha, colors=[class_colour(value) for value in present])
        return _to_numpy_image(drawn)

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


@dataclass
class RestorationResult(Result):
    """``image``: the restored uint8 ``3×H×W`` image at the original size."""

    task: ClassVar[str] = "restore"
    image: torch.Tensor = field(default_factory=lambda: torch.zeros(3, 0, 0, dtype=torch.uint8))

    def plot(self) -> np.ndarray:
        """The restored image."""
        return _to_numpy_image(self.image)

    def summary(self) -> str:
        """``name: restored 640×480``."""
        height, width = self.orig_shape
        return f"{self.name}: restored {width}×{height}"
