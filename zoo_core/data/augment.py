"""Geometric and photometric augmentation shared by the tasks (torchvision.transforms.v2).

Boxes travel as ``tv_tensors.BoundingBoxes`` (xyxy, float, ``clamping_mode=None`` so a transform
never clips silently: clipping, and dropping boxes that lost most of their area, happen once at
the end in ``keep_visible_boxes``) and masks as ``tv_tensors.Mask``, so every geometric transform
moves pixels, boxes and masks together. Images stay uint8 ``3×H×W``.

Randomness comes only from Python's ``random`` and torch's global RNG (the v2 transforms), which
the engine seeds per rank and per epoch (E10, docs/architecture.md).

Letterbox information is ``((ratio_x, ratio_y), (pad_left, pad_top))``: a pixel ``x`` of the
original image lands at ``x * ratio_x + pad_left`` in the network input (the Ultralytics
``ratio_pad`` convention).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

if TYPE_CHECKING:
    from zoo_core.tasks.base import AugmentSettings

__all__ = [
    "PAD_VALUE",
    "RatioPad",
    "make_boxes",
    "resize_long_side",
    "letterbox",
    "boxes_to_original",
    "map_to_original",
    "mosaic4",
    "random_affine",
    "color_jitter",
    "keep_visible_boxes",
    "apply_v2",
]

PAD_VALUE = 114  # the grey Ultralytics pads letterboxes and mosaics with
RatioPad = tuple[tuple[float, float], tuple[float, float]]


def make_boxes(boxes: torch.Tensor | Sequence[Sequence[float]], canvas_size: tuple[int, int]) -> tv_tensors.BoundingBoxes:
    """xyxy float boxes on a canvas ``(height, width)`` that v2 transforms move but never clip."""
    data = torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    return tv_tensors.BoundingBoxes(data, format="XYXY", canvas_size=canvas_size, clamping_mode=None)


def resize_long_side(
    image: torch.Tensor,
    size: int,
    boxes: tv_tensors.BoundingBoxes | None = None,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tv_tensors.BoundingBoxes | None, torch.Tensor | None, tuple[float, float]]:
    """Resize so the longer side is ``size`` (aspect kept); returns the per-axis ratios too."""
    height, width = image.shape[-2:]
    gain = size / max(height, width)
    new_height, new_width = max(round(height * gain), 1), max(round(width * gain), 1)
    ratios = (new_width / width, new_height / height)
    if (new_height, new_width) == (height, width):
        return image, boxes, mask, ratios
    image = F.resize(tv_tensors.Image(image), [new_height, new_width], antialias=True).as_subclass(torch.Tensor)
    if boxes is not None:
        boxes = F.resize(boxes, [new_height, new_width])
    if mask is not None:
        mask = F.resize(tv_tensors.Mask(mask), [new_height, new_width]).as_subclass(torch.Tensor)
    return image, boxes, mask, ratios


def letterbox(
    image: torch.Tensor,
    size: int,
    boxes: tv_tensors.BoundingBoxes | None = None,
    mask: torch.Tensor | None = None,
    mask_fill: int = 255,
) -> tuple[torch.Tensor, tv_tensors.BoundingBoxes | None, torch.Tensor | None, RatioPad]:
    """Resize the longer side to ``size`` and pad to ``size×size`` (centred, grey; masks with ``mask_fill``)."""
    image, boxes, mask, ratios = resize_long_side(image, size, boxes, mask)
    height, width = image.shape[-2:]
    pad_left, pad_top = (size - width) // 2, (size - height) // 2
    padding = [pad_left, pad_top, size - width - pad_left, size - height - pad_top]
    if any(padding):
        image = F.pad(image, padding, fill=PAD_VALUE)
        if boxes is not None:
            boxes = F.pad(boxes, padding)
        if mask is not None:
            mask = F.pad(tv_tensors.Mask(mask), padding, fill=mask_fill).as_subclass(torch.Tensor)
    return image, boxes, mask, (ratios, (float(pad_left), float(pad_top)))


def boxes_to_original(boxes: torch.Tensor, ratio_pad: RatioPad, original_shape: tuple[int, int]) -> torch.Tensor:
    """Map xyxy boxes from letterboxed input pixels back to the original image, clipped to it."""
    (ratio_x, ratio_y), (pad_left, pad_top) = ratio_pad
    height, width = original_shape
    mapped = boxes.clone().float()
    mapped[:, [0, 2]] = ((mapped[:, [0, 2]] - pad_left) / ratio_x).clamp(0, width)
    mapped[:, [1, 3]] = ((mapped[:, [1, 3]] - pad_top) / ratio_y).clamp(0, height)
    return mapped


def map_to_original(values: torch.Tensor, ratio_pad: RatioPad, original_shape: tuple[int, int]) -> torch.Tensor:
    """Crop the letterbox padding off a ``C×S×S`` map (logits, an image) and resize it to the original size."""
    (ratio_x, ratio_y), (pad_left, pad_top) = ratio_pad
    height, width = original_shape
    left, top = int(pad_left), int(pad_top)
    inner_width, inner_height = max(round(width * ratio_x), 1), max(round(height * ratio_y), 1)
    cropped = values[:, top : top + inner_height, left : left + inner_width]
    if tuple(cropped.shape[-2:]) == (height, width):
        return cropped
    return torch.nn.functional.interpolate(cropped[None].float(), size=(height, width), mode="bilinear", align_corners=False)[0]


def mosaic4(
    pieces: Sequence[tuple[torch.Tensor, tv_tensors.BoundingBoxes, torch.Tensor]],
    size: int,
) -> tuple[torch.Tensor, tv_tensors.BoundingBoxes, torch.Tensor]:
    """Four (image, boxes, classes) pieces around a random centre of a grey ``2size×2size`` canvas.

    Each piece should already have its longer side at ``size``. Piece 0 goes top-left of the
    centre, then top-right, bottom-left, bottom-right; parts falling off the canvas are cut (their
    boxes keep unclipped coordinates, so ``keep_visible_boxes`` can judge how much remains).
    """
    if len(pieces) != 4:
        raise ValueError(f"mosaic4 needs 4 pieces, got {len(pieces)}")
    canvas_size = 2 * size
    canvas = torch.full((3, canvas_size, canvas_size), PAD_VALUE, dtype=torch.uint8)
    centre_x = int(random.uniform(size * 0.5, size * 1.5))
    centre_y = int(random.uniform(size * 0.5, size * 1.5))
    all_boxes, all_classes = [], []
    for position, (image, boxes, classes) in enumerate(pieces):
        height, width = image.shape[-2:]
        left = centre_x - width if position in (0, 2) else centre_x
        top = centre_y - height if position in (0, 1) else centre_y
        # the visible part of the piece, in canvas and in piece coordinates
        x1, y1 = max(left, 0), max(top, 0)
        x2, y2 = min(left + width, canvas_size), min(top + height, canvas_size)
        if x2 > x1 and y2 > y1:
            canvas[:, y1:y2, x1:x2] = image[:, y1 - top : y2 - top, x1 - left : x2 - left]
        shifted = boxes.as_subclass(torch.Tensor) + torch.tensor([left, top, left, top], dtype=torch.float32)
        all_boxes.append(shifted)
        all_classes.append(classes)
    boxes = make_boxes(torch.cat(all_boxes), (canvas_size, canvas_size))
    return canvas, boxes, torch.cat(all_classes)


def random_affine(
    settings: "AugmentSettings",
    translate_fraction: float | None = None,
    mask_fill: int = 255,
) -> v2.RandomAffine | None:
    """The v2 random rotation/scale/translation of ``settings`` (``None`` when all are zero).

    ``translate_fraction`` overrides ``settings.translate`` (a mosaic canvas is twice the output,
    so its translation fraction is halved to move the output by the same share).
    """
    translate = settings.translate if translate_fraction is None else translate_fraction
    if not (settings.degrees or translate or settings.scale):
        return None
    return v2.RandomAffine(
        degrees=settings.degrees,
        translate=(translate, translate) if translate else None,
        scale=(1.0 - settings.scale, 1.0 + settings.scale) if settings.scale else None,
        interpolation=v2.InterpolationMode.BILINEAR,
        fill={tv_tensors.Image: PAD_VALUE, tv_tensors.Mask: mask_fill},
    )


def color_jitter(settings: "AugmentSettings") -> v2.ColorJitter | None:
    """HSV jitter as v2 ``ColorJitter``: hue ±``hsv_h`` of the colour circle, saturation and value gains ±``hsv_s``/``hsv_v``."""
    if not (settings.hsv_h or settings.hsv_s or settings.hsv_v):
        return None
    return v2.ColorJitter(brightness=settings.hsv_v or None, saturation=settings.hsv_s or None, hue=min(settings.hsv_h, 0.5) or None)


def keep_visible_boxes(
    boxes: torch.Tensor,
    classes: torch.Tensor,
    canvas_size: tuple[int, int],
    min_size: float = 2.0,
    min_visible: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip unclipped boxes to the canvas; drop those under ``min_size`` pixels or with less than ``min_visible`` of their area left."""
    boxes = boxes.as_subclass(torch.Tensor).float()
    height, width = canvas_size
    area_before = (boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)
    clipped = boxes.clone()
    clipped[:, [0, 2]] = clipped[:, [0, 2]].clamp(0, width)
    clipped[:, [1, 3]] = clipped[:, [1, 3]].clamp(0, height)
    box_width, box_height = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
    area_after = box_width * box_height
    keep = (box_width >= min_size) & (box_height >= min_size) & (area_after >= min_visible * area_before.clamp(min=1e-9))
    return clipped[keep], classes[keep]


def apply_v2(transform: Any, image: torch.Tensor, *others: Any) -> tuple[Any, ...]:
    """Run a v2 transform on a plain uint8 image plus boxes/masks; return plain tensors for images."""
    outputs = transform(tv_tensors.Image(image), *others)
    if not others:
        outputs = (outputs,)
    return (outputs[0].as_subclass(torch.Tensor), *outputs[1:])
