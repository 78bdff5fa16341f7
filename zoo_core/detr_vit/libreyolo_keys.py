"""LibreYOLO 1.6 (= the official DEIMv2 / EdgeCrafter) key names of the ``detr_vit`` pieces, as ``KeyRule`` lists.

- ``rope_vit_rules``: a ``RopeViT`` (blocks keep their names; the prefix token and the patch
  embedding are the caller's);
- ``split_elan_rules``: a ``SplitELANBlock`` (their ``RepNCSPELAN4``/``RepNCSPELAN5`` with
  ``CSPLayer2`` stages: ``cv1``, ``cv2.0.conv1``, ``cv2.0.bottlenecks.{n}.conv1/conv2``, ``cv2.1``...);
- ``vit_encoder_rules``: the hybrid encoder of ``fusion.vit_hybrid_encoder``;
- ``vit_decoder_rules``: ``ViTDistributionDecoder`` with DEIMv2's RMSNorm/SwiGLU layers
  (``layer="rms_swiglu"``) or EdgeCrafter's LayerNorm layers; ``VIT_DECODER_DROP``: the cached
  anchors, validity mask and point scales LibreYOLO keeps as buffers, and the inner decoder's
  aliases of ``up``/``reg_scale``; ``libreyolo_decoder_buffers`` rebuilds them for writing LibreYOLO
  files (its DEIMv2 loader refuses a file without them).
"""

from __future__ import annotations

from typing import Sequence

import torch

from zoo_core.detr.key_mapping import KeyRule
from zoo_core.detr.libreyolo_keys import aifi_rules

__all__ = ["rope_vit_rules", "split_elan_rules", "vit_encoder_rules", "vit_decoder_rules", "VIT_DECODER_DROP", "libreyolo_decoder_buffers"]

VIT_DECODER_DROP = (r"^decoder\.anchors$", r"^decoder\.valid_mask$", r"\.num_points_scale$", r"^decoder\.decoder\.(up|reg_scale)$")


def rope_vit_rules(foreign: str, zoo: str) -> list[KeyRule]:
    """``{foreign}.blocks.{i}`` ↔ ``{zoo}.blocks.{i}`` (norm1, attn.qkv, attn.proj, norm2, mlp.fc1/fc2)."""
    return [KeyRule(f"{foreign}.blocks.{{i}}", f"{zoo}.blocks.{{i}}")]


def split_elan_rules(foreign: str, zoo: str) -> list[KeyRule]:
    """One ELAN block with split-CSP stages (the stage 3×3 conv, where present, is ``cv2.1``/``cv3.1``)."""
    rules = [KeyRule(f"{foreign}.cv1", f"{zoo}.entry", "conv_norm"), KeyRule(f"{foreign}.cv4", f"{zoo}.merge", "conv_norm")]
    for theirs, ours in (("cv2", "stage1"), ("cv3", "stage2")):
        rules += [
            KeyRule(f"{foreign}.{theirs}.0.conv1", f"{zoo}.{ours}.0.entry", "conv_norm"),
            KeyRule(f"{foreign}.{theirs}.0.bottlenecks.{{n}}.conv1", f"{zoo}.{ours}.0.blocks.{{n}}.conv3x3", "conv_norm"),
            KeyRule(f"{foreign}.{theirs}.0.bottlenecks.{{n}}.conv2", f"{zoo}.{ours}.0.blocks.{{n}}.conv1x1", "conv_norm"),
            KeyRule(f"{foreign}.{theirs}.1", f"{zoo}.{ours}.1", "conv_norm"),
        ]
    return rules


def vit_encoder_rules() -> list[KeyRule]:
    """The whole ``encoder.*`` of a ``vit_hybrid_encoder``."""
    return [
        KeyRule("encoder.input_proj.{i}", "encoder.input_projections.{i}", "conv_norm"),
        *aifi_rules(),
        KeyRule("encoder.lateral_convs.{k}", "encoder.lateral.{k}", "conv_norm"),
        KeyRule("encoder.downsample_convs.{k}.0.cv1", "encoder.downsample.{k}.pointwise", "conv_norm"),
        KeyRule("encoder.downsample_convs.{k}.0.cv2", "encoder.downsample.{k}.depthwise", "conv_norm"),
        *split_elan_rules("encoder.fpn_blocks.{k}", "encoder.top_down.{k}"),
        *split_elan_rules("encoder.pan_blocks.{k}", "encoder.bottom_up.{k}"),
    ]


