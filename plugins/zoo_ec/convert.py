"""EdgeCrafter ECDet checkpoints: LibreYOLO 1.6 keys (= the official release's) ↔ zoo keys (pure renaming).

LibreYOLO keeps the upstream names (``backbone.backbone.*`` for ECViT, ``backbone.projector``,
``encoder.fpn_blocks``, ``decoder.decoder.layers`` ...). The rotary ``periods`` buffer, cached
anchors, validity mask, point scales and the inner decoder's aliases of ``up``/``reg_scale`` are
dropped on the way in; on the way out they are all written back as LibreYOLO builds them for its
640-pixel evaluation size.
"""

from __future__ import annotations

from typing import Mapping

import torch

from zoo_core.detr.key_mapping import KeyRule, rename_keys
from zoo_core.detr_vit.libreyolo_keys import VIT_DECODER_DROP, libreyolo_decoder_buffers, rope_vit_rules, vit_decoder_rules, vit_encoder_rules
from zoo_core.key_renaming import LayoutConverter

__all__ = ["convert", "from_libreyolo", "to_libreyolo"]

_RULES = [
    KeyRule("backbone.backbone.patch_embed.convs.{i}", "backbone.vit.patch_embed.convs.{i}", "conv_norm"),
    KeyRule("backbone.backbone.patch_embed.proj", "backbone.vit.patch_embed.proj"),
    KeyRule("backbone.backbone.register_token", "backbone.vit.prefix_token"),
    *rope_vit_rules("backbone.backbone", "backbone.vit"),
    KeyRule("backbone.projector.{i}", "backbone.projections.{i}", "conv_norm"),
    *vit_encoder_rules(),
    *vit_decoder_rules("layer_norm"),
]
_DROP = (*VIT_DECODER_DROP, r"\.rope_embed\.periods$")
_ROPE_BASE = 100.0


def from_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO EC ``model`` state dict (or the official one) → zoo's ``ec`` keys."""
    return rename_keys(state_dict, _RULES, to_zoo=True, drop=_DROP)


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """zoo's ``ec`` state dict → LibreYOLO keys."""
    renamed = rename_keys(state_dict, _RULES, to_zoo=False)
    for name in ("up", "reg_scale"):  # LibreYOLO's inner decoder holds the same two tensors
        renamed[f"decoder.decoder.{name}"] = renamed[f"decoder.{name}"]
    head_dim = 64  # ECViT-T (192 / 3), T+ (256 / 4), S and S+ (384 / 6)
    renamed["backbone.backbone.rope_embed.periods"] = _ROPE_BASE ** (2 * torch.arange(head_dim // 4, dtype=torch.float32) / (head_dim // 2))
    renamed.update(libreyolo_decoder_buffers(640, (8, 16, 32), (3, 6, 3), 4))
    return renamed


# The registry ``converter``: LibreYOLO's names (the official release's too) read, LibreYOLO's written
# (``save(format="libreyolo")``).
convert = LayoutConverter(from_libreyolo, to_libreyolo)
