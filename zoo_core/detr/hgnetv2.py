"""HGNetV2 (PP-HGNetV2, PaddleClas) as a multi-level backbone, built from timm's implementation.

timm's ``hgnetv2_b0`` … ``hgnetv2_b6`` are exactly the networks of D-FINE/DEIM/RT-DETRv4 (B0–B5)
and of RT-DETR's HGNetv2-L/X (= B4/B5): the v2 stem (3×3 s2 conv, a 2×2 conv pair beside a
2×2 max-pool on the zero-padded map, concatenation, 3×3 s2 and 1×1 convs), four stages of
HG blocks (``layer_num`` 3×3 convs — or, from stage 3, "light" 1×1 + depthwise 5×5 blocks —
whose outputs are all concatenated and aggregated by a 1×1 squeeze and a 1×1 excitation conv,
residual from the second block of a stage), depthwise 3×3 s2 downsampling between stages, and
the learnable affine block (LAB: ``scale·x + bias`` after each activation) in B0–B3 only.
Only the stem and stages are kept (no classifier head); parameter names are timm's
(``stem.*``, ``stages.*``), which are also D-FINE's. Always built without pretrained weights.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["HGNetV2Backbone"]

_OUT_CHANNELS = {
    "hgnetv2_b0": (64, 256, 512, 1024),
    "hgnetv2_b1": (64, 256, 512, 1024),
    "hgnetv2_b2": (96, 384, 768, 1536),
    "hgnetv2_b3": (128, 512, 1024, 2048),
    "hgnetv2_b4": (128, 512, 1024, 2048),
    "hgnetv2_b5": (128, 512, 1024, 2048),
    "hgnetv2_b6": (192, 512, 1024, 2048),
}


class HGNetV2Backbone(nn.Module):
    """The stage outputs ``return_stages`` (0-based; strides 4, 8, 16, 32) of timm's ``name``."""

    def __init__(self, name: str, return_stages: Sequence[int] = (1, 2, 3)) -> None:
        super().__init__()
        if name not in _OUT_CHANNELS:
            raise ValueError(f"unknown HGNetV2 variant {name!r}; choose one of {', '.join(_OUT_CHANNELS)}")
        import timm

        network = timm.create_model(name, pretrained=False, num_classes=0)
        self.stem = network.stem
        self.stages = network.stages
        self.return_stages = tuple(return_stages)
        self.out_channels = tuple(_OUT_CHANNELS[name][i] for i in self.return_stages)
        self.out_strides = tuple(4 * 2**i for i in self.return_stages)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(images)
        outputs = []
        for index, stage in enumerate(self.stages):
            x = stage(x)
            if index in self.return_stages:
                outputs.append(x)
            if index >= self.return_stages[-1]:
                break
        return outputs
