"""RT-DETR checkpoints: LibreYOLO 1.6.0 keys ↔ zoo keys (pure renaming; no model is built).

LibreYOLO keeps the official RT-DETR names: ``backbone.conv1.conv1_{1,2,3}`` and
``backbone.res_layers.{s}.blocks.{b}.branch2{a,b,c}`` / ``short`` (PResNet), HGNetv2 with
``aggregation_squeeze_conv``/``aggregation_excitation_conv`` and zero-padded ``stem2a/2b``
(``conv.1``), ``encoder.*`` with CSPRepLayers, ``decoder.*``. Checkpoints whose backbone uses
frozen BatchNorms (the published R50/R101/L/X) have no ``num_batches_tracked``; zoo adds them.
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

from zoo_core.detr.key_mapping import KeyRule, add_batch_counters, rename_keys
from zoo_core.detr.libreyolo_keys import aifi_rules, csp_rules, delta_decoder_rules
from zoo_core.key_renaming import LayoutConverter

__all__ = ["convert", "RULES", "from_libreyolo", "to_libreyolo", "FROZEN_NORM_SIZES"]

#: Sizes whose LibreYOLO backbone, when loaded from a checkpoint, uses FrozenBatchNorm2d (no counters).
FROZEN_NORM_SIZES = frozenset({"r50", "r50m", "r101", "l", "x"})

_BACKBONE = [
    # PResNet
    *(KeyRule(f"backbone.conv1.conv1_{k + 1}", f"backbone.stem.{k}", "conv_norm") for k in range(3)),
    *(KeyRule(f"backbone.res_layers.{{s}}.blocks.{{b}}.branch2{a}", f"backbone.stages.{{s}}.{{b}}.conv{n}", "conv_norm") for n, a in ((1, "a"), (2, "b"), (3, "c"))),
    KeyRule("backbone.res_layers.{s}.blocks.{b}.short.conv", "backbone.stages.{s}.{b}.projection", "conv_norm"),  # pooled: short.conv.{conv,norm}
    # HGNetv2 (RT-DETR names → timm names)
    KeyRule("backbone.stem.stem2a.conv.1", "backbone.stem.stem2a.conv"),
    KeyRule("backbone.stem.stem2b.conv.1", "backbone.stem.stem2b.conv"),
    KeyRule("backbone.stages.{s}.blocks.{b}.aggregation_squeeze_conv", "backbone.stages.{s}.blocks.{b}.aggregation.0"),
    KeyRule("backbone.stages.{s}.blocks.{b}.aggregation_excitation_conv", "backbone.stages.{s}.blocks.{b}.aggregation.1"),
    KeyRule("backbone.stem", "backbone.stem"),
    KeyRule("backbone.stages", "backbone.stages"),
]

_ENCODER = [
    KeyRule("encoder.input_proj.{i}", "encoder.input_projections.{i}"),  # Sequential(conv, bn): already 0/1
    *aifi_rules(),
    KeyRule("encoder.lateral_convs.{k}", "encoder.lateral.{k}", "conv_norm"),
    KeyRule("encoder.downsample_convs.{k}", "encoder.downsample.{k}", "conv_norm"),
    *csp_rules("encoder.fpn_blocks.{k}", "encoder.top_down.{k}"),
    *csp_rules("encoder.pan_blocks.{k}", "encoder.bottom_up.{k}"),
]

RULES = [*_BACKBONE, *_ENCODER, *delta_decoder_rules()]


def _unpooled_shortcut(key: str) -> str:
    """The stride-1 projection of stage 0 is ``short.{conv,norm}``; name it like the pooled ones (``short.conv.*``)."""
    key = re.sub(r"\.short\.conv\.weight$", ".short.conv.conv.weight", key)
    return re.sub(r"\.short\.norm\.", ".short.conv.norm.", key)


def from_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO ``LibreRTDETR`` ``model`` state dict → zoo's ``rtdetr`` keys."""
    normalised = {_unpooled_shortcut(k): v for k, v in state_dict.items()}
    return add_batch_counters(rename_keys(normalised, RULES, to_zoo=True))


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """zoo's ``rtdetr`` state dict → LibreYOLO keys (loadable by ``LibreRTDETR``).

    For sizes LibreYOLO builds with frozen backbone BatchNorms the backbone counters are dropped.
    """
    renamed = rename_keys(state_dict, RULES, to_zoo=False)
    out = {}
    for key, tensor in renamed.items():
        if key.startswith("backbone.res_layers.0.blocks.0.short.conv."):  # stage 0: stride-1 projection, no pool
            key = key.replace(".short.conv.", ".short.", 1)
        if size in FROZEN_NORM_SIZES and key.startswith("backbone.") and key.endswith("num_batches_tracked"):
            continue
        out[key] = tensor
    return out


# The registry ``converter``: LibreYOLO's names read, and written back (``save(format="libreyolo")``).
convert = LayoutConverter(from_libreyolo, to_libreyolo, reads=("libreyolo",))
