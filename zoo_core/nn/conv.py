"""Convolution + BatchNorm + activation, the block most convolutional families are made of."""

from __future__ import annotations

from typing import Callable

from torch import nn

__all__ = ["ConvNormAct", "autopad", "make_activation"]

_ACTIVATIONS: dict[str, Callable[[bool], nn.Module]] = {
    "silu": lambda inplace: nn.SiLU(inplace=inplace),
    "relu": lambda inplace: nn.ReLU(inplace=inplace),
    "relu6": lambda inplace: nn.ReLU6(inplace=inplace),
    "leaky_relu": lambda inplace: nn.LeakyReLU(0.1, inplace=inplace),
    "gelu": lambda inplace: nn.GELU(),
    "hardswish": lambda inplace: nn.Hardswish(inplace=inplace),
}


def make_activation(name: str | None, *, inplace: bool = True) -> nn.Module:
    """An activation module by name (``None`` or ``"identity"``: no activation).

    In place by default, which saves a tensor after a convolution. After an ``nn.Linear`` on
    3-D input pass ``inplace=False``: that output is a view of a 2-D matmul, and an in-place op
    on a view makes autograd copy the whole base back in the backward pass (``CopySlices``;
    about 5 % of an RF-DETR-N training step).
    """
    if name is None or name == "identity":
        return nn.Identity()
    try:
        return _ACTIVATIONS[name](inplace)
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(_ACTIVATIONS)} or None") from None


def autopad(kernel_size: int, dilation: int = 1) -> int:
    """Padding that keeps the spatial size at stride 1 ("same" padding for odd kernels)."""
    return dilation * (kernel_size - 1) // 2


class ConvNormAct(nn.Sequential):
    """``Conv2d`` (no bias) → ``BatchNorm2d`` → activation; ``norm=False`` gives a biased conv."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 1,
        stride: int = 1,
        padding: int | None = None,
        *,
        groups: int = 1,
        dilation: int = 1,
        activation: str | None = "silu",
        norm: bool = True,
        bn_eps: float = 1e-3,
        bn_momentum: float = 0.03,
    ) -> None:
        padding = autopad(kernel_size, dilation) if padding is None else padding
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, dilation=dilation, groups=groups, bias=not norm)
        ]
        if norm:
            layers.append(nn.BatchNorm2d(out_channels, eps=bn_eps, momentum=bn_momentum))
        layers.append(make_activation(activation))
        super().__init__(*layers)
        self.out_channels = out_channels
