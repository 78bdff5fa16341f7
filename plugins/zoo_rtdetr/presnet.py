"""PResNet, RT-DETR's ResNet-D backbone (He et al., "Bag of Tricks", 2019, variant D).

ResNet-18/34 (basic blocks) and 50/101 (bottlenecks) with the D tweaks: a stem of three 3×3
convs (32, 32, 64 channels, the first at stride 2) then a 3×3 stride-2 max-pool; the stride of
a bottleneck on its 3×3 conv; and stride-2 shortcuts as 2×2 average pooling (ceil mode) then a
1×1 conv-BN. Every stage's first block has a projection shortcut (stride 1 in the first
stage). timm's ``resnet18d``/``resnet34d`` have no projection on the first stage (64 → 64 at
stride 1), so their parameters differ; the network is built here.
BatchNorm everywhere (eps 1e-5); the published recipe freezes the BatchNorms of R50/R101.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from zoo_core.detr.fusion_blocks import conv_bn

__all__ = ["PResNet", "DEPTHS"]

DEPTHS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}
_WIDTHS = (64, 128, 256, 512)


class _Block(nn.Module):
    """A residual block; ``bottleneck`` chooses 1×1-3×3-1×1 (×4 output) over 3×3-3×3."""

    def __init__(self, in_channels: int, width: int, stride: int, projection: bool, bottleneck: bool) -> None:
        super().__init__()
        out_channels = width * 4 if bottleneck else width
        if bottleneck:
            self.conv1 = conv_bn(in_channels, width, 1, activation="relu")
            self.conv2 = conv_bn(width, width, 3, stride, activation="relu")
            self.conv3 = conv_bn(width, out_channels, 1)
        else:
            self.conv1 = conv_bn(in_channels, width, 3, stride, activation="relu")
            self.conv2 = conv_bn(width, width, 3)
            self.conv3 = None
        self.pool = nn.AvgPool2d(2, 2, 0, ceil_mode=True) if projection and stride == 2 else None
        self.projection = conv_bn(in_channels, out_channels, 1, 1 if self.pool is not None else stride) if projection else None
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.conv1(x))
        if self.conv3 is not None:
            out = self.conv3(out)
        shortcut = x
        if self.projection is not None:
            shortcut = self.projection(self.pool(x) if self.pool is not None else x)
        return self.act(out + shortcut)


class PResNet(nn.Module):
    """ResNet-D of ``depth`` 18, 34, 50 or 101 returning the stages ``return_stages`` (strides 4..32)."""

    def __init__(self, depth: int, return_stages: Sequence[int] = (1, 2, 3)) -> None:
        super().__init__()
        if depth not in DEPTHS:
            raise ValueError(f"PResNet depth must be one of {sorted(DEPTHS)}, got {depth}")
        bottleneck = depth >= 50
        self.stem = nn.Sequential(
            conv_bn(3, 32, 3, 2, activation="relu"), conv_bn(32, 32, 3, 1, activation="relu"), conv_bn(32, 64, 3, 1, activation="relu")
        )
        self.pool = nn.MaxPool2d(3, 2, 1)
        stages, channels = [], 64
        for index, (blocks, width) in enumerate(zip(DEPTHS[depth], _WIDTHS)):
            stride = 1 if index == 0 else 2
            stage = []
            for block in range(blocks):
                stage.append(_Block(channels, width, stride if block == 0 else 1, block == 0, bottleneck))
                channels = width * 4 if bottleneck else width
            stages.append(nn.Sequential(*stage))
        self.stages = nn.ModuleList(stages)
        self.return_stages = tuple(return_stages)
        expansion = 4 if bottleneck else 1
        self.out_channels = tuple(_WIDTHS[i] * expansion for i in self.return_stages)
        self.out_strides = tuple(4 * 2**i for i in self.return_stages)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        x = self.pool(self.stem(images))
        outputs = []
        for index, stage in enumerate(self.stages):
            x = stage(x)
            if index in self.return_stages:
                outputs.append(x)
        return outputs