def vit_decoder_rules(layer: str) -> list[KeyRule]:
    """The whole ``decoder.*`` of a ``ViTDistributionDecoder`` (``layer``: ``"rms_swiglu"`` or ``"layer_norm"``)."""
    theirs, ours = "decoder.decoder.layers.{i}", "decoder.layers.{i}"
    if layer == "rms_swiglu":  # DEIMv2: RMSNorm weights are called ``scale``
        names = [("norm1.scale", "norm_self.weight"), ("norm2.scale", "norm_cross.weight"), ("norm3.scale", "norm_ffn.weight"),
                 ("gateway.gate", "gate.linear"), ("gateway.norm.scale", "gate.norm.weight"), ("swish_ffn.w12", "ffn_in"),
                 ("swish_ffn.w3", "ffn_out")]
    elif layer == "layer_norm":  # EdgeCrafter: norm1, gateway, linear1/2, norm2 (after the feed-forward)
        names = [("norm1", "norm_self"), ("gateway.gate", "gate.linear"), ("gateway.norm", "gate.norm"), ("linear1", "ffn_in"),
                 ("linear2", "ffn_out"), ("norm2", "norm_ffn")]
    else:
        raise ValueError(f"unknown decoder layer style {layer!r}")
    names += [("self_attn", "self_attn"), ("cross_attn", "cross_attn")]
    return [
        *(KeyRule(f"{theirs}.{a}", f"{ours}.{b}") for a, b in names),
        KeyRule("decoder.decoder.lqe_layers.{i}.reg_conf", "decoder.quality_heads.{i}.mlp"),
        KeyRule("decoder.input_proj.{i}", "decoder.input_projections.{i}", "conv_norm"),
        KeyRule("decoder.denoising_class_embed", "decoder.denoising_embedding"),
        KeyRule("decoder.query_pos_head", "decoder.query_position"),
        KeyRule("decoder.enc_score_head", "decoder.query_selector.class_head"),
        KeyRule("decoder.enc_bbox_head", "decoder.query_selector.box_head"),
        KeyRule("decoder.pre_bbox_head", "decoder.initial_box_head"),
        KeyRule("decoder.dec_score_head.{i}", "decoder.class_heads.{i}"),
        KeyRule("decoder.dec_bbox_head.{i}", "decoder.box_heads.{i}"),
        KeyRule("decoder.up", "decoder.up"),
        KeyRule("decoder.reg_scale", "decoder.reg_scale"),
    ]


def libreyolo_decoder_buffers(image_size: int, strides: Sequence[int], points: Sequence[int], layers: int) -> dict[str, torch.Tensor]:
    """The decoder buffers LibreYOLO caches for its fixed evaluation size (as its ``_generate_anchors`` builds them).

    ``decoder.anchors`` ``(1, tokens, 4)`` logits of cell-centred boxes of side ``0.05·2^level`` (1e4 where a
    coordinate leaves (0.01, 0.99)), ``decoder.valid_mask`` ``(1, tokens, 1)``, and each layer's
    ``num_points_scale`` (``1 / points`` of the point's level).
    """
    levels = []
    for level, stride in enumerate(strides):
        side = image_size // stride
        ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        centres = (torch.stack([xs, ys], dim=-1).float() + 0.5) / side
        levels.append(torch.cat([centres, torch.full_like(centres, 0.05 * 2.0**level)], dim=-1).reshape(-1, 4))
    boxes = torch.cat(levels)[None]
    valid = ((boxes > 0.01) & (boxes < 0.99)).all(-1, keepdim=True)
    anchors = torch.where(valid, torch.log(boxes / (1 - boxes)), torch.full_like(boxes, 1e4))
    scale = torch.tensor([1.0 / count for count in points for _ in range(count)], dtype=torch.float32)
    buffers = {"decoder.anchors": anchors, "decoder.valid_mask": valid}
    buffers.update({f"decoder.decoder.layers.{i}.cross_attn.num_points_scale": scale.clone() for i in range(layers)})
    return buffers
