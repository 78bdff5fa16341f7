"""LibreYOLO 1.6.0 key names of the RT-DETR-line modules, as ``KeyRule`` lists (see ``key_mapping``).

LibreYOLO keeps the official repositories' names (``encoder.fpn_blocks``, ``decoder.dec_bbox_head``
…), so these rules also read official checkpoints' model weights. Shared here:

- ``aifi_rules``, ``csp_rules``, ``elan_rules``: the hybrid encoder's parts;
- ``distribution_detr_rules``: the whole D-FINE/DEIM/RT-DETRv4 model (HGNetv2 keys are timm's,
  the same in both), with ``DISTRIBUTION_DETR_DROP``: LibreYOLO buffers zoo recomputes;
- ``delta_decoder_rules``: RT-DETR's decoder;
- ``distribution_detr_from_libreyolo`` / ``distribution_detr_to_libreyolo``: the whole conversion of
  a D-FINE, DEIM or RT-DETRv4 checkpoint (one model family under three recipes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from zoo_core.detr.key_mapping import KeyRule, add_batch_counters, rename_keys

if TYPE_CHECKING:
    import torch

__all__ = [
    "aifi_rules",
    "csp_rules",
    "elan_rules",
    "distribution_detr_rules",
    "delta_decoder_rules",
    "DISTRIBUTION_DETR_DROP",
    "FROZEN_NORM_SIZES",
    "distribution_detr_from_libreyolo",
    "distribution_detr_to_libreyolo",
    "mask_head_rules",
]

# Buffers zoo recomputes, and the inner decoder's references to the outer ``up``/``reg_scale`` (the same tensors).
DISTRIBUTION_DETR_DROP = (r"^decoder\.anchors$", r"^decoder\.valid_mask$", r"\.num_points_scale$", r"^decoder\.decoder\.(up|reg_scale)$")


def aifi_rules() -> list[KeyRule]:
    """``encoder.encoder.{i}.layers.{j}`` ↔ ``encoder.intra_scale.{i}.{j}``."""
    foreign, zoo = "encoder.encoder.{i}.layers.{j}", "encoder.intra_scale.{i}.{j}"
    names = {"self_attn": "self_attn", "linear1": "ffn_in", "linear2": "ffn_out", "norm1": "norm_attn", "norm2": "norm_ffn"}
    return [KeyRule(f"{foreign}.{a}", f"{zoo}.{b}") for a, b in names.items()]


def csp_rules(foreign: str, zoo: str) -> list[KeyRule]:
    """A CSPRepLayer (``conv1/2/3``, ``bottlenecks.{n}.conv1/2``) ↔ ``CSPRepFusion``."""
    return [
        KeyRule(f"{foreign}.bottlenecks.{{n}}.conv1", f"{zoo}.blocks.{{n}}.conv3x3", "conv_norm"),
        KeyRule(f"{foreign}.bottlenecks.{{n}}.conv2", f"{zoo}.blocks.{{n}}.conv1x1", "conv_norm"),
        KeyRule(f"{foreign}.conv1", f"{zoo}.branch", "conv_norm"),
        KeyRule(f"{foreign}.conv2", f"{zoo}.shortcut", "conv_norm"),
        KeyRule(f"{foreign}.conv3", f"{zoo}.output", "conv_norm"),
    ]


def elan_rules(foreign: str, zoo: str) -> list[KeyRule]:
    """A RepNCSPELAN4 (``cv1``, ``cv2``/``cv3`` = CSP + conv, ``cv4``) ↔ ``ELANFusion``."""
    rules = [KeyRule(f"{foreign}.cv1", f"{zoo}.entry", "conv_norm"), KeyRule(f"{foreign}.cv4", f"{zoo}.merge", "conv_norm")]
    for a, b in (("cv2", "stage1"), ("cv3", "stage2")):
        rules += csp_rules(f"{foreign}.{a}.0", f"{zoo}.{b}.0")
        rules.append(KeyRule(f"{foreign}.{a}.1", f"{zoo}.{b}.1", "conv_norm"))
    return rules


def _decoder_common_rules() -> list[KeyRule]:
    layer, zoo_layer = "decoder.decoder.layers.{i}", "decoder.layers.{i}"
    names = {"self_attn": "self_attn", "cross_attn": "cross_attn", "norm1": "norm_self", "linear1": "ffn_in", "linear2": "ffn_out", "norm3": "norm_ffn"}
    return [
        *(KeyRule(f"{layer}.{a}", f"{zoo_layer}.{b}") for a, b in names.items()),
        KeyRule("decoder.input_proj.{i}", "decoder.input_projections.{i}", "conv_norm"),
        KeyRule("decoder.denoising_class_embed", "decoder.denoising_embedding"),
        KeyRule("decoder.query_pos_head", "decoder.query_position"),
        KeyRule("decoder.enc_score_head", "decoder.query_selector.class_head"),
        KeyRule("decoder.enc_bbox_head", "decoder.query_selector.box_head"),
        KeyRule("decoder.dec_score_head.{i}", "decoder.class_heads.{i}"),
        KeyRule("decoder.dec_bbox_head.{i}", "decoder.box_heads.{i}"),
    ]


def delta_decoder_rules() -> list[KeyRule]:
    """RT-DETR's decoder (``enc_output`` is a plain ``Sequential(Linear, LayerNorm)``)."""
    return [
        KeyRule("decoder.decoder.layers.{i}.norm2", "decoder.layers.{i}.norm_cross"),
        KeyRule("decoder.enc_output.0", "decoder.query_selector.memory_linear"),
        KeyRule("decoder.enc_output.1", "decoder.query_selector.memory_norm"),
        *_decoder_common_rules(),
    ]


