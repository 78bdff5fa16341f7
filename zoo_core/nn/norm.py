"""Normalisation layers for channels-first (N×C×H×W) feature maps, and the BatchNorm momentum option."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

__all__ = ["BN_MOMENTUM_OPTION", "LayerNorm2d", "apply_batchnorm_momentum_option"]

# The build option that sets every BatchNorm's running-statistics momentum. The YOLO lines publish
# 0.03, which suits runs of hundreds of epochs; a run of a hundred steps (a quick fine-tune, the
# suite's learning tests) needs torch's 0.1, or its eval-mode statistics still lag the weights.
BN_MOMENTUM_OPTION = "bn_momentum"


def apply_batchnorm_momentum_option(model: nn.Module, options: Mapping[str, Any], *, family: str) -> nn.Module:
    """Give every BatchNorm of ``model`` the momentum of ``options["bn_momentum"]``, when given.

    Raises a ``ValueError`` naming the family and the option for anything but a number in (0, 1].
    Returns ``model``.
    """
    if BN_MOMENTUM_OPTION not in options:
        return model
    momentum = options[BN_MOMENTUM_OPTION]
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 < momentum <= 1:
        raise ValueError(f"{family} option {BN_MOMENTUM_OPTION!r} must be a number in (0, 1], got {momentum!r}")
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.momentum = float(momentum)
    return model


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
