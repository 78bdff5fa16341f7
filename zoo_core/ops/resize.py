"""Resizing dense predictions: logits (or any N×C×h×w map) to another spatial size.

Segmentation networks predict at a fraction of the input resolution, losses compare with masks
at label resolution, and sliding-window inference stitches crops; all of them resize class maps
the same way: bilinearly with ``align_corners=False``, the convention of the segmentation
toolkits whose weights zoo loads.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["resize_logits"]


def resize_logits(logits: torch.Tensor, size: Sequence[int] | torch.Size) -> torch.Tensor:
    """``logits`` (N×C×h×w) bilinearly resized to ``size`` = (H, W) (align_corners=False); unchanged if already that size."""
    if tuple(logits.shape[-2:]) == tuple(size):
        return logits
    return F.interpolate(logits, size=tuple(size), mode="bilinear", align_corners=False)
