"""An image as a family's network takes it: the resize its published weights were trained with.

A family declares its ``InputPipeline`` once (registry.yaml, ``zoo_core/registry.py``); the tasks
run it here for prediction, validation and the non-augmented training samples, so the same file
gives the same predictions in zoo as in the reference implementation (LibreYOLO 1.6). The modes:

- ``letterbox``: the image scaled by ``r = min(H_in / H, W_in / W)`` (its longer side at most
  ``fit_side`` when set), new sides truncated or rounded as declared, placed at the top-left of a
  grey canvas or centred on it;
- ``stretch``: both sides scaled to the input size, aspect not kept;
- ``crop``: the shorter side scaled to ``floor(size / crop_pct)``, then the centre ``size × size``
  (timm's and torchvision's evaluation of ImageNet classifiers);
- ``native``: the image as it is (restoration networks run at full resolution).

The interpolations are the reference's own kernels, so the pixels agree: ``bilinear`` is OpenCV's
``INTER_LINEAR`` (no antialiasing), ``bilinear_antialiased`` and ``bicubic_antialiased`` are PIL's
filters, which widen their support when they shrink an image. torchvision's resize was considered
and not used: its antialiased kernels round differently from PIL's and its plain bilinear
differs from OpenCV's at the borders, a level here and there that moves a detection's score.

Every mode returns the geometry as a ``RatioPad`` ``((ratio_x, ratio_y), (pad_left, pad_top))``:
original pixel ``x`` lands at ``x * ratio_x + pad_left``. The ratio is the nominal scale ``r`` the
new size was computed from, as the reference maps boxes back, not the realised ``new_w / W``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from zoo_core.ops.boxes import RatioPad, boxes_to_original
from zoo_core.registry import ImageSize, image_size_hw

if TYPE_CHECKING:
    from zoo_core.registry import InputPipeline

__all__ = [
    "fit_to_input", "resize_pixels", "letterbox_geometry", "unpadded_size", "boxes_to_input", "boxes_to_original",
    "logits_to_original", "RatioPad",
]

def resize_pixels(image: torch.Tensor, size_hw: tuple[int, int], interpolation: str, *, in_float: bool = False) -> torch.Tensor:
    """``image`` (uint8 ``3×H×W``) resized to ``size_hw`` with the named kernel.

    Returns uint8, or float32 in [0, 1] when ``in_float`` (the image is divided by 255 first and
    resized without rounding to levels, as RF-DETR's reference does).
    """
    height, width = size_hw
    pixels = image.permute(1, 2, 0).numpy()
    if in_float:
        import cv2

        resized = cv2.resize(pixels.astype(np.float32) / 255.0, (width, height), interpolation=cv2.INTER_LINEAR)
        return torch.from_numpy(np.ascontiguousarray(resized)).permute(2, 0, 1)
    if (int(image.shape[-2]), int(image.shape[-1])) == (height, width):
        return image
    if interpolation == "bilinear":
        import cv2

        resized = cv2.resize(np.ascontiguousarray(pixels), (width, height), interpolation=cv2.INTER_LINEAR)
    else:
        from PIL import Image

        kernel = Image.Resampling.BICUBIC if interpolation == "bicubic_antialiased" else Image.Resampling.BILINEAR
        resized = np.array(Image.fromarray(np.ascontiguousarray(pixels)).resize((width, height), kernel))
    return torch.from_numpy(np.ascontiguousarray(resized)).permute(2, 0, 1)


def letterbox_geometry(shape: tuple[int, int], size: ImageSize, pipeline: "InputPipeline") -> tuple[float, tuple[int, int], tuple[int, int]]:
    """The scale ``r``, the new ``(height, width)`` and the ``(left, top)`` offset of ``shape`` letterboxed into ``size``."""
    target_h, target_w = image_size_hw(size)
    height, width = shape
    fit_h, fit_w = (min(pipeline.fit_side, target_h), min(pipeline.fit_side, target_w)) if pipeline.fit_side else (target_h, target_w)
    if pipeline.fit_side:
        fit_h = fit_w = min(fit_h, fit_w)  # the longer side at most fit_side, inside the canvas
    ratio = min(fit_h / height, fit_w / width)
    rounded = (lambda value: int(round(value))) if pipeline.rounding == "round" else int
    new_h, new_w = max(rounded(height * ratio), 1), max(rounded(width * ratio), 1)
    if pipeline.placement == "centre":
        offset = ((target_w - new_w) // 2, (target_h - new_h) // 2)
    else:
        offset = (0, 0)
    return ratio, (new_h, new_w), offset


def unpadded_size(shape: tuple[int, int], ratio_pad: RatioPad, pipeline: "InputPipeline") -> tuple[int, int]:
    """The ``(height, width)`` an original image of ``shape`` covers on the input, as the pipeline counts it
    when it maps a dense prediction back (the reference's rounding: ``unpad_rounding``)."""
    (ratio_x, ratio_y), _ = ratio_pad
    rounded = (lambda value: int(round(value))) if pipeline.unpad_rounding == "round" else int
    return max(rounded(shape[0] * ratio_y), 1), max(rounded(shape[1] * ratio_x), 1)


def fit_to_input(
    image: torch.Tensor,
    size: ImageSize,
    pipeline: "InputPipeline",
    *,
    mask: torch.Tensor | None = None,
    mask_fill: int = 255,
) -> tuple[torch.Tensor, torch.Tensor | None, RatioPad]:
    """``image`` (uint8 ``3×H×W``) as the network input of ``size``, a ``mask`` brought along (an ``H×W``
    class-index mask or an ``n×H×W`` stack of instance masks: nearest, padding filled with ``mask_fill``),
    and the geometry (module docstring)."""
    height, width = int(image.shape[-2]), int(image.shape[-1])
    target_h, target_w = image_size_hw(size)
    in_float = pipeline.resize_in_float
    if pipeline.resize == "native":
        return (image.float().div(255) if in_float else image), mask, ((1.0, 1.0), (0.0, 0.0))
    if pipeline.resize == "stretch":
        fitted = resize_pixels(image, (target_h, target_w), pipeline.interpolation, in_float=in_float)
        return fitted, _nearest(mask, (target_h, target_w)), ((target_w / width, target_h / height), (0.0, 0.0))
    if pipeline.resize == "crop":
        if pipeline.crop_pct is None:
            raise ValueError("a crop input pipeline needs crop_pct (the share of the resized image the crop keeps)")
        short_side = math.floor(target_h / pipeline.crop_pct)
        if height <= width:
            new_h, new_w = short_side, int(short_side * width / height)
        else:
            new_h, new_w = int(short_side * height / width), short_side
        resized = resize_pixels(image, (new_h, new_w), pipeline.interpolation, in_float=in_float)
        top, left = int(round((new_h - target_h) / 2.0)), int(round((new_w - target_w) / 2.0))
        cropped = resized[:, top:top + target_h, left:left + target_w]
        if mask is not None:
            mask = _nearest(mask, (new_h, new_w))[..., top:top + target_h, left:left + target_w]
        return cropped, mask, ((new_w / width, new_h / height), (float(-left), float(-top)))
    ratio, (new_h, new_w), (left, top) = letterbox_geometry((height, width), size, pipeline)
    resized = resize_pixels(image, (new_h, new_w), pipeline.interpolation, in_float=in_float)
    fill = pipeline.pad_value / 255.0 if in_float else pipeline.pad_value
    canvas = torch.full((3, target_h, target_w), fill, dtype=resized.dtype)
    canvas[:, top:top + new_h, left:left + new_w] = resized
    if mask is not None:
        padded = torch.full((*mask.shape[:-2], target_h, target_w), mask_fill, dtype=mask.dtype)
        padded[..., top:top + new_h, left:left + new_w] = _nearest(mask, (new_h, new_w))
        mask = padded
    return canvas, mask, ((ratio, ratio), (float(left), float(top)))


def _nearest(mask: torch.Tensor | None, size_hw: tuple[int, int]) -> torch.Tensor | None:
    """A class-index ``mask`` (or an ``n×H×W`` stack, plane by plane) resized to ``size_hw`` by nearest neighbour
    (None stays None)."""
    if mask is None or tuple(mask.shape[-2:]) == tuple(size_hw):
        return mask
    if mask.ndim == 3:  # instance masks: OpenCV's nearest on each plane, the same pixels as a class mask gets
        resized = [_nearest(plane, size_hw) for plane in mask]
        return torch.stack(resized) if resized else mask.new_zeros((0, *size_hw))
    import cv2

    values = mask.numpy()
    resized = cv2.resize(values.astype(np.int32) if values.dtype not in (np.uint8, np.int32) else values,
                         (size_hw[1], size_hw[0]), interpolation=cv2.INTER_NEAREST)
    return torch.from_numpy(np.ascontiguousarray(resized)).to(mask.dtype)


def boxes_to_input(boxes: torch.Tensor, ratio_pad: RatioPad) -> torch.Tensor:
    """``n×4`` xyxy boxes in original pixels placed on the network input (``fit_to_input``'s geometry)."""
    (ratio_x, ratio_y), (pad_left, pad_top) = ratio_pad
    scale = boxes.new_tensor([ratio_x, ratio_y, ratio_x, ratio_y])
    offset = boxes.new_tensor([pad_left, pad_top, pad_left, pad_top])
    return boxes.reshape(-1, 4) * scale + offset


def logits_to_original(logits: torch.Tensor, ratio_pad: RatioPad, shape: tuple[int, int], pipeline: "InputPipeline") -> torch.Tensor:
    """A ``C×h×w`` map predicted on the network input, on the original image of ``shape``: a letterbox's
    padding cut off (its valid region counted as the pipeline's ``unpad_rounding`` says), then resized
    bilinearly (``align_corners=False``) to the original size."""
    if pipeline.resize == "letterbox":
        (_, _), (pad_left, pad_top) = ratio_pad
        inner_h, inner_w = unpadded_size(shape, ratio_pad, pipeline)
        left, top = int(pad_left), int(pad_top)
        logits = logits[:, top:top + inner_h, left:left + inner_w]
    if tuple(logits.shape[-2:]) == tuple(shape):
        return logits
    return torch.nn.functional.interpolate(logits[None].float(), size=tuple(shape), mode="bilinear", align_corners=False)[0]
