"""RT-DETR (Zhao et al., "DETRs Beat YOLOs on Real-time Object Detection", CVPR 2024, arXiv:2304.08069).

Backbone (PResNet-D 18/34/50/101, or HGNetv2-L/X = timm ``hgnetv2_b4``/``b5``) → hybrid encoder
(1×1 conv-BN projections to 256 or 384, AIFI on the stride-32 map, CCFM with CSPRepLayer
blocks) → RT-DETR decoder (300 queries selected from the encoder tokens, 3/4/6 layers of
self-attention + 3-level deformable attention with 4 points and value/output projections,
logit-space box deltas). Training: varifocal + L1 + GIoU losses with Hungarian matching, on
every decoder layer, the encoder proposals and 100 contrastive denoising queries
(``zoo_core.detr``). R50-M is R50 with a 0.5-expanded encoder that uses decoder layer 3 of 6
at inference (``eval_index: 2``).

Sizes are registry data (``config``): ``backbone`` (``{kind: presnet, depth}`` or
``{kind: hgnetv2, name}``), ``encoder`` (``hidden_dim``, ``ffn_dim``, ``expansion``,
``depth_mult``), ``decoder`` (``dim``, ``ffn_dim``, ``layers``, ``eval_index``).
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from zoo_core.building import BuildRequest
from zoo_core.detr.criterion import CriterionConfig, SetCriterion
from zoo_core.detr.decoder import DeltaRefinementDecoder
from zoo_core.detr.detector import DETRDetector
from zoo_core.detr.hgnetv2 import HGNetV2Backbone
from zoo_core.detr.hybrid_encoder import HybridEncoder, csp_rep_fusion

from zoo_rtdetr.presnet import PResNet

__all__ = ["RTDETR_CRITERION", "build_rtdetr_backbone", "build_rtdetr"]

#: RT-DETR's published criterion: VFL (α 0.75, γ 2) 1, L1 5, GIoU 2; matcher costs 2/5/2, focal α 0.25, γ 2.
RTDETR_CRITERION = CriterionConfig(classification="vfl", alpha=0.75, gamma=2.0)
NUM_QUERIES, NUM_DENOISING, NUM_HEADS, POINTS = 300, 100, 8, 4
BUILD_OPTIONS = ("num_queries", "num_denoising")


def _section(config: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    value = config.get(name)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: '{name}' must be a mapping, got {value!r}")
    return value


def build_rtdetr_backbone(spec: Mapping[str, Any], where: str) -> nn.Module:
    """PResNet (``{kind: presnet, depth}``) or HGNetv2 (``{kind: hgnetv2, name}``), stages 1-3."""
    kind = spec.get("kind")
    if kind == "presnet":
        return PResNet(int(spec["depth"]))
    if kind == "hgnetv2":
        return HGNetV2Backbone(str(spec["name"]))
    raise ValueError(f"{where}: backbone kind must be 'presnet' or 'hgnetv2', got {kind!r}")


def build_rtdetr(request: BuildRequest) -> DETRDetector:
    """The registry builder of ``rtdetr``. Options ``num_queries`` (default 300), ``num_denoising`` (default 100)."""
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"rtdetr does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    where = f"registry.yaml rtdetr size {request.size!r} config"
    backbone = build_rtdetr_backbone(_section(request.config, "backbone", where), where)
    enc = _section(request.config, "encoder", where)
    dec = _section(request.config, "decoder", where)
    hidden = int(enc["hidden_dim"])
    encoder = HybridEncoder(
        backbone.out_channels,
        hidden,
        csp_rep_fusion(float(enc.get("expansion", 1.0)), float(enc.get("depth_mult", 1.0))),
        num_heads=NUM_HEADS,
        ffn_dim=int(enc["ffn_dim"]),
    )
    decoder = DeltaRefinementDecoder(
        request.num_classes,
        encoder.out_channels,
        int(dec["dim"]),
        int(request.options.get("num_queries", NUM_QUERIES)),
        int(dec["layers"]),
        num_heads=NUM_HEADS,
        ffn_dim=int(dec["ffn_dim"]),
        points_per_level=(POINTS,) * len(encoder.out_channels),
        eval_index=int(dec.get("eval_index", -1)),
        num_denoising=int(request.options.get("num_denoising", NUM_DENOISING)),
    )
    return DETRDetector(backbone, encoder, decoder, SetCriterion(request.num_classes, RTDETR_CRITERION))
