"""Convolutional blocks of the hybrid encoder's cross-scale fusion (CCFM) in the RT-DETR family.

- ``RepConvBlock``: a 3×3 and a 1×1 conv-BN in parallel, summed, then the activation (RepVGG;
  ``fuse`` folds both branches into one 3×3 conv for inference).
- ``CSPRepFusion``: RT-DETR's fusion block (the CSPRepLayer of the paper's Fig. 4): two 1×1 paths,
  one through ``n`` RepConvBlocks, added, then a 1×1 output conv when the hidden width differs.
- ``ELANFusion``: D-FINE's fusion block (its RepNCSPELAN4): a 1×1 conv split in two halves; the
  second half runs through two stages (a CSPRepFusion and a 3×3 conv each); the halves and both
  stage outputs are concatenated and fused by a 1×1 conv.
- ``SeparableDownsample``: D-FINE's stride-2 downsampling (SCDown): 1×1 conv-BN, then a depthwise
  3×3 stride-2 conv-BN, no activation.

Every conv is ``zoo_core.nn.conv.ConvNormAct`` with PyTorch's BatchNorm defaults (eps 1e-5,
momentum 0.1) as in the published models.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo_core.nn.conv import ConvNormAct, make_activation

__all__ = ["conv_bn", "RepConvBlock", "CSPRepFusion", "ELANFusion", "SeparableDownsample"]


def conv_bn(in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1, *, groups: int = 1, activation: str | None = None) -> ConvNormAct:
    """Bias-free conv → BatchNorm2d (eps 1e-5, momentum 0.1) → activation (None: none)."""
    return ConvNormAct(
        in_channels, out_channels, kernel_size, stride, groups=groups, activation=activation, bn_eps=1e-5, bn_momentum=0.1
    )


class RepConvBlock(nn.Module):
    """``act(BN(conv3×3(x)) + BN(conv1×1(x)))``; ``fuse()`` turns it into one biased 3×3 conv."""

    def __init__(self, in_channels: int, out_channels: int, activation: str | None = "silu") -> None:
        super().__init__()
        self.conv3x3 = conv_bn(in_channels, out_channels, 3)
        self.conv1x1 = conv_bn(in_channels, out_channels, 1)
        self.act = make_activation(activation)
        self.fused: nn.Conv2d | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.act(self.fused(x))
        return self.act(self.conv3x3(x) + self.conv1x1(x))

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold both branches and their BatchNorms (eval statistics) into ``self.fused``."""
        kernel, bias = 0, 0
        for branch in (self.conv3x3, self.conv1x1):
            conv, norm = branch[0], branch[1]
            scale = norm.weight / (norm.running_var + norm.eps).sqrt()
            weight = conv.weight * scale[:, None, None, None]
            if weight.shape[-1] == 1:
                weight = nn.functional.pad(weight, [1, 1, 1, 1])
            kernel = kernel + weight
            bias = bias + norm.bias - norm.running_mean * scale
        out_channels, in_channels = kernel.shape[:2]
        self.fused = nn.Conv2d(in_channels, out_channels, 3, padding=1).to(kernel)
        self.fused.weight.copy_(kernel)
        self.fused.bias.copy_(bias)
        del self.conv3x3, self.conv1x1
        self.conv3x3 = self.conv1x1 = None  # type: ignore[assignment]


class CSPRepFusion(nn.Module):
    """``out(blocks(branch(x)) + shortcut(x))`` with ``hidden = int(out_channels · expansion)``."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int = 3, expansion: float = 1.0, activation: str = "silu") -> None:
        super().__init__()
        hidden = int(out_channels * expansion)
        self.branch = conv_bn(in_channels, hidden, activation=activation)
        self.shortcut = conv_bn(in_channels, hidden, activation=activation)
        self.blocks = nn.Sequential(*(RepConvBlock(hidden, hidden, activation) for _ in range(num_blocks)))
        self.output = conv_bn(hidden, out_channels, activation=activation) if hidden != out_channels else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.blocks(self.branch(x)) + self.shortcut(x))


class ELANFusion(nn.Module):
    """D-FINE's GELAN-style fusion block.

    Args:
        in_channels, out_channels: block input and output widths.
        split_channels: width of the entry 1×1 conv (split into two equal halves).
        stage_channels: width of each of the two stages.
        num_blocks: RepConvBlocks in each stage's CSPRepFusion.
    """

    def __init__(
        self, in_channels: int, out_channels: int, split_channels: int, stage_channels: int, num_blocks: int = 3, activation: str = "silu"
    ) -> None:
        super().__init__()
        self.half = split_channels // 2
        self.entry = conv_bn(in_channels, split_channels, activation=activation)
        self.stage1 = nn.Sequential(
            CSPRepFusion(self.half, stage_channels, num_blocks, 1.0, activation),
            conv_bn(stage_channels, stage_channels, 3, activation=activation),
        )
        self.stage2 = nn.Sequential(
            CSPRepFusion(stage_channels, stage_channels, num_blocks, 1.0, activation),
            conv_bn(stage_channels, stage_channels, 3, activation=activation),
        )
        self.merge = conv_bn(split_channels + 2 * stage_channels, out_channels, activation=activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.entry(x).split((self.half, self.half), dim=1)
        third = self.stage1(second)
        fourth = self.stage2(third)
        return self.merge(torch.cat([first, second, third, fourth], dim=1))


class SeparableDownsample(nn.Module):
    """Stride-``stride`` downsampling by a 1×1 conv-BN and a depthwise ``kernel×kernel`` conv-BN."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 2) -> None:
        super().__init__()
        self.pointwise = conv_bn(in_channels, out_channels)
        self.depthwise = conv_bn(out_channels, out_channels, kernel_size, stride, groups=out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.depthwise(self.pointwise(x))
