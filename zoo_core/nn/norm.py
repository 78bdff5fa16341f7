"""Normalisation layers for channels-first (N×C×H×W) feature maps."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LayerNorm2d"]


class LayerNorm2d(nn.Module):
    """Layer normalisation over the channel dimension of an N×C×H×W tensor, per pixel.

    Equal to ``F.layer_norm`` applied to ``x.permute(0, 2, 3, 1)`` over its last dimension, then
    permuted back, but computed in place along dim 1 so no layout change is needed. The variance
    is the biased one (divided by C), as in ``nn.LayerNorm``. The backward is autograd's through
    plain tensor operations. ``weight`` starts at one and ``bias`` at zero.
    """

    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        if num_channels <= 0:
            raise ValueError(f"num_channels must be a positive channel count, got {num_channels}")
        self.num_channels = num_channels
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise each pixel's channel vector of ``x`` (N×C×H×W) and apply the affine map."""
        if x.dim() != 4 or x.shape[1] != self.num_channels:
            raise ValueError(
                f"LayerNorm2d({self.num_channels}) expects an N×{self.num_channels}×H×W tensor, "
                f"got shape {tuple(x.shape)}"
            )
        mean = x.mean(dim=1, keepdim=True)
        centred = x - mean
        variance = centred.pow(2).mean(dim=1, keepdim=True)
        normalised = centred * torch.rsqrt(variance + self.eps)
        return normalised * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)

    def extra_repr(self) -> str:
        """Channel count and epsilon, shown in the module's repr."""
        return f"{self.num_channels}, eps={self.eps}"
