"""DEIMv2's backbones: pruned HGNetv2 (Atto, Femto, Pico), HGNetv2-B0 (N) and DINOv3 + STA (S-X).

- ``PrunedHGNetV2``: timm's HGNetv2 stem and stages (``timm.models.hgnet``: the exact PP-HGNetV2
  blocks, LAB included) with DEIMv2's own stage table: B0's first two stages and a third stage of
  its own width, kernel and depth (Atto: 256 wide, 3×3 kernels; Femto: 512, 5×5, one block;
  Pico: B0's third stage), no fourth stage. Only the stride-16 map is used.
- ``DINOv3Adapter``: a ViT whose blocks ``taps`` give three stride-16 token maps, bilinearly
  resized to strides 8, 16 and 32, each concatenated with a map of the **Spatial Tuning Adapter**
  (a light conv stem: 3×3/2 conv-BN-GELU, 3×3/2 max-pool, then three 3×3/2 conv-BN with GELU
  between them, widths c, 2c, 4c, 4c) and projected by a 1×1 conv-BN to the encoder width. The
  ViT is DEIMv2's distilled ViT-Tiny / Tiny+ (S, M; ``zoo_core.detr_vit.rope_vit.RopeViT``) or
  DINOv3 ViT-S/16 / S+/16 from timm (L, X; ``vit_small[_plus]_patch16_dinov3_qkvb``: q and v
  biases, the key bias fixed at zero as DINOv3's masked one, four register tokens, layer scale,
  final norm applied to the taps, train-time RoPE coordinate rescaling in [1/2, 2]).

DINOv3-backed sizes take ImageNet-normalised input; the adapter normalises the [0, 1] images it
receives (the detect task's contract).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.detr.fusion_blocks import conv_bn
from zoo_core.detr_vit.rope_vit import RopeViT

__all__ = ["PrunedHGNetV2", "DINOv3Adapter", "SpatialTuningAdapter", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class PrunedHGNetV2(nn.Module):
    """HGNetv2 from a stage table (``[in, mid, out, blocks, downsample, light, kernel, layers]`` rows).

    Args:
        stem: ``[mid, out]`` widths of the v2 stem.
        stages: one row per stage (timm's ``model_cfgs`` layout).
        return_stages: stage indices whose outputs are returned (strides 4, 8, 16, 32 for 0-3).
    """

    def __init__(self, stem: Sequence[int], stages: Sequence[Sequence[Any]], return_stages: Sequence[int], use_lab: bool = True) -> None:
        super().__init__()
        from timm.models.hgnet import HighPerfGpuStage, StemV2

        self.stem = StemV2(3, int(stem[0]), int(stem[1]), use_lab=use_lab)
        built = []
        for row in stages:
            in_chs, mid_chs, out_chs, blocks, downsample, light, kernel, layers = row
            built.append(HighPerfGpuStage(
                int(in_chs), int(mid_chs), int(out_chs), int(blocks), int(layers), downsample=bool(downsample),
                light_block=bool(light), kernel_size=int(kernel), use_lab=use_lab, agg="se",
            ))
        self.stages = nn.Sequential(*built)
        self.return_stages = tuple(int(i) for i in return_stages)
        self.out_channels = tuple(int(stages[i][2]) for i in self.return_stages)

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


class SpatialTuningAdapter(nn.Module):
    """DEIMv2's STA: detail maps at strides 8 (2c), 16 (4c) and 32 (4c) from a light conv stem."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        c = channels

        def conv(cin: int, cout: int) -> nn.Conv2d:
            return nn.Conv2d(cin, cout, 3, 2, 1, bias=False)

        self.stem = nn.Sequential(conv(3, c), nn.BatchNorm2d(c), nn.GELU(), nn.MaxPool2d(3, 2, 1))
        self.to_stride8 = nn.Sequential(conv(c, 2 * c), nn.BatchNorm2d(2 * c))
        self.to_stride16 = nn.Sequential(nn.GELU(), conv(2 * c, 4 * c), nn.BatchNorm2d(4 * c))
        self.to_stride32 = nn.Sequential(nn.GELU(), conv(4 * c, 4 * c), nn.BatchNorm2d(4 * c))
        self.out_channels = (2 * c, 4 * c, 4 * c)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        stride8 = self.to_stride8(self.stem(images))
        stride16 = self.to_stride16(stride8)
        return [stride8, stride16, self.to_stride32(stride16)]


class DINOv3Adapter(nn.Module):
    """ViT taps + STA → three ``out_channels`` maps at strides 8, 16, 32 (see the module docstring).

    Config keys: ``vit`` (``"tiny"``: RopeViT with ``dim``/``heads``; or a timm model name), ``taps``,
    ``detail_channels`` (the STA's c), ``out_channels`` (default: the ViT width).
    """

    patch_size = 16

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.taps = tuple(int(i) for i in config["taps"])
        vit = str(config["vit"])
        if vit == "tiny":
            dim = int(config["dim"])
            patch = nn.Conv2d(3, dim, self.patch_size, self.patch_size)
            self.vit: nn.Module = RopeViT(patch, dim, 12, int(config["heads"]), self.taps)
            self.timm_vit = False
        else:
            import timm

            self.vit = timm.create_model(vit, pretrained=False, num_classes=0, dynamic_img_size=True, rope_rescale_coords=2.0)
            dim = int(self.vit.embed_dim)
            self.timm_vit = True
        self.embed_dim = dim
        self.detail = SpatialTuningAdapter(int(config["detail_channels"]))
        out = int(config.get("out_channels", dim))
        self.fuse = nn.ModuleList(conv_bn(dim + detail, out) for detail in self.detail.out_channels)
        self.out_channels = (out, out, out)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).reshape(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).reshape(1, 3, 1, 1), persistent=False)

    def semantic_maps(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The tapped blocks' patch tokens as ``(B, dim, H/16, W/16)`` maps."""
        if self.timm_vit:
            return self.vit.forward_intermediates(images, indices=list(self.taps), norm=True, output_fmt="NCHW", intermediates_only=True)
        tokens, (height, width) = self.vit(images)
        return [t.transpose(1, 2).reshape(t.shape[0], self.embed_dim, height, width) for t in tokens]

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        images = (images - self.mean.to(images.dtype)) / self.std.to(images.dtype)
        maps = self.semantic_maps(images)
        height, width = maps[0].shape[2], maps[0].shape[3]
        sizes = [(height * 2, width * 2), (height, width), (height // 2, width // 2)]
        semantic = [F.interpolate(m, size=size, mode="bilinear", align_corners=False) for m, size in zip(maps, sizes)]
        details = self.detail(images)
        return [fuse(torch.cat([s, d], dim=1)) for fuse, s, d in zip(self.fuse, semantic, details)]
