"""Geometric and photometric augmentation shared by the tasks (torchvision.transforms.v2).

Boxes travel as ``tv_tensors.BoundingBoxes`` (xyxy, float, ``clamping_mode=None`` so a transform
never clips silently: clipping, and dropping boxes that lost most of their area, happen once at
the end in ``keep_visible_boxes``) and masks as ``tv_tensors.Mask``, so every geometric transform
moves pixels, boxes and masks together. Images stay uint8 ``3×H×W``.

Randomness comes only from Python's ``random`` and torch's global RNG (the v2 transforms), which
the engine seeds per rank and per epoch (E10, docs/architecture.md).

How an image is fitted to the network's input before augmentation (the family's letterbox or
stretch) is ``zoo_core/data/input_pipeline.py``; a mosaic scales its pieces by their longer side
(``resize_long_side``).

Instance masks (the segment task) are ``n×H×W`` uint8 stacks, one plane per object, moved by the
same transforms with nearest-neighbour sampling and filled with 0 where nothing was; after the
last geometric transform ``keep_visible_instances`` re-derives each box from its mask (so a
rotated object keeps a tight box, as Ultralytics derives boxes from its warped polygons) and
drops the objects whose mask vanished.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any, Sequence

import cv2
import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

if TYPE_CHECKING:
    from zoo_core.tasks.base import AugmentSettings

__all__ = [
    "PAD_VALUE",
    "make_boxes",
    "resize_long_side",
    "mosaic4",
    "RandomWarp",
    "RandomHSV",
    "warp_boxes",
    "pixel_index_matrix",
    "random_affine",
    "color_jitter",
    "keep_visible_boxes",
    "boxes_from_masks",
    "keep_visible_instances",
    "apply_v2",
]

# OpenCV's own thread pool would oversubscribe the cores the ranks and loader workers already
# share, and a pool started before a loader worker forks can leave the worker hanging.
cv2.setNumThreads(0)

PAD_VALUE = 114  # the grey Ultralytics pads letterboxes and mosaics with


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
    """Resize so the longer side is ``size`` (aspect kept); returns the per-axis ratios too.

    ``mask`` (``H×W`` or an ``n×H×W`` stack of instance masks, possibly empty) is resized by nearest neighbour.
    """
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
        if mask.numel() == 0:  # an image without objects: torch cannot interpolate an empty stack
            mask = mask.new_zeros((*mask.shape[:-2], new_height, new_width))
        else:
            # NEAREST_EXACT samples at pixel centres, as the image's resize does; NEAREST would shift the mask by up to half a pixel.
            mask = F.resize(tv_tensors.Mask(mask), [new_height, new_width],
                            interpolation=v2.InterpolationMode.NEAREST_EXACT).as_subclass(torch.Tensor)
    return image, boxes, mask, ratios


def mosaic4(
    pieces: Sequence[tuple[torch.Tensor, tv_tensors.BoundingBoxes, torch.Tensor]],
    size: int,
    masks: Sequence[torch.Tensor] | None = None,
) -> Any:
    """Four (image, boxes, classes) pieces around a random centre of a grey ``2size×2size`` canvas.

    Each piece should already have its longer side at ``size``. Piece 0 goes top-left of the
    centre, then top-right, bottom-left, bottom-right; parts falling off the canvas are cut (their
    boxes keep unclipped coordinates, so ``keep_visible_boxes`` can judge how much remains).

    Returns ``(canvas, boxes, classes)``; with ``masks`` (one ``n_i×h×w`` instance-mask stack per
    piece, of the piece's size) also the ``n×2size×2size`` canvas masks, the pieces' masks placed
    exactly as their pixels: ``(canvas, boxes, classes, canvas_masks)``.
    """
    if len(pieces) != 4:
        raise ValueError(f"mosaic4 needs 4 pieces, got {len(pieces)}")
    if masks is not None and len(masks) != 4:
        raise ValueError(f"mosaic4 needs one mask stack per piece, got {len(masks)} for 4 pieces")
    canvas_size = 2 * size
    canvas = torch.full((3, canvas_size, canvas_size), PAD_VALUE, dtype=torch.uint8)
    all_masks = []
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
        if masks is not None:
            piece_masks = masks[position]
            placed = piece_masks.new_zeros((len(piece_masks), canvas_size, canvas_size))
            if x2 > x1 and y2 > y1:
                placed[:, y1:y2, x1:x2] = piece_masks[:, y1 - top : y2 - top, x1 - left : x2 - left]
            all_masks.append(placed)
        shifted = boxes.as_subclass(torch.Tensor) + torch.tensor([left, top, left, top], dtype=torch.float32)
        all_boxes.append(shifted)
        all_classes.append(classes)
    boxes = make_boxes(torch.cat(all_boxes), (canvas_size, canvas_size))
    if masks is not None:
        return canvas, boxes, torch.cat(all_classes), torch.cat(all_masks)
    return canvas, boxes, torch.cat(all_classes)


class RandomWarp(v2.Transform):
    """One random affine warp (rotation, scale, translation) of an image with its boxes and masks.

    A v2 transform (``tv_tensors`` in and out) whose kernels are OpenCV's on uint8: the whole
    warp is one matrix applied once, and ``output_size`` folds a centre crop into that matrix, so
    a mosaic canvas twice the input size is warped straight to the input size. (torchvision's own
    ``RandomAffine`` resamples the full canvas in float, then the crop throws three quarters away;
    docs/performance.md has the figures.)

    Parameters follow ``v2.RandomAffine``: an angle uniform in ``±degrees``, a scale uniform in
    ``1 ± scale``, a shift uniform in ``±translate`` of the output's width and height, all around
    the centre. Boxes are the enclosing boxes of their warped corners, unclipped (see
    ``keep_visible_boxes``); masks use nearest-neighbour and ``mask_fill``.
    """

    def __init__(
        self,
        degrees: float = 0.0,
        translate: float = 0.0,
        scale: float = 0.0,
        output_size: tuple[int, int] | None = None,
        fill: int = PAD_VALUE,
        mask_fill: int = 255,
    ) -> None:
        super().__init__()
        self.degrees, self.translate, self.scale = float(degrees), float(translate), float(scale)
        self.output_size = output_size
        self.fill, self.mask_fill = fill, mask_fill

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = v2.query_size(flat_inputs)
        output_height, output_width = self.output_size or (height, width)

        def uniform(spread: float) -> float:  # torch's RNG, which the engine seeds (E10)
            return float(torch.empty(()).uniform_(-spread, spread)) if spread else 0.0

        angle = math.radians(uniform(self.degrees))
        gain = 1.0 + uniform(self.scale)
        shift_x, shift_y = uniform(self.translate) * output_width, uniform(self.translate) * output_height
        cosine, sine = gain * math.cos(angle), gain * math.sin(angle)
        # input centre -> origin, rotate and scale, -> output centre plus the shift
        centre_x, centre_y = width / 2, height / 2
        matrix = np.array(
            [
                [cosine, sine, output_width / 2 + shift_x - cosine * centre_x - sine * centre_y],
                [-sine, cosine, output_height / 2 + shift_y + sine * centre_x - cosine * centre_y],
            ],
            dtype=np.float64,
        )
        return {"matrix": matrix, "output_size": (output_height, output_width)}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        matrix, (height, width) = params["matrix"], params["output_size"]
        if isinstance(inpt, tv_tensors.BoundingBoxes):
            return tv_tensors.wrap(warp_boxes(inpt.as_subclass(torch.Tensor), matrix), like=inpt, canvas_size=(height, width))
        # The matrix maps continuous coordinates (pixel i spans i..i+1, as boxes count); OpenCV maps pixel indices
        # (pixel i's centre at i): the same warp on indices keeps pixels, masks and boxes on one another.
        matrix = pixel_index_matrix(matrix)
        if isinstance(inpt, tv_tensors.Mask):
            warped = _warp_planes(inpt.as_subclass(torch.Tensor), matrix, (height, width), cv2.INTER_NEAREST, self.mask_fill)
            return tv_tensors.wrap(warped, like=inpt)
        if isinstance(inpt, tv_tensors.Image) or F.is_pure_tensor(inpt):
            warped = _warp_planes(inpt.as_subclass(torch.Tensor), matrix, (height, width), cv2.INTER_LINEAR, self.fill)
            return tv_tensors.wrap(warped, like=inpt) if isinstance(inpt, tv_tensors.Image) else warped
        return inpt


class RandomHSV(v2.Transform):
    """Random hue shift and saturation and value gains of uint8 RGB images, through lookup tables.

    The hue moves by a fraction uniform in ``±hue`` of the colour circle; saturation and value
    are multiplied by gains uniform in ``1 ± saturation`` and ``1 ± value``. One colour-space round
    trip and three 256-entry tables per image (OpenCV), where v2 ``ColorJitter`` computes every
    pixel in float, an order of magnitude slower (docs/performance.md). Other inputs pass unchanged.
    """

    def __init__(self, hue: float = 0.0, saturation: float = 0.0, value: float = 0.0) -> None:
        super().__init__()
        self.hue, self.saturation, self.value = min(float(hue), 0.5), float(saturation), float(value)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        hue, saturation, value = (float(draw) for draw in torch.empty(3).uniform_(-1.0, 1.0))
        return {"hue_shift": hue * self.hue, "saturation_gain": 1.0 + saturation * self.saturation,
                "value_gain": 1.0 + value * self.value}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if not (isinstance(inpt, tv_tensors.Image) or F.is_pure_tensor(inpt)):
            return inpt
        image = inpt.as_subclass(torch.Tensor)
        if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
            raise ValueError(f"RandomHSV takes uint8 RGB images (3×H×W), got {image.dtype} {tuple(image.shape)}")
        levels = np.arange(256, dtype=np.float64)
        # OpenCV's 8-bit hue runs 0..179 (two degrees a step)
        hue_table = np.mod(levels + params["hue_shift"] * 180.0, 180.0).astype(np.uint8)
        saturation_table = np.clip(levels * params["saturation_gain"], 0, 255).astype(np.uint8)
        value_table = np.clip(levels * params["value_gain"], 0, 255).astype(np.uint8)
        hue, saturation, value = cv2.split(cv2.cvtColor(_to_planes_last(image), cv2.COLOR_RGB2HSV))
        hsv = cv2.merge((cv2.LUT(hue, hue_table), cv2.LUT(saturation, saturation_table), cv2.LUT(value, value_table)))
        jittered = torch.from_numpy(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)).permute(2, 0, 1).contiguous()
        return tv_tensors.wrap(jittered, like=inpt) if isinstance(inpt, tv_tensors.Image) else jittered


def warp_boxes(boxes: torch.Tensor, matrix: np.ndarray) -> torch.Tensor:
    """xyxy boxes through a 2×3 affine ``matrix``: the enclosing box of each box's four warped corners."""
    if not len(boxes):
        return boxes.reshape(0, 4).float()
    x1, y1, x2, y2 = boxes.float().unbind(-1)
    corners_x = torch.stack([x1, x2, x2, x1], dim=-1)
    corners_y = torch.stack([y1, y1, y2, y2], dim=-1)
    affine = torch.as_tensor(matrix, dtype=torch.float32)
    warped_x = affine[0, 0] * corners_x + affine[0, 1] * corners_y + affine[0, 2]
    warped_y = affine[1, 0] * corners_x + affine[1, 1] * corners_y + affine[1, 2]
    return torch.stack([warped_x.amin(-1), warped_y.amin(-1), warped_x.amax(-1), warped_y.amax(-1)], dim=-1)


def pixel_index_matrix(matrix: np.ndarray) -> np.ndarray:
    """A 2×3 affine ``matrix`` of continuous image coordinates (pixel ``i`` spans ``i..i+1``) as the matrix that moves
    pixel indices the same way (OpenCV's ``warpAffine`` puts pixel ``i``'s centre at ``i``): ``A·x + t`` becomes
    ``A·x + t + (A - I)·(½, ½)``. The identity stays the identity."""
    corrected = np.array(matrix, dtype=np.float64, copy=True)
    corrected[:, 2] += (corrected[:, :2] - np.eye(2)) @ np.array([0.5, 0.5])
    return corrected


def _to_planes_last(planes: torch.Tensor) -> np.ndarray:
    """A ``C×H×W`` tensor as the contiguous ``H×W×C`` array OpenCV reads."""
    return np.ascontiguousarray(planes.permute(1, 2, 0).numpy())


def _warp_planes(planes: torch.Tensor, matrix: np.ndarray, output_size: tuple[int, int], interpolation: int, fill: int) -> torch.Tensor:
    """Warp a ``C×H×W`` (or ``H×W``) tensor to ``output_size`` with OpenCV, keeping its dtype.

    OpenCV warps up to four channels of 8/16-bit or float data: other integer dtypes (int32 masks
    whose ignore index passes 255) go through float32, exact below 2**24; channels go four at a time.
    """
    height, width = output_size
    flat = planes.ndim == 2
    stack = planes[None] if flat else planes
    dtype = stack.dtype
    if stack.shape[0] == 0:  # an empty instance-mask stack (an image without objects)
        return stack.new_zeros((0, height, width))
    work = stack if dtype in (torch.uint8, torch.int16, torch.float32, torch.float64) else stack.float()
    chunks = []
    for start in range(0, work.shape[0], 4):
        chunk = _to_planes_last(work[start : start + 4])
        warped = cv2.warpAffine(chunk, matrix, (width, height), flags=interpolation,
                                borderMode=cv2.BORDER_CONSTANT, borderValue=(fill,) * 4)
        chunks.append(torch.from_numpy(warped.reshape(height, width, -1)).permute(2, 0, 1))
    warped_stack = torch.cat(chunks).to(dtype).contiguous()
    return warped_stack[0] if flat else warped_stack


def random_affine(
    settings: "AugmentSettings",
    output_size: tuple[int, int] | None = None,
    mask_fill: int = 255,
) -> RandomWarp | None:
    """The random rotation/scale/translation of ``settings`` (``None`` when all are zero).

    ``output_size`` warps onto a centred crop of that size (a mosaic canvas onto the input size).
    """
    if not (settings.degrees or settings.translate or settings.scale):
        return None
    return RandomWarp(settings.degrees, settings.translate, settings.scale, output_size=output_size, mask_fill=mask_fill)


def color_jitter(settings: "AugmentSettings") -> RandomHSV | None:
    """The HSV jitter of ``settings``: hue ±``hsv_h`` of the colour circle, saturation and value gains ±``hsv_s``/``hsv_v``."""
    if not (settings.hsv_h or settings.hsv_s or settings.hsv_v):
        return None
    return RandomHSV(settings.hsv_h, settings.hsv_s, settings.hsv_v)


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


def boxes_from_masks(masks: torch.Tensor) -> torch.Tensor:
    """The tight xyxy box (pixel edges: a one-pixel mask at column 3 spans x 3..4) of each plane of an
    ``n×H×W`` mask stack; an empty plane gets the empty box ``0, 0, 0, 0``."""
    from torchvision.ops import masks_to_boxes

    boxes = torch.zeros((len(masks), 4), dtype=torch.float32)
    present = masks.flatten(1).bool().any(dim=1) if len(masks) else torch.zeros(0, dtype=torch.bool)
    if present.any():
        tight = masks_to_boxes(masks[present].bool())
        boxes[present] = tight + torch.tensor([0.0, 0.0, 1.0, 1.0])
    return boxes


def keep_visible_instances(
    boxes: torch.Tensor,
    classes: torch.Tensor,
    masks: torch.Tensor,
    min_size: float = 2.0,
    min_visible: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Objects after the geometric transforms: each box re-derived from its ``H×W`` mask plane (its tight box),
    dropping the objects whose mask vanished, whose box is under ``min_size`` pixels, or whose box kept less
    than ``min_visible`` of the area of its transformed, unclipped ``boxes`` row (``keep_visible_boxes``'s rule)."""
    reference = boxes.as_subclass(torch.Tensor).float().reshape(-1, 4)
    masks = masks.as_subclass(torch.Tensor)
    if not (len(reference) == len(classes) == len(masks)):
        raise ValueError(f"got {len(reference)} boxes, {len(classes)} classes and {len(masks)} masks; give one of each per object")
    tight = boxes_from_masks(masks)
    area_before = (reference[:, 2] - reference[:, 0]).clamp(min=0) * (reference[:, 3] - reference[:, 1]).clamp(min=0)
    box_width, box_height = tight[:, 2] - tight[:, 0], tight[:, 3] - tight[:, 1]
    keep = (box_width >= min_size) & (box_height >= min_size) & (box_width * box_height >= min_visible * area_before.clamp(min=1e-9))
    return tight[keep], classes[keep], masks[keep]


def apply_v2(transform: Any, image: torch.Tensor, *others: Any) -> tuple[Any, ...]:
    """Run a v2 transform on a plain uint8 image plus boxes/masks; return plain tensors for images."""
    outputs = transform(tv_tensors.Image(image), *others)
    if not others:
        outputs = (outputs,)
    return (outputs[0].as_subclass(torch.Tensor), *outputs[1:])
