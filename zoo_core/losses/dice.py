"""The dice loss of instance masks (Milletari et al., V-Net, 2016), in mmdetection's form.

``1 - 2·Σ(p·t) / (Σp² + eps + Σt² + eps)`` per mask, ``p`` the predicted probabilities (sigmoid of
the logits) and ``t`` the binary target, summed over the pixels. mmdetection's ``DiceLoss`` with
``naive_dice=False`` (squared sums in the denominator); RTMDet-Ins uses ``eps=5e-6``.
"""

from __future__ import annotations

import torch

__all__ = ["dice_loss"]


def dice_loss(logits: torch.Tensor, targets: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """Per-mask dice loss (shape n) of ``logits`` n×h×w against ``targets`` n×h×w in {0, 1}, in float32."""
    if logits.shape != targets.shape:
        raise ValueError(f"dice_loss needs logits and targets of one shape, got {tuple(logits.shape)} and {tuple(targets.shape)}")
    probabilities = logits.float().sigmoid().flatten(1)
    targets = targets.float().flatten(1)
    overlap = (probabilities * targets).sum(dim=1)
    denominator = (probabilities.square().sum(dim=1) + eps) + (targets.square().sum(dim=1) + eps)
    return 1.0 - 2.0 * overlap / denominator
