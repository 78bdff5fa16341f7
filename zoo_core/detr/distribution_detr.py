"""Assembly of the D-FINE-style detectors: D-FINE, DEIM and RT-DETRv4 share one architecture.

HGNetV2 backbone (timm ``hgnetv2_b*``, stages 1-3, or 2-3 for the two-level N models) →
hybrid encoder with ELAN fusion blocks (``elan_fusion``) → ``DistributionRefinementDecoder``.
The families differ in their activations (D-FINE: ReLU in the decoder's feed-forward, LQE and
MLPs; DEIM and RT-DETRv4: SiLU) and their training criterion, which each plugin passes in.

Size data (the registry ``config`` of each size)::

    backbone: hgnetv2_b0          # timm name
    return_stages: [1, 2, 3]      # [2, 3] for N
    encoder: {hidden_dim, ffn_dim, expansion, depth_mult}
    decoder: {dim, ffn_dim, layers, points: [3, 6, 3], reg_scale, eval_index}
    activation: relu              # decoder feed-forward and LQE
    mlp_activation: relu          # query-position, box and proposal MLPs
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from zoo_core.detr.criterion import CriterionConfig, SetCriterion
from zoo_core.detr.decoder import DistributionRefinementDecoder
from zoo_core.detr.detector import DETRDetector
from zoo_core.detr.hgnetv2 import HGNetV2Backbone
from zoo_core.detr.hybrid_encoder import HybridEncoder, elan_fusion

if TYPE_CHECKING:
    from zoo_core.building import BuildRequest

__all__ = ["build_distribution_detr", "build_from_request", "BUILD_OPTIONS", "NUM_QUERIES", "NUM_DENOISING"]

NUM_QUERIES, NUM_DENOISING, NUM_HEADS, REG_MAX = 300, 100, 8, 32
#: Build options (``LibreYOLO(name, options={...})``): matching queries and denoising queries
#: (both published at 300 / 100; fewer make small inputs and quick tests possible).
BUILD_OPTIONS = ("num_queries", "num_denoising")


def _mapping(config: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = config.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: '{key}' must be a mapping, got {value!r}")
    return value


def build_distribution_detr(
    config: Mapping[str, Any], num_classes: int, criterion: CriterionConfig, *, where: str, num_queries: int = NUM_QUERIES,
    num_denoising: int = NUM_DENOISING,
) -> DETRDetector:
    """A D-FINE-style ``DETRDetector`` from one size's registry ``config`` (see the module docstring)."""
    backbone = HGNetV2Backbone(str(config["backbone"]), tuple(config.get("return_stages", (1, 2, 3))))
    enc, dec = _mapping(config, "encoder", where), _mapping(config, "decoder", where)
    activation = str(config.get("activation", "relu"))
    encoder = HybridEncoder(
        backbone.out_channels,
        int(enc["hidden_dim"]),
        elan_fusion(float(enc["expansion"]), float(enc["depth_mult"])),
        num_heads=NUM_HEADS,
        ffn_dim=int(enc["ffn_dim"]),
    )
    points = tuple(int(p) for p in dec["points"])
    if len(points) != len(encoder.out_channels):
        raise ValueError(f"{where}: decoder.points needs one count per level ({len(encoder.out_channels)}), got {points}")
    decoder = DistributionRefinementDecoder(
        num_classes,
        encoder.out_channels,
        int(dec["dim"]),
        num_queries,
        int(dec["layers"]),
        num_heads=NUM_HEADS,
        ffn_dim=int(dec["ffn_dim"]),
        points_per_level=points,
        activation=activation,
        mlp_activation=str(config.get("mlp_activation", activation)),
        reg_max=REG_MAX,
        reg_scale=float(dec.get("reg_scale", 4.0)),
        eval_index=int(dec.get("eval_index", -1)),
        num_denoising=num_denoising,
    )
    # The published counts are of the deployed graph (D-FINE's ``stats``: ``model.deploy()`` first).
    return DETRDetector(backbone, encoder, decoder, SetCriterion(num_classes, criterion), published_form="deploy")


def build_from_request(request: "BuildRequest", criterion: CriterionConfig) -> DETRDetector:
    """A family builder's body: ``build_distribution_detr`` from a ``BuildRequest`` (``BUILD_OPTIONS`` checked)."""
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(
            f"{request.family} does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}"
        )
    return build_distribution_detr(
        request.config, request.num_classes, criterion,
        where=f"registry.yaml {request.family} size {request.size!r} config",
        num_queries=int(request.options.get("num_queries", NUM_QUERIES)),
        num_denoising=int(request.options.get("num_denoising", NUM_DENOISING)),
    )
