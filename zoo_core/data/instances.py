"""Object instances: a box and the region it bounds (polygons or a COCO run-length encoding).

The readers of instance data (YOLO segmentation labels, ``zoo_core.data.yolo_format``; COCO
instance JSON, ``zoo_core.data.coco_format``) return ``InstanceRecord`` s: a ``DetectionRecord``
whose every box row has an ``InstanceShape`` and a crowd flag. The segment task rasterises the
shapes into masks; the detect task reads the same records and uses the boxes only.

Rasterising goes through pycocotools, so a polygon covers exactly the pixels COCO's own tools
(and its mask mAP) give it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zoo_core.data.yolo_format import DetectionRecord

__all__ = ["InstanceShape", "InstanceRecord", "polygons_box", "mask_to_rle", "mask_outline"]


@dataclass(frozen=True)
class InstanceShape:
    """One object's region: ``polygons`` (each a k×2 float32 array of ``x, y`` normalised to the image, k ≥ 3;
    several when the object is in pieces) or ``rle`` (COCO's run-length encoding of a mask of the image's
    size, ``{"size": [h, w], "counts": ...}``, compressed or not). Exactly one of the two is given."""

    polygons: tuple[np.ndarray, ...] = ()
    rle: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if bool(self.polygons) == (self.rle is not None):
            raise ValueError("an InstanceShape has either polygons or an rle, not both and not neither")

    def rasterise(self, height: int, width: int) -> np.ndarray:
        """The region as a ``height×width`` bool mask (COCO's rasterisation of polygons)."""
        from pycocotools import mask as mask_utils

        if self.rle is not None:
            rle = self.rle
            if isinstance(rle.get("counts"), list):  # uncompressed, as COCO JSON writes iscrowd regions
                rle = mask_utils.frPyObjects(rle, *rle["size"])
            decoded = mask_utils.decode(rle).astype(bool)
            if decoded.shape != (height, width):
                raise ValueError(f"an RLE mask of size {decoded.shape} does not fit an image of {(height, width)}")
            return decoded
        scale = np.array([width, height], dtype=np.float64)
        rings = [(polygon.astype(np.float64) * scale).reshape(-1).tolist() for polygon in self.polygons]
        encoded = mask_utils.merge(mask_utils.frPyObjects(rings, height, width))
        return mask_utils.decode(encoded).astype(bool)


@dataclass
class InstanceRecord(DetectionRecord):
    """One usable image, its boxes (``labels``: n×5 float32 ``class, x1, y1, x2, y2`` normalised), one
    ``InstanceShape`` per box row and ``crowd`` (n bool: COCO's ``iscrowd`` regions, which training
    leaves out and the metric ignores, as COCO's evaluation does)."""

    shapes: list[InstanceShape] = field(default_factory=list)
    crowd: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.labels) or len(self.crowd) != len(self.labels):
            raise ValueError(
                f"{self.image}: {len(self.labels)} boxes but {len(self.shapes)} shapes and {len(self.crowd)} crowd flags"
            )


def polygons_box(polygons: tuple[np.ndarray, ...] | list[np.ndarray]) -> np.ndarray:
    """The ``x1, y1, x2, y2`` box (float32, same units as the points) around every point of ``polygons``."""
    points = np.concatenate([np.asarray(polygon, dtype=np.float32).reshape(-1, 2) for polygon in polygons])
    return np.concatenate([points.min(axis=0), points.max(axis=0)]).astype(np.float32)


def _closest_points(ring: np.ndarray, piece: np.ndarray) -> tuple[int, int]:
    """The indices of the closest pair of points, one of ``ring`` and one of ``piece``."""
    distances = ((ring[:, None, :] - piece[None, :, :]) ** 2).sum(axis=-1)
    first, second = np.unravel_index(int(np.argmin(distances)), distances.shape)
    return int(first), int(second)


def mask_outline(mask: np.ndarray) -> np.ndarray | None:
    """One polygon (k×2 float32 ``x, y`` in pixels) whose COCO rasterisation is ``mask`` (H×W bool), or ``None`` if empty.

    The outline is traced (OpenCV ``findContours``) on the mask upsampled twice and its points snapped to the
    nearest pixel corners, so they lie on the pixel edges: the polygon's extent is the mask's exact box and
    pycocotools' rasterisation gives the pixels back (a contour through pixel centres, as tracing the mask
    itself gives, loses half a pixel all round). An object in several
    pieces, or with holes (an occluder inside it), becomes one ring: each further piece or hole is joined to
    the ring by a zero-width bridge between their closest points, as Ultralytics' COCO converter merges an
    object's segments (YOLO's format holds one polygon per object); the bridges cover no area.
    """
    import cv2

    mask = np.asarray(mask, dtype=bool)
    rows, columns = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if not len(rows):
        return None
    top, left = int(rows[0]), int(columns[0])  # traced in the object's box only: a whole image upsampled is slow
    crop = mask[top: int(rows[-1]) + 1, left: int(columns[-1]) + 1].astype(np.uint8)
    upsampled = np.pad(crop.repeat(2, axis=0).repeat(2, axis=1), 1)  # the margin: a contour must not touch the border
    contours, _ = cv2.findContours(upsampled, cv2.RETR_CCOMP, cv2.CHAIN_APPROX_SIMPLE)
    # an upsampled boundary pixel u has its centre at (u + 0.5) / 2, a quarter pixel inside its pixel's edge
    origin = np.array([left, top], dtype=np.float64)
    rings = [np.round((contour.reshape(-1, 2).astype(np.float64) - 1 + 0.5) / 2) + origin for contour in contours]
    if not rings:
        return None
    rings.sort(key=len, reverse=True)
    outline = rings[0]
    for piece in rings[1:]:
        at, start = _closest_points(outline, piece)
        rotated = np.roll(piece, -start, axis=0)
        # out along the bridge, round the piece back to its first point, and back along the bridge
        outline = np.concatenate([outline[: at + 1], rotated, rotated[:1], outline[at:]])
    repeated = np.all(outline == np.roll(outline, 1, axis=0), axis=1)  # snapping can land two points on one corner
    if repeated.all():
        repeated[0] = False
    return outline[~repeated].astype(np.float32)


def mask_to_rle(mask: np.ndarray) -> dict[str, Any]:
    """An ``H×W`` mask as COCO's compressed run-length encoding (``{"size": [h, w], "counts": bytes}``)."""
    from pycocotools import mask as mask_utils

    return mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
