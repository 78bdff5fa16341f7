"""Rotated (oriented) boxes: conversions, exact polygon IoU, ProbIoU and rotated NMS, vectorised.

Convention (LibreYOLO 1.6.0's public OBB contract, which zoo follows): a rotated box is
``(cx, cy, w, h, angle)`` in pixels, ``angle`` in radians, with the **long side first** (``w >= h``)
and ``angle`` in ``[-pi/2, pi/2)``: the angle of the box's long side from the image's x axis, measured
towards the image's y axis (downwards: clockwise as the image is seen). ``canonical_xywhr`` puts any
``(cx, cy, w, h, angle)`` into that form without moving the rectangle. Corners (``xyxyxyxy``) are
``(..., 4, 2)``: ``centre + R(angle) @ (±w/2, ±h/2)`` in the order (+,+), (-,+), (-,-), (+,-) — a closed
loop around the rectangle, so consecutive corners share an edge.

What is exact and what is approximate:

- ``rotated_box_iou`` is the exact area IoU of two rotated rectangles: the intersection polygon of two
  convex quadrilaterals is formed from the corners of each inside the other and the crossings of
  their edges, ordered by angle around their mean, and measured with the shoelace formula. Every
  pair of an ``N×M`` matrix is computed at once (no Python loop over pairs). The OBB metric and
  rotated NMS use it, as LibreYOLO's NMS and DOTA's evaluation use polygon IoU.
- ``probiou`` (Llerena et al., "Gaussian Bounding Boxes and Probabilistic Intersection-over-Union for
  Object Detection", 2021) treats each box as a 2-D Gaussian (covariance ``R diag(w²/12, h²/12) Rᵀ``)
  and returns ``1 - Hellinger distance``: smooth, differentiable and cheap, which is why the
  published OBB losses (Ultralytics, YOLO-NAS-R) train with it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "canonical_xywhr",
    "xywhr_to_corners",
    "corners_to_xywhr",
    "xywhr_to_xyxy",
    "polygon_area",
    "rotated_box_iou",
    "probiou",
    "rotated_nms",
]

_HALF_PI = math.pi / 2


def _check_xywhr(boxes: torch.Tensor, name: str) -> None:
    if boxes.shape[-1] != 5:
        raise ValueError(f"{name} must be (..., 5) rotated boxes (cx, cy, w, h, angle), got shape {tuple(boxes.shape)}")


def canonical_xywhr(boxes: torch.Tensor) -> torch.Tensor:
    """``(..., 5)`` rotated boxes with the long side first and the angle in ``[-pi/2, pi/2)``; the same rectangles."""
    _check_xywhr(boxes, "boxes")
    width, height, angle = boxes[..., 2], boxes[..., 3], boxes[..., 4]
    swap = height > width
    long_side = torch.where(swap, height, width)
    short_side = torch.where(swap, width, height)
    # Turning a rectangle by a quarter swaps its sides; turning it by half a turn changes nothing.
    angle = torch.where(swap, angle + _HALF_PI, angle)
    angle = torch.remainder(angle + _HALF_PI, math.pi) - _HALF_PI
    return torch.stack([boxes[..., 0], boxes[..., 1], long_side, short_side, angle], dim=-1)


def xywhr_to_corners(boxes: torch.Tensor) -> torch.Tensor:
    """``(..., 5)`` rotated boxes as their ``(..., 4, 2)`` corners (the order in the module docstring)."""
    _check_xywhr(boxes, "boxes")
    centre = boxes[..., None, 0:2]
    cosine, sine = torch.cos(boxes[..., 4]), torch.sin(boxes[..., 4])
    half_w, half_h = boxes[..., 2] / 2, boxes[..., 3] / 2
    signs_w = boxes.new_tensor([1.0, -1.0, -1.0, 1.0])
    signs_h = boxes.new_tensor([1.0, 1.0, -1.0, -1.0])
    along = half_w[..., None] * signs_w  # offsets along the box's own axes
    across = half_h[..., None] * signs_h
    x = along * cosine[..., None] - across * sine[..., None]
    y = along * sine[..., None] + across * cosine[..., None]
    return centre + torch.stack([x, y], dim=-1)


def corners_to_xywhr(corners: torch.Tensor) -> torch.Tensor:
    """``(..., 4, 2)`` corners (or ``(..., 8)``) of rectangles in loop order as canonical ``(..., 5)`` boxes.

    Sides are the means of opposite edges and the angle that of the first edge, which is exact for a
    rectangle and for any rectangle moved by rotation, uniform scale, translation or flips (what the
    augmentation does). Quadrilaterals that are not rectangles (DOTA's hand-drawn labels) go through
    ``zoo_core.data.obb_format.quadrilateral_to_xywhr`` (OpenCV's minimum-area rectangle) first.
    """
    if corners.shape[-1] == 8:
        corners = corners.reshape(*corners.shape[:-1], 4, 2)
    if corners.shape[-2:] != (4, 2):
        raise ValueError(f"corners must be (..., 4, 2) or (..., 8), got shape {tuple(corners.shape)}")
    corners = corners.float()
    edges = corners.roll(-1, dims=-2) - corners  # edge i runs from corner i to corner i+1
    lengths = edges.norm(dim=-1)
    width = (lengths[..., 0] + lengths[..., 2]) / 2
    height = (lengths[..., 1] + lengths[..., 3]) / 2
    # Edge 0 and the reversed edge 2 point the same way; their sum averages out rounding of either.
    direction = edges[..., 0, :] - edges[..., 2, :]
    angle = torch.atan2(direction[..., 1], direction[..., 0])
    centre = corners.mean(dim=-2)
    return canonical_xywhr(torch.stack([centre[..., 0], centre[..., 1], width, height, angle], dim=-1))


def xywhr_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """The axis-aligned ``(..., 4)`` xyxy box enclosing each rotated box."""
    corners = xywhr_to_corners(boxes)
    return torch.cat([corners.amin(dim=-2), corners.amax(dim=-2)], dim=-1)


def polygon_area(points: torch.Tensor) -> torch.Tensor:
    """Unsigned area of ``(..., K, 2)`` polygons whose vertices are in loop order (shoelace formula)."""
    x, y = points[..., 0], points[..., 1]
    return 0.5 * (x * y.roll(-1, dims=-1) - x.roll(-1, dims=-1) * y).sum(dim=-1).abs()


def _cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _inside(points: torch.Tensor, corners: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Whether each of ``points`` (N, M, P, 2) lies in the convex quadrilateral ``corners`` (N, M, 4, 2), edges included
    (within ``eps``, (N, M, 1, 1), in squared pixels)."""
    start = corners[:, :, None, :, :]  # N, M, 1, 4, 2
    edge = corners.roll(-1, dims=-2)[:, :, None] - start
    side = _cross(edge, points[:, :, :, None, :] - start)  # N, M, P, 4
    # Either orientation of the loop: the point is on one side of every edge.
    return (side >= -eps).all(dim=-1) | (side <= eps).all(dim=-1)


def _intersection_area(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Areas of the intersections of every convex quadrilateral of ``first`` (N, 4, 2) with every one of ``second`` (M, 4, 2)."""
    count_first, count_second = len(first), len(second)
    a = first[:, None].expand(count_first, count_second, 4, 2)
    b = second[None].expand(count_first, count_second, 4, 2)
    scale = torch.maximum(a.abs().amax(dim=(-2, -1)), b.abs().amax(dim=(-2, -1))).clamp(min=1.0)
    eps = 1e-6 * scale[..., None, None] ** 2
    # Crossings of each edge of a with each edge of b: a_i + t (a_i+1 - a_i) = b_j + u (b_j+1 - b_j), t and u in [0, 1].
    a_start, a_edge = a[:, :, :, None], (a.roll(-1, dims=-2) - a)[:, :, :, None]  # N, M, 4, 1, 2
    b_start, b_edge = b[:, :, None], (b.roll(-1, dims=-2) - b)[:, :, None]  # N, M, 1, 4, 2
    denominator = _cross(a_edge, b_edge)  # N, M, 4, 4
    offset = b_start - a_start
    parallel = denominator.abs() <= eps
    safe = torch.where(parallel, torch.ones_like(denominator), denominator)
    t = _cross(offset, b_edge) / safe
    u = _cross(offset, a_edge) / safe
    crossing = (~parallel) & (t >= 0) & (t <= 1) & (u >= 0) & (u <= 1)
    crossings = (a_start + t[..., None] * a_edge).reshape(count_first, count_second, 16, 2)
    points = torch.cat([a, b, crossings], dim=2)  # N, M, 24, 2
    valid = torch.cat([_inside(a, b, eps), _inside(b, a, eps),
                       crossing.reshape(count_first, count_second, 16)], dim=2)
    counts = valid.sum(dim=-1)
    centre = (points * valid[..., None]).sum(dim=2) / counts.clamp(min=1)[..., None]
    angles = torch.atan2(points[..., 1] - centre[..., None, 1], points[..., 0] - centre[..., None, 0])
    angles = torch.where(valid, angles, torch.full_like(angles, 4 * math.pi))  # invalid points sort last
    order = angles.argsort(dim=-1)
    ordered = torch.gather(points, 2, order[..., None].expand_as(points))
    ordered_valid = torch.gather(valid, 2, order)
    # Invalid points become copies of the first valid one: zero-length edges add nothing to the area.
    ordered = torch.where(ordered_valid[..., None], ordered, ordered[:, :, :1])
    area = polygon_area(ordered)
    return torch.where(counts >= 3, area, torch.zeros_like(area))


def rotated_box_iou(first: torch.Tensor, second: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Exact IoU matrix ``(N, M)`` of rotated boxes ``first`` (N, 5) and ``second`` (M, 5), computed for all pairs at once.

    The computation is in float64 for boxes of thousands of pixels; empty boxes have IoU 0.
    """
    _check_xywhr(first, "first")
    _check_xywhr(second, "second")
    if not len(first) or not len(second):
        return first.new_zeros((len(first), len(second)))
    work_first, work_second = first.double(), second.double()
    intersection = _intersection_area(xywhr_to_corners(work_first), xywhr_to_corners(work_second))
    area_first = work_first[:, 2] * work_first[:, 3]
    area_second = work_second[:, 2] * work_second[:, 3]
    union = area_first[:, None] + area_second[None] - intersection
    iou = intersection / union.clamp(min=eps)
    return iou.clamp_(0.0, 1.0).to(first.dtype)


def _covariance(boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The entries ``(a, b, c)`` of each box's Gaussian covariance ``[[a, c], [c, b]]`` (a uniform rectangle's)."""
    variance_w, variance_h = boxes[..., 2].pow(2) / 12, boxes[..., 3].pow(2) / 12
    cosine, sine = torch.cos(boxes[..., 4]), torch.sin(boxes[..., 4])
    a = variance_w * cosine.pow(2) + variance_h * sine.pow(2)
    b = variance_w * sine.pow(2) + variance_h * cosine.pow(2)
    c = (variance_w - variance_h) * cosine * sine
    return a, b, c


def probiou(first: torch.Tensor, second: torch.Tensor, eps: float = 1e-7, pairwise: bool = False) -> torch.Tensor:
    """ProbIoU (``1 - Hellinger distance`` of the boxes' Gaussians) of rotated boxes paired by broadcasting.

    ``pairwise=True`` returns the ``(N, M)`` matrix of ``first`` (N, 5) against ``second`` (M, 5).
    The Bhattacharyya distance is clamped to ``[eps, 100]`` so a far pair keeps a finite gradient.
    """
    _check_xywhr(first, "first")
    _check_xywhr(second, "second")
    if pairwise:
        first, second = first[:, None], second[None]
    a1, b1, c1 = _covariance(first)
    a2, b2, c2 = _covariance(second)
    dx = first[..., 0] - second[..., 0]
    dy = first[..., 1] - second[..., 1]
    a, b, c = a1 + a2, b1 + b2, c1 + c2
    determinant = a * b - c.pow(2)
    # Bhattacharyya distance of two Gaussians: a Mahalanobis term of the centres plus a covariance term.
    mahalanobis = (a * dy.pow(2) + b * dx.pow(2) - 2 * c * dx * dy) / (4 * determinant + eps) / 2
    spread = 0.5 * torch.log(determinant / (4 * ((a1 * b1 - c1.pow(2)).clamp(min=0) * (a2 * b2 - c2.pow(2)).clamp(min=0)).sqrt() + eps) + eps)
    distance = (mahalanobis + spread).clamp(eps, 100.0)
    hellinger = (1.0 - torch.exp(-distance) + eps).sqrt()
    return 1.0 - hellinger


def rotated_nms(boxes: torch.Tensor, scores: torch.Tensor, iou: float, labels: torch.Tensor | None = None,
                max_det: int | None = None) -> torch.Tensor:
    """Greedy NMS on exact rotated IoU: indices of the kept boxes, highest score first.

    A box is dropped when its IoU with a kept, higher-scoring box of its class (``labels``; all one class
    without) is above ``iou``. The IoU matrix is computed once, vectorised; the greedy pass walks the
    boxes in score order (ties keep their input order). Non-finite boxes or scores are dropped.
    """
    _check_xywhr(boxes, "boxes")
    if not 0.0 <= iou <= 1.0:
        raise ValueError(f"iou={iou} must be an IoU threshold between 0 and 1")
    finite = torch.isfinite(boxes).all(dim=-1) & torch.isfinite(scores)
    candidates = torch.nonzero(finite).reshape(-1)
    if not len(candidates):
        return candidates
    order = candidates[torch.argsort(scores[candidates], descending=True, stable=True)]
    matrix = rotated_box_iou(boxes[order].float(), boxes[order].float())
    if labels is not None:
        same = labels[order][:, None] == labels[order][None]
        matrix = torch.where(same, matrix, torch.zeros_like(matrix))
    suppressing = (matrix > iou).cpu().numpy()
    removed = np.zeros(len(order), dtype=bool)
    keep: list[int] = []
    limit = len(order) if max_det is None else max_det
    for position in range(len(order)):
        if removed[position]:
            continue
        keep.append(position)
        if len(keep) >= limit:
            break
        removed |= suppressing[position]
    return order[torch.as_tensor(keep, dtype=torch.long, device=order.device)]
