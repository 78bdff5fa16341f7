"""DEIMv2's two-scale LiteEncoder (Atto, Femto, Pico): no attention, one fusion step each way.

From the backbone's single stride-16 map (1×1 conv-BN projection to ``hidden``):

1. a stride-32 map: 3×3/2 average pooling, 1×1 conv-BN-SiLU, then the "global" fusion: add the
   map's global average and apply a 1×1 conv-BN-SiLU (YOLOv6's BiFusion simplification);
2. top-down: stride-16 map + the stride-32 map upsampled ×2 (nearest) → split ELAN block;
3. bottom-up: stride-32 map + the step-2 output downsampled like step 1 → split ELAN block.

Both ELAN blocks are ``zoo_core.detr_vit.fusion.SplitELANBlock`` with a 3×3 conv after each
stage (DEIMv2's ``RepNCSPELAN4`` with ``csp2``).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.detr.fusion_blocks import conv_bn
from zoo_core.detr_vit.fusion import SplitELANBlock

__all__ = ["LiteEncoder"]


class LiteEncoder(nn.Module):
    """``[stride-16 map]`` → ``[stride-16, stride-32]`` maps of ``hidden_dim`` channels."""

    def __init__(self, in_channels: Sequence[int], hidden_dim: int, expansion: float, depth_mult: float, activation: str = "silu") -> None:
        super().__init__()
        if len(in_channels) != 1:
            raise ValueError(f"the LiteEncoder takes one backbone map, got {len(in_channels)}")
        self.input_projection = conv_bn(int(in_channels[0]), hidden_dim)
        self.downsample_coarse = nn.Sequential(nn.AvgPool2d(3, 2, 1), conv_bn(hidden_dim, hidden_dim, activation=activation))
        self.downsample_fused = nn.Sequential(nn.AvgPool2d(3, 2, 1), conv_bn(hidden_dim, hidden_dim, activation=activation))
        self.global_fusion = conv_bn(hidden_dim, hidden_dim, activation=activation)
        blocks = round(3 * depth_mult)
        stage = round(expansion * hidden_dim // 2)
        self.top_down = SplitELANBlock(hidden_dim, hidden_dim, 2 * hidden_dim, stage, blocks, activation, stage_conv=True)
        self.bottom_up = SplitELANBlock(hidden_dim, hidden_dim, 2 * hidden_dim, stage, blocks, activation, stage_conv=True)
        self.out_channels = (hidden_dim, hidden_dim)

    def forward(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        fine = self.input_projection(features[0])
        coarse = self.downsample_coarse(fine)
        coarse = self.global_fusion(coarse + F.adaptive_avg_pool2d(coarse, 1))
        fine_out = self.top_down(fine + F.interpolate(coarse, scale_factor=2.0, mode="nearest"))
        coarse_out = self.bottom_up(coarse + self.downsample_fused(fine_out))
        return [fine_out, coarse_out]
