"""Activation-free gates of NAFNet (Chen et al., ECCV 2022) and the restoration nets built on it.

Both gates replace a nonlinearity by a multiplication: ``SimpleGate`` multiplies two halves of
the channels, ``SimplifiedChannelAttention`` rescales channels by a linear map of their global
average, without the ReLU/sigmoid of squeeze-and-excitation.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SimpleGate", "SimplifiedChannelAttention"]


class SimpleGate(nn.Module):
    """Split the channels of an N×2C×H×W tensor into two halves and return their product (N×C×H×W)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The element-wise product of the first and second channel halves of ``x``."""
        if x.dim() < 2 or x.shape[1] % 2:
            raise ValueError(f"SimpleGate needs an even number of channels in dim 1, got shape {tuple(x.shape)}")
        first, second = x.chunk(2, dim=1)
        return first * second


class SimplifiedChannelAttention(nn.Module):
    """Multiply each channel by a 1×1 convolution of the channels' spatial means (no activation)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.project = nn.Conv2d(channels, channels, kernel_size=1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (N×C×H×W) rescaled per image and channel."""
        return x * self.project(self.pool(x))
