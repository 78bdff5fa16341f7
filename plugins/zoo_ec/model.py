"""EdgeCrafter ECDet (Liu et al., "EdgeCrafter: Compact ViTs for Edge Dense Prediction via Task-Specialized
Distillation", TMLR 2026, arXiv:2603.18739; Intellindust-AI-Lab/EdgeCrafter, Apache-2.0).

- **ECViT** backbone: a 12-block RoPE ViT (``zoo_core.detr_vit.rope_vit.RopeViT``, one register
  token) whose stride-16 tokens come from a conv pyramid (three 3×3/2 conv-BN-ReLU to widths
  E/8, E/4, E/2, then a biased 3×3/2 conv to E). The outputs of the last two blocks are averaged,
  reshaped to a stride-16 map and bilinearly resampled to strides 8, 16 and 32; S/M project only
  the stride-32 map (1×1 conv-BN, E → E), L/X project all three to 256.
- Hybrid encoder (``zoo_core.detr_vit.fusion.vit_hybrid_encoder``): AIFI with SiLU on stride 32,
  split-ELAN fusion blocks without stage convs, summed fusion; no input projections.
- D-FINE-style decoder (``zoo_core.detr_vit.decoder.ViTDistributionDecoder``, LayerNorm layers with
  D-FINE's gateway, SiLU everywhere): 4 layers, 300 queries, points (3, 6, 3), FDR reg_max 32.
- Criterion: D-FINE's with MAL (γ 1.5; LibreYOLO 1.6's EC trainer uses γ 2) + L1/GIoU + FGL/DDF,
  Hungarian matching with the GO-LSD union (``zoo_core.detr.criterion.SetCriterion``).

Inputs are ImageNet-normalised inside the model (zoo images are in [0, 1]).

Registry ``config``: ``{embed_dim, heads, mlp_ratio, proj_dim, encoder: {hidden_dim, ffn_dim,
expansion, depth_mult}, decoder: {dim, ffn_dim}}``. Build options: ``num_queries``, ``num_denoising`` (published 300, 100).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.building import BuildRequest
from zoo_core.detr.criterion import CriterionConfig, SetCriterion
from zoo_core.detr.deploy import deploy_parameter_count, folded_norm_savings
from zoo_core.detr.detector import DETRDetector
from zoo_core.detr.fusion_blocks import conv_bn
from zoo_core.detr_vit.decoder import ViTDistributionDecoder
from zoo_core.detr_vit.fusion import vit_hybrid_encoder
from zoo_core.detr_vit.rope_vit import RopeViT

__all__ = ["ECViTBackbone", "ConvPyramidEmbedding", "ECDetector", "build_ec", "CRITERION", "BUILD_OPTIONS"]

#: MAL (γ 1.5) 1, L1 5, GIoU 2, FGL 0.15, DDF 1.5, GO-LSD union; matcher 2/5/2 (focal α .25, γ 2) — ecdet.yml.
CRITERION = CriterionConfig(classification="mal", gamma=1.5, mal_alpha=None, go_union=True)
BUILD_OPTIONS = ("num_queries", "num_denoising")
TAPS, DEPTH, NUM_QUERIES, NUM_HEADS, NUM_LAYERS, POINTS = (10, 11), 12, 300, 8, 4, (3, 6, 3)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class ConvPyramidEmbedding(nn.Module):
    """ECViT's stem: three 3×3/2 conv-BN-ReLU (E/8, E/4, E/2) then a biased 3×3/2 conv to E (stride 16)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        widths = [dim // 8, dim // 4, dim // 2]
        self.convs = nn.Sequential(*(conv_bn(cin, cout, 3, 2, activation="relu") for cin, cout in zip([3, *widths[:-1]], widths)))
        self.proj = nn.Conv2d(widths[-1], dim, 3, 2, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(self.convs(images))


class ECViTBackbone(nn.Module):
    """ECViT + its adapter: three maps at strides 8, 16, 32 (see the module docstring)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, proj_dim: int | None = None) -> None:
        super().__init__()
        self.vit = RopeViT(ConvPyramidEmbedding(dim), dim, DEPTH, num_heads, TAPS, mlp_ratio=mlp_ratio)
        self.dim = dim
        if proj_dim is None:  # S, M: only the stride-32 map is projected (E → E)
            self.projections = nn.ModuleList([conv_bn(dim, dim)])
            self.out_channels = (dim, dim, dim)
        else:
            self.projections = nn.ModuleList(conv_bn(dim, proj_dim) for _ in range(3))
            self.out_channels = (proj_dim, proj_dim, proj_dim)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).reshape(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).reshape(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        images = (images - self.mean.to(images.dtype)) / self.std.to(images.dtype)
        tokens, (height, width) = self.vit(images)
        fused = torch.stack(tokens).mean(0).transpose(1, 2).reshape(images.shape[0], self.dim, height, width)
        sizes = [(height * 2, width * 2), (height, width), (height // 2, width // 2)]
        maps = [F.interpolate(fused, size=size, mode="bilinear", align_corners=False) for size in sizes]
        if len(self.projections) == 1:
            maps[-1] = self.projections[0](maps[-1])
            return maps
        return [projection(m) for projection, m in zip(self.projections, maps)]


class ECDetector(DETRDetector):
    """``DETRDetector`` counting EdgeCrafter's ``deploy()`` form (its README figures): the encoder's fusion
    blocks, ECViT's stem convs and the projectors have their BatchNorms folded; training-only heads go."""

    def published_parameter_count(self) -> int:
        return deploy_parameter_count(self) - folded_norm_savings([self.backbone.vit.patch_embed.convs, self.backbone.projections])


def _section(config: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = config.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: '{key}' must be a mapping, got {value!r}")
    return value


def build_ec(request: BuildRequest) -> ECDetector:
    """The registry builder of ``ec``."""
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"ec does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    where = f"registry.yaml ec size {request.size!r} config"
    config = request.config
    proj = config.get("proj_dim")
    backbone = ECViTBackbone(int(config["embed_dim"]), int(config["heads"]), float(config.get("mlp_ratio", 4.0)), None if proj is None else int(proj))
    enc, dec = _section(config, "encoder", where), _section(config, "decoder", where)
    encoder = vit_hybrid_encoder(
        backbone.out_channels, int(enc["hidden_dim"]), ffn_dim=int(enc["ffn_dim"]), expansion=float(enc["expansion"]),
        depth_mult=float(enc["depth_mult"]), aifi_activation="silu", stage_conv=False,
    )
    decoder = ViTDistributionDecoder(
        request.num_classes, encoder.out_channels, int(dec["dim"]), int(request.options.get("num_queries", NUM_QUERIES)), NUM_LAYERS,
        num_heads=NUM_HEADS, ffn_dim=int(dec["ffn_dim"]), points_per_level=POINTS, activation="silu", mlp_activation="silu",
        layer="layer_norm", gated=True, reg_max=32, reg_scale=4.0, num_denoising=int(request.options.get("num_denoising", 100)),
    )
    return ECDetector(backbone, encoder, decoder, SetCriterion(request.num_classes, CRITERION), size_multiple=32, published_form="deploy")