def distribution_detr_rules() -> list[KeyRule]:
    """The full D-FINE / DEIM / RT-DETRv4 model."""
    rules = [
        KeyRule("backbone", "backbone"),  # timm HGNetv2: same names
        KeyRule("encoder.input_proj.{i}", "encoder.input_projections.{i}", "conv_norm"),
        *aifi_rules(),
        KeyRule("encoder.lateral_convs.{k}", "encoder.lateral.{k}", "conv_norm"),
        KeyRule("encoder.downsample_convs.{k}.0.cv1", "encoder.downsample.{k}.pointwise", "conv_norm"),
        KeyRule("encoder.downsample_convs.{k}.0.cv2", "encoder.downsample.{k}.depthwise", "conv_norm"),
        *elan_rules("encoder.fpn_blocks.{k}", "encoder.top_down.{k}"),
        *elan_rules("encoder.pan_blocks.{k}", "encoder.bottom_up.{k}"),
        KeyRule("decoder.decoder.layers.{i}.gateway.gate", "decoder.layers.{i}.gate.linear"),
        KeyRule("decoder.decoder.layers.{i}.gateway.norm", "decoder.layers.{i}.gate.norm"),
        KeyRule("decoder.decoder.lqe_layers.{i}.reg_conf", "decoder.quality_heads.{i}.mlp"),
        KeyRule("decoder.enc_output.proj", "decoder.query_selector.memory_linear"),
        KeyRule("decoder.enc_output.norm", "decoder.query_selector.memory_norm"),
        KeyRule("decoder.pre_bbox_head", "decoder.initial_box_head"),
        KeyRule("decoder.up", "decoder.up"),
        KeyRule("decoder.reg_scale", "decoder.reg_scale"),
        *_decoder_common_rules(),
    ]
    return rules


#: Sizes whose LibreYOLO backbone, when loaded from a checkpoint, uses FrozenBatchNorm2d (no counters).
FROZEN_NORM_SIZES = frozenset({"l", "x"})


def mask_head_rules() -> list[KeyRule]:
    """D-FINE-seg's mask head: ``decoder.mask_decoder`` (the feature fusion) and ``decoder.mask_head`` (the query
    MLP) ↔ ``zoo_core.detr.mask_head.QueryMaskHead`` at ``mask_head``."""
    fusion, zoo = "decoder.mask_decoder", "mask_head.features"
    return [
        KeyRule(f"{fusion}.lateral.{{i}}", f"{zoo}.lateral.{{i}}"),
        KeyRule(f"{fusion}.bn.{{i}}", f"{zoo}.lateral_norms.{{i}}"),
        KeyRule(f"{fusion}.fusion_conv", f"{zoo}.fusion"),
        KeyRule(f"{fusion}.fusion_norm", f"{zoo}.fusion_norm"),
        KeyRule(f"{fusion}.up_conv", f"{zoo}.refine"),
        KeyRule(f"{fusion}.bn1", f"{zoo}.refine_norm"),
        KeyRule("decoder.mask_head", "mask_head.embedding"),
    ]


def distribution_detr_from_libreyolo(state_dict: Mapping[str, "torch.Tensor"], extra_drop: Sequence[str] = (),
                                     extra_rules: Sequence[KeyRule] = ()) -> dict[str, "torch.Tensor"]:
    """A LibreYOLO (or official) D-FINE/DEIM/RT-DETRv4 ``model`` state dict → zoo keys.

    Recomputed buffers are dropped (``DISTRIBUTION_DETR_DROP`` and ``extra_drop``), and BatchNorm
    counters that frozen LibreYOLO backbones lack are added. ``extra_rules`` (tried first) cover
    further heads (``mask_head_rules`` for the segmenters).
    """
    drop = (*DISTRIBUTION_DETR_DROP, *extra_drop)
    return add_batch_counters(rename_keys(state_dict, [*extra_rules, *distribution_detr_rules()], to_zoo=True, drop=drop))


def distribution_detr_to_libreyolo(size: str, state_dict: Mapping[str, "torch.Tensor"],
                                   extra_rules: Sequence[KeyRule] = ()) -> dict[str, "torch.Tensor"]:
    """zoo's D-FINE/DEIM/RT-DETRv4 state dict → LibreYOLO keys (its loader regenerates the dropped anchor buffers)."""
    renamed = rename_keys(state_dict, [*extra_rules, *distribution_detr_rules()], to_zoo=False)
    for name in ("up", "reg_scale"):  # LibreYOLO's inner decoder holds the same two tensors
        renamed[f"decoder.decoder.{name}"] = renamed[f"decoder.{name}"]
    if size in FROZEN_NORM_SIZES:
        renamed = {k: v for k, v in renamed.items() if not (k.startswith("backbone.") and k.endswith("num_batches_tracked"))}
    return renamed
