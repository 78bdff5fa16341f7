"""DEIMv2 checkpoints: LibreYOLO 1.6 keys (= the official release's) ↔ zoo keys. No model is built.

Renaming rules (``zoo_core.detr.key_mapping``) plus three tensor edits for the DINOv3 ViT-S/S+
backbones (L, X), which zoo takes from timm:

- DINOv3 keeps one ``qkv.bias`` (q, k, v) and a ``bias_mask`` buffer that zeroes its key part;
  timm holds ``q_bias`` and ``v_bias`` (its key bias is a fixed zero buffer). LibreYOLO → zoo
  drops the key part and the mask; zoo → LibreYOLO writes a zero key bias and the ``[1, 0, 1]``
  mask the published checkpoints carry (LibreYOLO loads DEIMv2 non-strictly: a missing mask would
  stay NaN there).
- DINOv3's pretraining ``mask_token`` (unused by detection) is dropped, and written as zeros.
- The rotary ``periods`` buffers are recomputed by both sides; zoo → LibreYOLO writes them anyway.

Cached anchors and the decoder's aliases of ``up``/``reg_scale`` are dropped (LibreYOLO rebuilds
them). Size is inferred from the keys where it matters (ViT-Tiny vs timm DINOv3).
"""

from __future__ import annotations

from typing import Mapping

import torch

from zoo_core.detr.key_mapping import KeyRule, rename_keys
from zoo_core.detr_vit.libreyolo_keys import (
    VIT_DECODER_DROP,
    libreyolo_decoder_buffers,
    rope_vit_rules,
    split_elan_rules,
    vit_decoder_rules,
    vit_encoder_rules,
)
from zoo_core.key_renaming import LayoutConverter

__all__ = ["convert", "from_libreyolo", "to_libreyolo"]

_ROPE_BASE = 100.0
# LibreYOLO's evaluation size, decoder strides and points per level (its SIZE_CONFIGS), for the buffers it caches.
_LITE, _THREE = ((16, 32), (4, 2)), ((8, 16, 32), (3, 6, 3))
_DECODER_LAYOUT = {"atto": (320, *_LITE), "femto": (416, *_LITE), "pico": (640, *_LITE), "n": (640, (16, 32), (6, 6)),
                   "s": (640, *_THREE), "m": (640, *_THREE), "l": (640, *_THREE), "x": (640, *_THREE)}


def _adapter_rules(tiny: bool, swiglu: bool) -> list[KeyRule]:
    if tiny:
        vit = [
            KeyRule("backbone.dinov3._model.patch_embed.proj", "backbone.vit.patch_embed"),
            KeyRule("backbone.dinov3._model.cls_token", "backbone.vit.prefix_token"),
            *rope_vit_rules("backbone.dinov3._model", "backbone.vit"),
        ]
    else:
        vit = [
            KeyRule("backbone.dinov3.storage_tokens", "backbone.vit.reg_token"),
            KeyRule("backbone.dinov3.blocks.{i}.ls1.gamma", "backbone.vit.blocks.{i}.gamma_1"),
            KeyRule("backbone.dinov3.blocks.{i}.ls2.gamma", "backbone.vit.blocks.{i}.gamma_2"),
        ]
        if swiglu:  # ViT-S+/16: DINOv3's SwiGLU w1 (gate), w2 (value), w3 = timm's fc1_g, fc1_x, fc2
            vit += [
                KeyRule("backbone.dinov3.blocks.{i}.mlp.w1", "backbone.vit.blocks.{i}.mlp.fc1_g"),
                KeyRule("backbone.dinov3.blocks.{i}.mlp.w2", "backbone.vit.blocks.{i}.mlp.fc1_x"),
                KeyRule("backbone.dinov3.blocks.{i}.mlp.w3", "backbone.vit.blocks.{i}.mlp.fc2"),
            ]
        vit.append(KeyRule("backbone.dinov3", "backbone.vit"))
    return [
        *vit,
        KeyRule("backbone.sta.stem", "backbone.detail.stem"),
        KeyRule("backbone.sta.conv2", "backbone.detail.to_stride8"),
        KeyRule("backbone.sta.conv3", "backbone.detail.to_stride16"),
        KeyRule("backbone.sta.conv4", "backbone.detail.to_stride32"),
        KeyRule("backbone.convs.{i}.weight", "backbone.fuse.{i}.0.weight"),
        KeyRule("backbone.norms.{i}", "backbone.fuse.{i}.1"),
    ]


