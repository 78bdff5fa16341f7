"""RF-DETR checkpoints: LibreYOLO 1.6 / official keys ↔ zoo keys. No model is built.

Renaming rules plus one tensor edit: the DINOv2 backbone is HuggingFace's layout upstream
(separate ``query``/``key``/``value`` linears) and timm's in zoo (one fused ``qkv``), so the three
are concatenated on the way in and split on the way out. LibreYOLO's empty keypoint-mask buffer
(``_kp_active_mask``) is dropped on the way in and written back (empty) on the way out.
"""

from __future__ import annotations

from typing import Mapping

import torch

from zoo_core.detr.key_mapping import KeyRule, rename_keys
from zoo_core.key_renaming import LayoutConverter

__all__ = ["convert", "from_libreyolo", "to_libreyolo"]

_VIT = "backbone.0.encoder.encoder"
_LAYER = f"{_VIT}.encoder.layer.{{i}}"
_PROJ = "backbone.0.projector.stages.0"
_DEC = "transformer.decoder.layers.{i}"


def _conv_ln(theirs: str, ours: str) -> list[KeyRule]:
    return [KeyRule(f"{theirs}.conv", f"{ours}.0"), KeyRule(f"{theirs}.bn", f"{ours}.1")]


_RULES = [
    KeyRule(f"{_VIT}.embeddings.cls_token", "backbone.vit.cls_token"),
    KeyRule(f"{_VIT}.embeddings.mask_token", "backbone.mask_token"),
    KeyRule(f"{_VIT}.embeddings.position_embeddings", "backbone.vit.pos_embed"),
    KeyRule(f"{_VIT}.embeddings.patch_embeddings.projection", "backbone.vit.patch_embed.proj"),
    KeyRule(f"{_LAYER}.attention.attention.qkv", "backbone.vit.blocks.{i}.attn.qkv"),  # fused below
    KeyRule(f"{_LAYER}.attention.output.dense", "backbone.vit.blocks.{i}.attn.proj"),
    KeyRule(f"{_LAYER}.layer_scale1.lambda1", "backbone.vit.blocks.{i}.ls1.gamma"),
    KeyRule(f"{_LAYER}.layer_scale2.lambda1", "backbone.vit.blocks.{i}.ls2.gamma"),
    KeyRule(f"{_LAYER}.norm1", "backbone.vit.blocks.{i}.norm1"),
    KeyRule(f"{_LAYER}.norm2", "backbone.vit.blocks.{i}.norm2"),
    KeyRule(f"{_LAYER}.mlp", "backbone.vit.blocks.{i}.mlp"),
    KeyRule(f"{_VIT}.layernorm", "backbone.vit.norm"),
    *_conv_ln(f"{_PROJ}.0.cv1", "encoder.entry"),
    *_conv_ln(f"{_PROJ}.0.m.{{j}}.cv1", "encoder.blocks.{j}.0"),
    *_conv_ln(f"{_PROJ}.0.m.{{j}}.cv2", "encoder.blocks.{j}.1"),
    *_conv_ln(f"{_PROJ}.0.cv2", "encoder.merge"),
    KeyRule(f"{_PROJ}.1", "encoder.norm"),
    KeyRule(f"{_DEC}.self_attn", "decoder.layers.{i}.self_attn"),
    KeyRule(f"{_DEC}.cross_attn", "decoder.layers.{i}.cross_attn"),
    KeyRule(f"{_DEC}.norm1", "decoder.layers.{i}.norm_self"),
    KeyRule(f"{_DEC}.norm2", "decoder.layers.{i}.norm_cross"),
    KeyRule(f"{_DEC}.norm3", "decoder.layers.{i}.norm_ffn"),
    KeyRule(f"{_DEC}.linear1", "decoder.layers.{i}.ffn_in"),
    KeyRule(f"{_DEC}.linear2", "decoder.layers.{i}.ffn_out"),
    KeyRule("transformer.decoder.norm", "decoder.norm"),
    KeyRule("transformer.decoder.ref_point_head", "decoder.query_position"),
    KeyRule("transformer.enc_output_norm.{g}", "decoder.proposal_norm.{g}"),
    KeyRule("transformer.enc_output.{g}", "decoder.proposal_linear.{g}"),
    KeyRule("transformer.enc_out_class_embed.{g}", "decoder.proposal_class_heads.{g}"),
    KeyRule("transformer.enc_out_bbox_embed.{g}", "decoder.proposal_box_heads.{g}"),
    KeyRule("class_embed", "decoder.class_head"),
    KeyRule("bbox_embed", "decoder.box_head"),
    KeyRule("refpoint_embed", "decoder.query_boxes"),
    KeyRule("query_feat", "decoder.query_content"),
]
_DROP = (r"^_kp_active_mask$",)
_PARTS = ("query", "key", "value")


def from_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO RF-DETR ``model`` state dict (or an official one, same names) → zoo's ``rfdetr`` keys."""
    state = {}
    for key, tensor in state_dict.items():
        part = next((p for p in _PARTS if f".attention.attention.{p}." in key), None)
        if part is None:
            state[key] = tensor
        elif part == "query":  # fuse q, k, v of this block (weight or bias)
            fused = key.replace(".attention.attention.query.", ".attention.attention.qkv.")
            state[fused] = torch.cat([state_dict[key.replace(".query.", f".{p}.")] for p in _PARTS])
    return rename_keys(state, _RULES, to_zoo=True, drop=_DROP)


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """zoo's ``rfdetr`` state dict → LibreYOLO keys."""
    renamed = rename_keys(state_dict, _RULES, to_zoo=False)
    for key in [k for k in renamed if ".attention.attention.qkv." in k]:
        for part, tensor in zip(_PARTS, renamed.pop(key).chunk(3)):
            renamed[key.replace(".qkv.", f".{part}.")] = tensor
    renamed["_kp_active_mask"] = torch.zeros(0, 0, dtype=torch.bool)
    return renamed


# The registry ``converter``: LibreYOLO's names (the official release's too) read, LibreYOLO's written
# (``save(format="libreyolo")``).
convert = LayoutConverter(from_libreyolo, to_libreyolo)
