"""Box arithmetic shared by detection families (boxes are ``x1, y1, x2, y2`` unless stated).

torchvision.ops already covers conversions (``box_convert``) and the *pairwise* N×M matrices
(``box_iou``, ``complete_box_iou`` ...). What detection training also needs, and torchvision does
not offer, is IoU of boxes paired *by broadcasting* — one predicted box against its own target,
or every ground truth of a padded batch against every anchor's prediction (B×G×1×4 against
B×1×A×4) — and the conversion between boxes and the left/top/right/bottom distances that
anchor-free heads regress.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch

__all__ = [
    "IoUKind", "aligned_box_iou", "distances_to_boxes", "boxes_to_distances", "RatioPad", "ImagePlacement",
    "boxes_to_original", "drop_empty_boxes",
]

RatioPad = tuple[tuple[float, float], tuple[float, float]]
"""``((ratio_x, ratio_y), (pad_left, pad_top))``: original pixel ``x`` lands at ``x * ratio_x + pad_left`` on the input."""


class ImagePlacement(NamedTuple):
    """Where one original image lies on the network input: its ``RatioPad`` and its ``(height, width)``.

    A detection family's ``postprocess`` given one per image maps its boxes back to the original
    images in the reference order (mapped, clipped and emptied boxes dropped before NMS).
    """

    ratio_pad: RatioPad
    shape: tuple[int, int]

IoUKind = Literal["iou", "giou", "diou", "ciou"]
_KINDS = ("iou", "giou", "diou", "ciou")


def aligned_box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor, kind: IoUKind = "iou", eps: float = 1e-7) -> torch.Tensor:
    """IoU, GIoU, DIoU or CIoU of boxes paired by broadcasting ``boxes1[..., :]`` with ``boxes2[..., :]``.

    Both inputs are ``(..., 4)`` xyxy tensors whose leading dimensions broadcast; the result has
    the broadcast leading shape. ``eps`` keeps empty boxes finite (zero-height boxes included):
    the union, the enclosing area/diagonal and the heights in CIoU's aspect term are offset by it.
    Definitions: GIoU (Rezatofighi et al., 2019), DIoU and CIoU (Zheng et al., 2020); CIoU's
    trade-off weight ``alpha`` is treated as a constant for the gradient, as in the paper.
    """
    if kind not in _KINDS:
        raise ValueError(f"unknown IoU kind {kind!r}; choose one of {', '.join(_KINDS)}")
    if boxes1.shape[-1] != 4 or boxes2.shape[-1] != 4:
        raise ValueError(
            f"boxes must end in a dimension of 4 (x1, y1, x2, y2), got {tuple(boxes1.shape)} and {tuple(boxes2.shape)}"
        )
    x1a, y1a, x2a, y2a = boxes1.unbind(-1)
    x1b, y1b, x2b, y2b = boxes2.unbind(-1)
    width_a, height_a = x2a - x1a, y2a - y1a + eps
    width_b, height_b = x2b - x1b, y2b - y1b + eps
    intersection = (torch.minimum(x2a, x2b) - torch.maximum(x1a, x1b)).clamp(min=0) * (
        torch.minimum(y2a, y2b) - torch.maximum(y1a, y1b)
    ).clamp(min=0)
    union = width_a * height_a + width_b * height_b - intersection + eps
    iou = intersection / union
    if kind == "iou":
        return iou
    enclosing_width = torch.maximum(x2a, x2b) - torch.minimum(x1a, x1b)
    enclosing_height = torch.maximum(y2a, y2b) - torch.minimum(y1a, y1b)
    if kind == "giou":
        enclosing_area = enclosing_width * enclosing_height + eps
        return iou - (enclosing_area - union) / enclosing_area
    diagonal_squared = enclosing_width**2 + enclosing_height**2 + eps
    centre_distance_squared = ((x1b + x2b - x1a - x2a) ** 2 + (y1b + y2b - y1a - y2a) ** 2) / 4
    diou = iou - centre_distance_squared / diagonal_squared
    if kind == "diou":
        return diou
    aspect_term = (4 / math.pi**2) * (torch.atan(width_b / height_b) - torch.atan(width_a / height_a)) ** 2
    with torch.no_grad():
        alpha = aspect_term / (aspect_term - iou + (1 + eps))
    return diou - alpha * aspect_term


def distances_to_boxes(distances: torch.Tensor, anchor_points: torch.Tensor) -> torch.Tensor:
    """xyxy boxes from ``(..., 4)`` left/top/right/bottom distances measured from ``(..., 2)`` anchor points."""
    left_top, right_bottom = distances.split(2, dim=-1)
    return torch.cat((anchor_points - left_top, anchor_points + right_bottom), dim=-1)


def boxes_to_distances(boxes: torch.Tensor, anchor_points: torch.Tensor, max_distance: float | None = None) -> torch.Tensor:
    """Left/top/right/bottom distances from ``anchor_points`` to the sides of xyxy ``boxes``.

    Distances are clamped to ``[0, max_distance]`` (no upper bound when ``max_distance`` is None):
    an anchor outside its box, or farther than a head can express, regresses to the limit.
    """
    top_left, bottom_right = boxes.split(2, dim=-1)
    distances = torch.cat((anchor_points - top_left, bottom_right - anchor_points), dim=-1)
    return distances.clamp(min=0, max=max_distance)


def boxes_to_original(boxes: torch.Tensor, ratio_pad: RatioPad, shape: tuple[int, int], *, clip: bool = True) -> torch.Tensor:
    """``n×4`` xyxy boxes in input pixels mapped back to the original image of ``shape`` (the placement undone),
    clipped to it unless ``clip`` is False (a DETR's reference returns its boxes unclipped)."""
    (ratio_x, ratio_y), (pad_left, pad_top) = ratio_pad
    height, width = shape
    mapped = boxes.detach().float().reshape(-1, 4).clone()
    mapped[:, [0, 2]] = (mapped[:, [0, 2]] - pad_left) / ratio_x
    mapped[:, [1, 3]] = (mapped[:, [1, 3]] - pad_top) / ratio_y
    if clip:
        mapped[:, [0, 2]] = mapped[:, [0, 2]].clamp(0, width)
        mapped[:, [1, 3]] = mapped[:, [1, 3]].clamp(0, height)
    return mapped


def drop_empty_boxes(boxes: torch.Tensor) -> torch.Tensor:
    """The indices of the ``n×4`` xyxy boxes with a positive width and height."""
    return ((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])).nonzero(as_tuple=True)[0]
