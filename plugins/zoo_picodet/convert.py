"""State-dict conversion between LibreYOLO 1.6.0 / Bo396543018 PicoDet checkpoints and zoo's ``picodet``.

LibreYOLO keeps mmdet's layer names (``backbone.blocks.3.conv_pw.conv.weight``,
``neck.top_down_blocks.0.main_conv.bn.weight``, ``head.gfl_cls.2.bias``); zoo names layers by role
(``backbone.blocks.3.expand.0.weight``, ``neck.top_down.0.main.1.weight``,
``head.preds.2.bias``). A schema of module kinds, each listing its children as (LibreYOLO name,
zoo name, child kind), translates a key in either direction by walking it from the root
(``zoo_core.key_renaming.KeySchema``).

``upstream``: Bo396543018/Picodet_Pytorch's mmdet checkpoints (PyTorch ports of
PaddleDetection's legacy PicoDet), whose names differ from LibreYOLO's only in a few places
(LibreYOLO's ``models/picodet/convert.py`` lists them): ``bbox_head.`` for ``head.``, ESNet
blocks named ``<stage>_<index>`` (stages 2-4, from 1) instead of a flat list, ``neck.trans.trans.``
for ``neck.trans.``, and an extra ``.conv`` inside SE convs; EMA copies (``ema_*``) and the fixed
DFL projection buffer are dropped. (PaddleDetection's own ``.pdparams`` are not PyTorch files.)
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

from zoo_core.key_renaming import LEAF, KeySchema

__all__ = ["from_libreyolo", "to_libreyolo", "from_upstream", "convert"]

_STAGE_REPEATS = (3, 7, 3)

# kind -> [(LibreYOLO child, zoo child, child kind)]; "each:<kind>" is an indexed list of <kind>.
_KINDS: dict[str, list[tuple[str, str | None, str]]] = {
    "conv": [("conv", "0", LEAF), ("bn", "1", LEAF)],
    "dwsep": [("depthwise_conv", "depthwise", "conv"), ("pointwise_conv", "pointwise", "conv")],
    "se": [("conv1", "reduce", LEAF), ("conv2", "restore", LEAF)],
    "es_block": [
        ("conv_pw", "expand", "conv"),
        ("conv_dw", "depthwise", "conv"),
        ("se", "se", "se"),
        ("conv_linear", "project", "conv"),
    ],
    "es_down_block": [
        ("conv_dw_1", "shortcut_depthwise", "conv"),
        ("conv_linear_1", "shortcut_project", "conv"),
        ("conv_pw_2", "expand", "conv"),
        ("conv_dw_2", "depthwise", "conv"),
        ("se", "se", "se"),
        ("conv_linear_2", "project", "conv"),
        ("conv_dw_mv1", "mix_depthwise", "conv"),
        ("conv_pw_mv1", "mix_pointwise", "conv"),
    ],
    "bottleneck": [("conv1", "reduce", "conv"), ("conv2", "spatial", "dwsep")],
    "csp": [
        ("main_conv", "main", "conv"),
        ("short_conv", "bypass", "conv"),
        ("final_conv", "mix", "conv"),
        ("blocks", "bottlenecks", "each:bottleneck"),
    ],
    "neck": [
        ("trans", "lateral", "each:conv"),
        ("top_down_blocks", "top_down", "each:csp"),
        ("downsamples", "downsamples", "each:dwsep"),
        ("bottom_up_blocks", "bottom_up", "each:csp"),
        ("first_top_conv", "extra_from_input", "dwsep"),
        ("second_top_conv", "extra_from_output", "dwsep"),
    ],
    "tower": [(str(i), str(i), "dwsep") for i in range(8)],
    "head": [("cls_convs", "towers", "each:tower"), ("gfl_cls", "preds", "each:leaf")],
    "root": [
        ("backbone.conv1", "backbone.stem", "conv"),
        *(
            (f"backbone.blocks.{index}", f"backbone.blocks.{index}", "es_down_block" if first else "es_block")
            for index, first in enumerate(i == 0 for repeats in _STAGE_REPEATS for i in range(repeats))
        ),
        ("neck", "neck", "neck"),
        ("head", "head", "head"),
    ],
}
_SCHEMA = KeySchema(_KINDS, what="PicoDet layer")


def from_libreyolo(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO PicoDet state dict (``module.`` prefixes allowed) in zoo's keys."""
    # PicoDet's schema drops no tensor, so every key has a zoo name.
    return {_SCHEMA.key_to_zoo(key.removeprefix("module."), as_written=key): value for key, value in state_dict.items()}


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A zoo ``picodet`` state dict in LibreYOLO 1.6.0's keys (``size`` only for the common signature)."""
    del size
    return _SCHEMA.from_zoo(state_dict)


def _flat_block_index() -> dict[str, int]:
    """Bo's ``<stage>_<index>`` block names (stages 2, 3, 4; indices from 1) → flat block index."""
    names, flat = {}, 0
    for stage, repeats in enumerate(_STAGE_REPEATS, start=2):
        for index in range(1, repeats + 1):
            names[f"{stage}_{index}"] = flat
            flat += 1
    return names


def from_upstream(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Bo396543018/Picodet_Pytorch (mmdet) state dict in zoo's keys."""
    blocks = _flat_block_index()
    renamed = {}
    for key, value in state_dict.items():
        key = key.removeprefix("module.")
        if key.startswith("ema_") or key.endswith("integral.project"):
            continue
        if key.startswith("bbox_head."):
            key = "head." + key[len("bbox_head.") :]
        match = re.match(r"backbone\.(\d+_\d+)\.", key)
        if match:
            if match.group(1) not in blocks:
                raise KeyError(f"unknown ESNet block {match.group(1)!r} in key {key!r}")
            key = f"backbone.blocks.{blocks[match.group(1)]}." + key[match.end() :]
        if key.startswith("neck.trans.trans."):
            key = "neck.trans." + key[len("neck.trans.trans.") :]
        key = re.sub(r"\.se\.conv([12])\.conv\.", r".se.conv\1.", key)
        renamed[key] = value
    return from_libreyolo(renamed)


def convert(size: str, state_dict: Mapping[str, torch.Tensor], source: str, target: str) -> dict[str, torch.Tensor] | None:
    """The registry ``converter`` of picodet: ``libreyolo`` and ``upstream`` (Bo396543018 mmdet)
    files to zoo, zoo to ``libreyolo``; None for other layouts or keys that are not that layout."""
    if source == "zoo" and target == "libreyolo":
        return to_libreyolo(size, state_dict)
    if target != "zoo" or source not in ("libreyolo", "upstream"):
        return None
    try:
        return from_libreyolo(state_dict) if source == "libreyolo" else from_upstream(state_dict)
    except KeyError:  # not this layout (e.g. a file already in zoo's keys)
        return None