def _lite_encoder_rules() -> list[KeyRule]:
    return [
        KeyRule("encoder.input_proj.0", "encoder.input_projection", "conv_norm"),
        KeyRule("encoder.down_sample1.1", "encoder.downsample_coarse.1.0"),
        KeyRule("encoder.down_sample1.2", "encoder.downsample_coarse.1.1"),
        KeyRule("encoder.down_sample2.1", "encoder.downsample_fused.1.0"),
        KeyRule("encoder.down_sample2.2", "encoder.downsample_fused.1.1"),
        KeyRule("encoder.bi_fusion.cv", "encoder.global_fusion", "conv_norm"),
        *split_elan_rules("encoder.fpn_block", "encoder.top_down"),
        *split_elan_rules("encoder.pan_block", "encoder.bottom_up"),
    ]


def _rules(backbone: str, lite: bool, swiglu: bool = False) -> list[KeyRule]:
    if backbone == "hgnetv2":
        front = [KeyRule("backbone", "backbone")]  # timm's HGNetv2 names are the official ones
    else:
        front = _adapter_rules(tiny=backbone == "tiny", swiglu=swiglu)
    return [*front, *(_lite_encoder_rules() if lite else vit_encoder_rules()), *vit_decoder_rules("rms_swiglu")]


_DROP = (*VIT_DECODER_DROP, r"\.rope_embed\.periods$", r"^backbone\.dinov3\.mask_token$", r"\.qkv\.bias_mask$")


def _layout(keys, prefix_dinov3: str, prefix_tiny: str) -> tuple[str, bool]:
    keys = list(keys)
    if any(k.startswith(prefix_tiny) for k in keys):
        backbone = "tiny"
    elif any(k.startswith(prefix_dinov3) for k in keys):
        backbone = "dinov3"
    else:
        backbone = "hgnetv2"
    lite = any(k.startswith(("encoder.bi_fusion.", "encoder.global_fusion.")) for k in keys)
    return backbone, lite


def from_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO DEIMv2 ``model`` state dict (or the official one) → zoo's ``deimv2`` keys."""
    backbone, lite = _layout(state_dict, "backbone.dinov3.", "backbone.dinov3._model.")
    swiglu = any(k.endswith(".mlp.w1.weight") for k in state_dict)
    renamed = rename_keys(state_dict, _rules(backbone, lite, swiglu), to_zoo=True, drop=_DROP)
    if backbone == "dinov3":
        for key in [k for k in renamed if k.endswith(".attn.qkv.bias")]:
            q, _, v = renamed.pop(key).chunk(3)
            stem = key[: -len("qkv.bias")]
            renamed[stem + "q_bias"], renamed[stem + "v_bias"] = q, v
    return renamed


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """zoo's ``deimv2`` state dict → LibreYOLO keys (with the DINOv3 buffers its loader needs)."""
    backbone, lite = _layout(state_dict, "backbone.vit.reg_token", "backbone.vit.prefix_token")
    state = dict(state_dict)
    extra: dict[str, torch.Tensor] = {}
    if backbone == "dinov3":
        for key in [k for k in state if k.endswith(".attn.q_bias")]:
            stem = key[: -len("q_bias")]
            q, v = state.pop(key), state.pop(stem + "v_bias")
            theirs = stem.replace("backbone.vit.", "backbone.dinov3.", 1) + "qkv."
            extra[theirs + "bias"] = torch.cat([q, torch.zeros_like(q), v])
            extra[theirs + "bias_mask"] = torch.cat([torch.ones_like(q), torch.zeros_like(q), torch.ones_like(v)])
        dim = state["backbone.vit.cls_token"].shape[-1]
        extra["backbone.dinov3.mask_token"] = torch.zeros(1, dim, dtype=state["backbone.vit.cls_token"].dtype)
        heads = 6  # DINOv3 ViT-S/16 and S+/16
        extra["backbone.dinov3.rope_embed.periods"] = _periods(dim // heads)
    elif backbone == "tiny":  # ViT-Tiny (192 / 3 heads) and ViT-Tiny+ (256 / 4): head width 64
        extra["backbone.dinov3._model.rope_embed.periods"] = _periods(64)
    swiglu = any(k.endswith(".mlp.fc1_g.weight") for k in state)
    renamed = rename_keys(state, _rules(backbone, lite, swiglu), to_zoo=False)
    renamed.update(extra)
    for name in ("up", "reg_scale"):  # LibreYOLO's inner decoder holds the same two tensors
        renamed[f"decoder.decoder.{name}"] = renamed[f"decoder.{name}"]
    layers = len({k.split(".")[2] for k in state if k.startswith("decoder.layers.")})
    renamed.update(libreyolo_decoder_buffers(*_DECODER_LAYOUT[size], layers))
    return renamed


def _periods(head_dim: int) -> torch.Tensor:
    return _ROPE_BASE ** (2 * torch.arange(head_dim // 4, dtype=torch.float32) / (head_dim // 2))


# The registry ``converter``: LibreYOLO's names (the official release's too) read, LibreYOLO's written
# (``save(format="libreyolo")``).
convert = LayoutConverter(from_libreyolo, to_libreyolo)
