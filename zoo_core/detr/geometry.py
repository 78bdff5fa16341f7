"""Box and coordinate helpers of the DETR core (boxes normalised to the image unless stated).

DETRs predict boxes as ``cx, cy, w, h`` fractions of the input size and refine them in logit
space; these helpers convert between that form, ``x1, y1, x2, y2`` and logits.
"""

from __future__ import annotations

import torch

__all__ = ["cxcywh_to_xyxy", "xyxy_to_cxcywh", "inverse_sigmoid", "pairwise_giou", "paired_iou", "paired_giou", "sine_position_grid"]


def cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """``(cx, cy, w, h)`` → ``(x1, y1, x2, y2)`` over the last dimension."""
    centre, size = boxes[..., :2], boxes[..., 2:]
    half = 0.5 * size
    return torch.cat([centre - half, centre + half], dim=-1)


def xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """``(x1, y1, x2, y2)`` → ``(cx, cy, w, h)`` over the last dimension."""
    low, high = boxes[..., :2], boxes[..., 2:]
    return torch.cat([(low + high) / 2, high - low], dim=-1)


def inverse_sigmoid(probability: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """``log(p / (1 - p))`` with ``p`` clipped to [0, 1] and both terms floored at ``eps``."""
    probability = probability.clamp(0.0, 1.0)
    return torch.log(probability.clamp(min=eps) / (1 - probability).clamp(min=eps))


def _areas(boxes: torch.Tensor) -> torch.Tensor:
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def paired_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """IoU of ``boxes1[i]`` with ``boxes2[i]`` (xyxy, same shape ``(..., 4)``), no epsilon.

    The plain ratio the DETR papers use for IoU-aware class targets; inputs are boxes with
    positive area (targets are filtered, predictions come from a sigmoid).
    """
    top_left = torch.maximum(boxes1[..., :2], boxes2[..., :2])
    bottom_right = torch.minimum(boxes1[..., 2:], boxes2[..., 2:])
    overlap = (bottom_right - top_left).clamp(min=0).prod(-1)
    return overlap / (_areas(boxes1) + _areas(boxes2) - overlap)


def pairwise_giou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """Generalized IoU matrix ``N×M`` of xyxy boxes (Rezatofighi et al., 2019)."""
    area1, area2 = _areas(boxes1)[:, None], _areas(boxes2)[None, :]
    inner = (torch.minimum(boxes1[:, None, 2:], boxes2[None, :, 2:]) - torch.maximum(boxes1[:, None, :2], boxes2[None, :, :2])).clamp(min=0)
    overlap = inner.prod(-1)
    union = area1 + area2 - overlap
    hull = (torch.maximum(boxes1[:, None, 2:], boxes2[None, :, 2:]) - torch.minimum(boxes1[:, None, :2], boxes2[None, :, :2])).clamp(min=0)
    hull_area = hull.prod(-1)
    return overlap / union - (hull_area - union) / hull_area


def paired_giou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """Generalized IoU of ``boxes1[i]`` with ``boxes2[i]`` (xyxy), the diagonal of ``pairwise_giou``."""
    area1, area2 = _areas(boxes1), _areas(boxes2)
    overlap = (torch.minimum(boxes1[..., 2:], boxes2[..., 2:]) - torch.maximum(boxes1[..., :2], boxes2[..., :2])).clamp(min=0).prod(-1)
    union = area1 + area2 - overlap
    hull_area = (torch.maximum(boxes1[..., 2:], boxes2[..., 2:]) - torch.minimum(boxes1[..., :2], boxes2[..., :2])).clamp(min=0).prod(-1)
    return overlap / union - (hull_area - union) / hull_area


def sine_position_grid(height: int, width: int, dim: int, temperature: float = 10000.0, device=None) -> torch.Tensor:
    """The fixed 2-D sine-cosine embedding of RT-DETR's AIFI, ``1 × (height·width) × dim``.

    Four equal quarters: ``sin(u·ω), cos(u·ω), sin(v·ω), cos(v·ω)`` with ``ω_k = temperature^(-k/(dim/4))``.
    The published code builds ``u, v`` with ``meshgrid(arange(w), arange(h), indexing="ij")``
    and flattens that ``w × h`` grid, so token ``t`` (row-major over the ``h × w`` feature map)
    gets ``u = t // h`` and ``v = t % h``; on square maps this is the transposed grid. Trained
    weights expect exactly this assignment, so it is kept.
    """
    if dim % 4:
        raise ValueError(f"the sine-cosine position embedding needs a dimension divisible by 4, got {dim}")
    quarter = dim // 4
    token = torch.arange(height * width, device=device)
    u = torch.div(token, height, rounding_mode="floor").to(torch.float32)
    v = (token % height).to(torch.float32)
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32, device=device) / quarter)
    u_angles, v_angles = u[:, None] * omega[None], v[:, None] * omega[None]
    return torch.cat([u_angles.sin(), u_angles.cos(), v_angles.sin(), v_angles.cos()], dim=1)[None]
