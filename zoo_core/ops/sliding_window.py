"""Sliding-window ("slide mode") inference for dense prediction on inputs larger than the training crop.

Segmentation networks are trained on fixed crops (512×512 for SegFormer on ADE20K, 512×1024 for
PP-LiteSeg on Cityscapes) and are often evaluated on larger frames window by window: the frame is
covered by windows of the training size placed ``stride`` pixels apart, the network predicts each
window, and every pixel receives the mean of the logits of all windows that cover it.

Placement follows the convention segmentation toolkits use for "slide" testing: along each side
there are ``ceil((side - window) / stride) + 1`` windows, the i-th starting at ``i * stride``, and
a window that would cross the far border is shifted back so that it ends exactly on it. So every
window lies inside the frame, every pixel is covered at least once, and a side not longer than
the window is processed whole (that window is then the side itself, smaller than ``window``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from zoo_core.ops.resize import resize_logits

__all__ = ["sliding_window_logits", "window_starts"]


def _pair(value: int | Sequence[int], name: str) -> tuple[int, int]:
    """``(h, w)`` from an int or a 2-sequence of positive ints; ValueError naming ``name`` otherwise."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(side, int) and not isinstance(side, bool) for side in pair):
        raise ValueError(f"{name} must be an int or (height, width) ints, got {value!r}")
    if min(pair) < 1:
        raise ValueError(f"{name} sides must be at least 1, got {value!r}")
    return pair[0], pair[1]


def window_starts(length: int, window: int, stride: int) -> list[int]:
    """Start offsets of the windows covering ``length`` pixels (see the module docstring).

    >>> window_starts(10, 4, 3)
    [0, 3, 6]
    >>> window_starts(11, 4, 3)
    [0, 3, 6, 7]
    >>> window_starts(3, 4, 3)
    [0]
    """
    if length <= window:
        return [0]
    count = -(-(length - window) // stride) + 1  # ceil division
    return [min(index * stride, length - window) for index in range(count)]


def sliding_window_logits(
    model: Callable[[torch.Tensor], torch.Tensor],
    image: torch.Tensor,
    window: int | Sequence[int],
    stride: int | Sequence[int],
    num_classes: int,
) -> torch.Tensor:
    """Per-pixel class logits of ``image`` (N×3×H×W) averaged over overlapping windows.

    ``model`` maps an N×3×h×w crop to N×``num_classes``×h'×w' logits; the semantic model
    contract in eval mode returns them at the crop size, and logits of another size are resized
    bilinearly to the crop first. ``window`` and ``stride`` are ints or ``(height, width)``; the
    stride may not exceed the window (that would leave pixels no window covers). Windows are
    placed as described in the module docstring. Returns N×``num_classes``×H×W logits in the dtype of the model's
    output, except that half-precision outputs are accumulated and returned in float32.

    The function holds no state and changes no mode: call ``model.eval()`` and, for inference,
    wrap the call in ``torch.no_grad()`` / ``torch.inference_mode()`` yourself. With a window at
    least as large as the image it equals one whole-image forward pass.
    """
    if image.dim() != 4:
        raise ValueError(f"image must be N×C×H×W, got shape {tuple(image.shape)}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    window_h, window_w = _pair(window, "window")
    stride_h, stride_w = _pair(stride, "stride")
    if stride_h > window_h or stride_w > window_w:
        raise ValueError(f"stride {stride!r} exceeds window {window!r}: pixels between windows would get no logits")
    batch, _, height, width = image.shape
    rows = window_starts(height, window_h, stride_h)
    cols = window_starts(width, window_w, stride_w)
    crop_h, crop_w = min(window_h, height), min(window_w, width)

    summed: torch.Tensor | None = None
    # How many windows cover each pixel: the same for every image and class, so one H×W map.
    coverage = torch.zeros(height, width, device=image.device, dtype=torch.float32)
    for top in rows:
        for left in cols:
            crop = image[:, :, top : top + crop_h, left : left + crop_w]
            logits = model(crop)
            if logits.dim() != 4 or logits.shape[0] != batch or logits.shape[1] != num_classes:
                raise ValueError(
                    f"the model returned logits of shape {tuple(logits.shape)} for a {tuple(crop.shape)} crop; "
                    f"expected {batch}×{num_classes}×h×w (num_classes={num_classes})"
                )
            logits = resize_logits(logits, (crop_h, crop_w))
            if summed is None:
                accumulate = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
                summed = torch.zeros(batch, num_classes, height, width, device=logits.device, dtype=accumulate)
            summed[:, :, top : top + crop_h, left : left + crop_w] += logits.to(summed.dtype)
            coverage[top : top + crop_h, left : left + crop_w] += 1
    assert summed is not None  # at least one window always exists
    return summed / coverage.to(summed.dtype)
