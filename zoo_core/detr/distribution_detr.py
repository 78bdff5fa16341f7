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
    from zoo_core.detr.mask_losses import MaskLossConfig
    from zoo_core.detr.segmenter import DETRSegmenter

__all__ = ["build_distribution_detr", "build_from_request", "distribution_detr_modules", "build_distribution_detr_segmenter",
           "build_segmenter_from_request", "MASK_INPUT_STRIDE", "BUILD_OPTIONS", "NUM_QUERIES", "NUM_DENOISING"]

NUM_QUERIES, NUM_DENOISING, NUM_HEADS, REG_MAX = 300, 100, 8, 32
#: Build options (``LibreYOLO(name, options={...})``): matching queries and denoising queries
#: (both published at 300 / 100; fewer make small inputs and quick tests possible).
BUILD_OPTIONS = ("num_queries", "num_denoising")


def _mapping(config: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = config.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: '{key}' must be a mapping, got {value!r}")
    return value


def distribution_detr_modules(
    config: Mapping[str, Any], num_classes: int, *, where: str, num_queries: int = NUM_QUERIES,
    num_denoising: int = NUM_DENOISING, leading_stages: tuple[int, ...] = (),
) -> tuple[HGNetV2Backbone, HybridEncoder, DistributionRefinementDecoder]:
    """Backbone, encoder and decoder of one size's registry ``config``.

    ``leading_stages``: backbone stages returned before the configured ones for another head (a
    mask head); the encoder takes only the configured stages.
    """
    stages = tuple(config.get("return_stages", (1, 2, 3)))
    backbone = HGNetV2Backbone(str(config["backbone"]), (*leading_stages, *stages))
    enc, dec = _mapping(config, "encoder", where), _mapping(config, "decoder", where)
    activation = str(config.get("activation", "relu"))
    encoder = HybridEncoder(
        backbone.out_channels[len(leading_stages):],
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
    return backbone, encoder, decoder


def build_distribution_detr(
    config: Mapping[str, Any], num_classes: int, criterion: CriterionConfig, *, where: str, num_queries: int = NUM_QUERIES,
    num_denoising: int = NUM_DENOISING,
) -> DETRDetector:
    """A D-FINE-style ``DETRDetector`` from one size's registry ``config`` (see the module docstring)."""
    backbone, encoder, decoder = distribution_detr_modules(config, num_classes, where=where, num_queries=num_queries,
                                                           num_denoising=num_denoising)
    # The published counts are of the deployed graph (D-FINE's ``stats``: ``model.deploy()`` first).
    return DETRDetector(backbone, encoder, decoder, SetCriterion(num_classes, criterion), published_form="deploy")


#: The stride the D-FINE-seg mask head's finest input must have (its output is at half of it: stride 4).
MASK_INPUT_STRIDE = 8


def build_distribution_detr_segmenter(
    config: Mapping[str, Any], num_classes: int, criterion: CriterionConfig, masks: "MaskLossConfig", *, where: str,
    num_queries: int = NUM_QUERIES, num_denoising: int = NUM_DENOISING,
) -> "DETRSegmenter":
    """A D-FINE-seg ``DETRSegmenter``: ``build_distribution_detr``'s model plus a ``QueryMaskHead`` of width
    ``config["mask_dim"]`` on the encoder's maps. When the configured stages start below stride 8 (D-FINE-N's
    stages 2-3), backbone stage 1 (stride 8) is returned too, for the mask head only (LibreYOLO 1.6.0's rule)."""
    from zoo_core.detr.mask_head import QueryMaskHead
    from zoo_core.detr.mask_losses import MaskSetCriterion
    from zoo_core.detr.segmenter import DETRSegmenter

    if "mask_dim" not in config:
        raise ValueError(f"{where}: a segmenter size needs 'mask_dim' (the mask feature width, e.g. 256)")
    stages = tuple(config.get("return_stages", (1, 2, 3)))
    stage_of_stride = {4 * 2**stage: stage for stage in range(4)}
    leading = () if stages[0] == stage_of_stride[MASK_INPUT_STRIDE] else (stage_of_stride[MASK_INPUT_STRIDE],)
    backbone, encoder, decoder = distribution_detr_modules(config, num_classes, where=where, num_queries=num_queries,
                                                           num_denoising=num_denoising, leading_stages=leading)
    mask_inputs = (*backbone.out_channels[: len(leading)], *encoder.out_channels)
    head = QueryMaskHead(mask_inputs, decoder.dim, int(config["mask_dim"]), str(config.get("activation", "relu")))
    return DETRSegmenter(backbone, encoder, decoder, MaskSetCriterion(num_classes, criterion, masks), head,
                         mask_only_levels=len(leading), mask_stride=MASK_INPUT_STRIDE // 2)


def _checked_options(request: "BuildRequest") -> dict[str, Any]:
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(
            f"{request.family} does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}"
        )
    return {
        "where": f"registry.yaml {request.family} size {request.size!r} config",
        "num_queries": int(request.options.get("num_queries", NUM_QUERIES)),
        "num_denoising": int(request.options.get("num_denoising", NUM_DENOISING)),
    }


def build_from_request(request: "BuildRequest", criterion: CriterionConfig) -> DETRDetector:
    """A family builder's body: ``build_distribution_detr`` from a ``BuildRequest`` (``BUILD_OPTIONS`` checked)."""
    return build_distribution_detr(request.config, request.num_classes, criterion, **_checked_options(request))


def build_segmenter_from_request(request: "BuildRequest", criterion: CriterionConfig, masks: "MaskLossConfig") -> "DETRSegmenter":
    """A segmenter family builder's body: ``build_distribution_detr_segmenter`` from a ``BuildRequest``."""
    return build_distribution_detr_segmenter(request.config, request.num_classes, criterion, masks, **_checked_options(request))
