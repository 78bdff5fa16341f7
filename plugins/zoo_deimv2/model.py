"""DEIMv2 (Huang et al., "Real-Time Object Detection Meets DINOv3", arXiv:2509.20787).

Eight sizes from one recipe: backbone → encoder → DEIM's FDR decoder (RMSNorm + SwiGLU layers) with
denoising, trained with DEIM's MAL criterion.

- Atto/Femto/Pico: pruned HGNetv2 (stride-16 map) → ``LiteEncoder`` (two levels) → decoder with
  plain residual cross-attention (no gateway), one shared distribution head, 100/150/200 queries.
- N: HGNetv2-B0 (strides 16, 32) → hybrid encoder (split-ELAN with stage convs, summed fusion).
- S/M: distilled ViT-Tiny / Tiny+ with the Spatial Tuning Adapter; L/X: DINOv3 ViT-S/16 / S+/16
  (timm) with the STA → hybrid encoder (split-ELAN, summed fusion) → 4 (X: 6) decoder layers.

Registry ``config`` of a size::

    backbone: {kind: hgnetv2, stem: [16, 16], stages: [[...], ...], return_stages: [2]}   # pruned
            | {kind: hgnetv2, name: hgnetv2_b0, return_stages: [2, 3]}                   # timm B0
            | {kind: dinov3, vit: tiny | <timm name>, dim, heads, taps, detail_channels, out_channels}
    encoder: {kind: lite | hybrid, hidden_dim, ffn_dim, expansion, depth_mult, stage_conv}
    decoder: {dim, ffn_dim, layers, points, queries, gated, shared_box_head}
    criterion: {go_union, local}

Build options: ``num_queries`` and ``num_denoising`` (fewer queries for small inputs or quick tests; published 300 / 100,
Atto-Pico 100 / 150 / 200 matching queries).
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from zoo_core.building import BuildRequest
from zoo_core.detr.detector import DETRDetector
from zoo_core.detr.hgnetv2 import HGNetV2Backbone
from zoo_core.detr_vit.decoder import ViTDistributionDecoder
from zoo_core.detr.deploy import deploy_parameter_count, folded_norm_savings
from zoo_core.detr_vit.fusion import vit_hybrid_encoder
from zoo_deimv2.backbones import DINOv3Adapter, PrunedHGNetV2
from zoo_deimv2.criterion import DEIMv2Criterion
from zoo_deimv2.lite_encoder import LiteEncoder

__all__ = ["DEIMv2Detector", "build_deimv2", "BUILD_OPTIONS"]

BUILD_OPTIONS = ("num_queries", "num_denoising")
NUM_HEADS, NUM_DENOISING, REG_MAX, REG_SCALE = 8, 100, 32, 4.0


class DEIMv2Detector(DETRDetector):
    """``DETRDetector`` counting what DEIMv2's ``deploy()`` form counts (its README and paper figures).

    ``zoo_core.detr.deploy`` folds the hybrid encoder's fusion blocks and drops the training-only
    decoder heads; the LiteEncoder's global-fusion conv is folded too (its other convs keep their
    BatchNorms in the published code).
    """

    def published_parameter_count(self) -> int:
        extra = folded_norm_savings([self.encoder.global_fusion]) if isinstance(self.encoder, LiteEncoder) else 0
        return deploy_parameter_count(self) - extra


def _section(config: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = config.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: '{key}' must be a mapping, got {value!r}")
    return value


def _backbone(spec: Mapping[str, Any], where: str) -> nn.Module:
    kind = spec.get("kind")
    if kind == "hgnetv2" and "stages" in spec:
        return PrunedHGNetV2(spec["stem"], spec["stages"], spec["return_stages"])
    if kind == "hgnetv2":
        return HGNetV2Backbone(str(spec["name"]), tuple(spec["return_stages"]))
    if kind == "dinov3":
        return DINOv3Adapter(spec)
    raise ValueError(f"{where}: backbone kind must be 'hgnetv2' or 'dinov3', got {kind!r}")


def build_deimv2(request: BuildRequest) -> DEIMv2Detector:
    """The registry builder of ``deimv2`` (see the module docstring for the config)."""
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"deimv2 does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    where = f"registry.yaml deimv2 size {request.size!r} config"
    config = request.config
    backbone = _backbone(_section(config, "backbone", where), where)
    enc, dec = _section(config, "encoder", where), _section(config, "decoder", where)
    crit = config.get("criterion", {})
    if enc.get("kind") == "lite":
        encoder: nn.Module = LiteEncoder(backbone.out_channels, int(enc["hidden_dim"]), float(enc["expansion"]), float(enc["depth_mult"]))
    elif enc.get("kind") == "hybrid":
        encoder = vit_hybrid_encoder(
            backbone.out_channels, int(enc["hidden_dim"]), ffn_dim=int(enc["ffn_dim"]), expansion=float(enc["expansion"]),
            depth_mult=float(enc["depth_mult"]), aifi_activation="gelu", stage_conv=bool(enc.get("stage_conv", False)),
        )
    else:
        raise ValueError(f"{where}: encoder kind must be 'lite' or 'hybrid', got {enc.get('kind')!r}")
    points = tuple(int(p) for p in dec["points"])
    if len(points) != len(encoder.out_channels):
        raise ValueError(f"{where}: decoder.points needs one count per level ({len(encoder.out_channels)}), got {points}")
    queries = int(request.options.get("num_queries", dec.get("queries", 300)))
    decoder = ViTDistributionDecoder(
        request.num_classes, encoder.out_channels, int(dec["dim"]), queries, int(dec["layers"]),
        num_heads=NUM_HEADS, ffn_dim=int(dec["ffn_dim"]), points_per_level=points, activation="silu", mlp_activation="silu",
        layer="rms_swiglu", gated=bool(dec.get("gated", True)), shared_box_head=bool(dec.get("shared_box_head", False)),
        reg_max=REG_MAX, reg_scale=REG_SCALE, num_denoising=int(request.options.get("num_denoising", NUM_DENOISING)),
    )
    criterion = DEIMv2Criterion(request.num_classes, go_union=bool(crit.get("go_union", True)), local=bool(crit.get("local", True)))
    return DEIMv2Detector(backbone, encoder, decoder, criterion, size_multiple=32, published_form="deploy")
