"""Pixel losses for image restoration, each a mean over images (never scaled by the batch size).

- ``psnr_loss``: NAFNet's training loss (Chen et al., ECCV 2022, official SIDD/GoPro configs use
  ``PSNRLoss`` with weight 1): the negative PSNR of each image for a peak value of 1, averaged over
  the batch. Minimising it maximises the mean per-image PSNR, which weights every image equally
  whatever its error level (unlike a batch MSE).
- ``charbonnier_loss``: the smooth L1 ``sqrt(d² + ε²)`` used by MPRNet and Restormer.
"""

from __future__ import annotations

import torch

__all__ = ["per_image_mse", "psnr_loss", "charbonnier_loss"]


def _check_pair(prediction: torch.Tensor, target: torch.Tensor) -> None:
    if prediction.shape != target.shape:
        raise ValueError(
            f"prediction {tuple(prediction.shape)} and target {tuple(target.shape)} must have the same shape; "
            "a restoration model must return images the size of its input"
        )
    if prediction.dim() < 2:
        raise ValueError(f"expected a batch of images N×C×H×W, got shape {tuple(prediction.shape)}")


def per_image_mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error of each image of the batch (shape N), over all its channels and pixels."""
    _check_pair(prediction, target)
    return (prediction - target).pow(2).flatten(1).mean(dim=1)


def psnr_loss(prediction: torch.Tensor, target: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Minus the mean per-image PSNR in dB for images in [0, 1]: ``mean_i 10·log10(MSE_i + eps)``.

    ``eps`` keeps the logarithm finite on a perfect reconstruction (it caps the PSNR at 80 dB).
    """
    return (10.0 * torch.log10(per_image_mse(prediction, target) + eps)).mean()


def charbonnier_loss(prediction: torch.Tensor, target: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """Mean over images of the per-pixel Charbonnier penalty ``sqrt((prediction - target)² + eps²)``."""
    _check_pair(prediction, target)
    penalty = torch.sqrt((prediction - target).pow(2) + eps * eps)
    return penalty.flatten(1).mean(dim=1).mean()
