"""State-dict conversion between zoo's PP-LiteSeg and the LibreYOLO / SuperGradients checkpoint layout.

Pure key mapping (every tensor keeps its shape), no model is built. LibreYOLO 1.6.0's
``LibrePPLiteSegNet`` names its modules exactly as SuperGradients' ``PPLiteSegBase`` does, whose
Cityscapes releases (``pp_lite_{t,b}_seg{50,75}_cityscapes.pth``) LibreYOLO's checkpoints are
converted from; a SuperGradients state dict may carry the ``module.`` prefix of DDP, which the
``upstream`` source strips. Its conv-BN(-ReLU) blocks are ``<path>.seq.conv`` / ``<path>.seq.bn``
where zoo's ``ConvNormAct`` has ``<path>.0`` / ``<path>.1``.

Zoo ↔ LibreYOLO module paths (``s``: stage, ``j``: module index, ``i``: branch/head index):

====================================  ==============================================================
zoo                                   LibreYOLO
====================================  ==============================================================
backbone.stages.{0,1}.0               encoder.backbone.stages.block_s{2,4}.0
backbone.stages.{2,3,4}.j.reduce      encoder.backbone.stages.block_s{8,16,32}.j.conv_list.0
backbone.stages.s.0.down              encoder.backbone.stages.block_s*.0.conv_list.1.0
backbone.stages.s.0.branches.0        encoder.backbone.stages.block_s*.0.conv_list.1.1
backbone.stages.s.j.branches.i        encoder.backbone.stages.block_s*.j.conv_list.{i+1}
laterals.i                            encoder.proj_convs.i
context.branches.i                    encoder.context_module.branches.i.1
context.fuse                          encoder.context_module.conv_out
decoder.i.{attention.k, lateral_proj, out}  decoder.up_stages.i.{conv_atten.k, proj_skip, conv_out}
head.conv / head.classifier           seg_head.0.seg_head.0 / seg_head.0.seg_head.2
aux_heads.i.conv / .classifier        aux_heads.i.0.seg_head.0 / aux_heads.i.0.seg_head.2
====================================  ==============================================================

The first module of every STDC stage is the strided one (the only one with ``down``), so the
mapping needs no model: module 0 of stages 2–4 has ``conv_list.1`` split in two, the others not.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

import torch

__all__ = ["convert", "from_libreyolo", "from_upstream", "to_libreyolo"]

_STRIDE_OF_STAGE = {0: 2, 1: 4, 2: 8, 3: 16, 4: 32}
_STAGE_OF_STRIDE = {stride: stage for stage, stride in _STRIDE_OF_STAGE.items()}
_CONV = r"(?P<part>seq\.conv|seq\.bn)\.(?P<leaf>\w+)"  # LibreYOLO conv-BN leaf
_ZOO_CONV = r"(?P<part>0|1)\.(?P<leaf>\w+)"  # zoo ConvNormAct leaf
_TO_ZOO_PART = {"seq.conv": "0", "seq.bn": "1"}
_TO_LIBRE_PART = {"0": "seq.conv", "1": "seq.bn"}

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def _rules(pairs: list[tuple[str, Callable[[re.Match[str]], str]]]) -> list[Rule]:
    return [(re.compile(pattern), build) for pattern, build in pairs]


def _zoo_conv(match: re.Match[str]) -> str:
    return f"{_TO_ZOO_PART[match['part']]}.{match['leaf']}"


def _libre_conv(match: re.Match[str]) -> str:
    return f"{_TO_LIBRE_PART[match['part']]}.{match['leaf']}"


def _stage(match: re.Match[str]) -> int:
    """Zoo's stage index from a LibreYOLO ``block_s<stride>`` match."""
    return _STAGE_OF_STRIDE[int(match["s"])]


def _stride(match: re.Match[str]) -> int:
    """LibreYOLO's ``block_s<stride>`` stride from a zoo stage-index match."""
    return _STRIDE_OF_STAGE[int(match["s"])]


def _libre_branch(match: re.Match[str]) -> str:
    step = int(match["i"]) + 1
    # In the strided first module the first 3×3 conv follows the depthwise downsampling conv.
    return "1.1" if (match["j"] == "0" and step == 1) else str(step)


_FROM_LIBRE = _rules(
    [
        (
            rf"encoder\.backbone\.stages\.block_s(?P<s>2|4)\.(?P<j>\d+)\.{_CONV}",
            lambda m: f"backbone.stages.{_stage(m)}.{m['j']}.{_zoo_conv(m)}",
        ),
        (
            rf"encoder\.backbone\.stages\.block_s(?P<s>8|16|32)\.(?P<j>\d+)\.conv_list\.0\.{_CONV}",
            lambda m: f"backbone.stages.{_stage(m)}.{m['j']}.reduce.{_zoo_conv(m)}",
        ),
        (
            rf"encoder\.backbone\.stages\.block_s(?P<s>8|16|32)\.(?P<j>0)\.conv_list\.1\.0\.{_CONV}",
            lambda m: f"backbone.stages.{_stage(m)}.0.down.{_zoo_conv(m)}",
        ),
        (
            rf"encoder\.backbone\.stages\.block_s(?P<s>8|16|32)\.(?P<j>0)\.conv_list\.1\.1\.{_CONV}",
            lambda m: f"backbone.stages.{_stage(m)}.0.branches.0.{_zoo_conv(m)}",
        ),
        (
            rf"encoder\.backbone\.stages\.block_s(?P<s>8|16|32)\.(?P<j>\d+)\.conv_list\.(?P<step>[1-3])\.{_CONV}",
            lambda m: f"backbone.stages.{_stage(m)}.{m['j']}.branches.{int(m['step']) - 1}.{_zoo_conv(m)}",
        ),
        (rf"encoder\.proj_convs\.(?P<i>\d+)\.{_CONV}", lambda m: f"laterals.{m['i']}.{_zoo_conv(m)}"),
        (
            rf"encoder\.context_module\.branches\.(?P<i>\d+)\.1\.{_CONV}",
            lambda m: f"context.branches.{m['i']}.{_zoo_conv(m)}",
        ),
        (rf"encoder\.context_module\.conv_out\.{_CONV}", lambda m: f"context.fuse.{_zoo_conv(m)}"),
        (
            rf"decoder\.up_stages\.(?P<i>\d+)\.conv_atten\.(?P<k>[01])\.{_CONV}",
            lambda m: f"decoder.{m['i']}.attention.{m['k']}.{_zoo_conv(m)}",
        ),
        (
            rf"decoder\.up_stages\.(?P<i>\d+)\.proj_skip\.{_CONV}",
            lambda m: f"decoder.{m['i']}.lateral_proj.{_zoo_conv(m)}",
        ),
        (rf"decoder\.up_stages\.(?P<i>\d+)\.conv_out\.{_CONV}", lambda m: f"decoder.{m['i']}.out.{_zoo_conv(m)}"),
        (rf"seg_head\.0\.seg_head\.0\.{_CONV}", lambda m: f"head.conv.{_zoo_conv(m)}"),
        (r"seg_head\.0\.seg_head\.2\.weight", lambda m: "head.classifier.weight"),
        (rf"aux_heads\.(?P<i>\d+)\.0\.seg_head\.0\.{_CONV}", lambda m: f"aux_heads.{m['i']}.conv.{_zoo_conv(m)}"),
        (r"aux_heads\.(?P<i>\d+)\.0\.seg_head\.2\.weight", lambda m: f"aux_heads.{m['i']}.classifier.weight"),
    ]
)

_TO_LIBRE = _rules(
    [
        (
            rf"backbone\.stages\.(?P<s>[01])\.(?P<j>\d+)\.{_ZOO_CONV}",
            lambda m: f"encoder.backbone.stages.block_s{_stride(m)}.{m['j']}.{_libre_conv(m)}",
        ),
        (
            rf"backbone\.stages\.(?P<s>[234])\.(?P<j>\d+)\.reduce\.{_ZOO_CONV}",
            lambda m: f"encoder.backbone.stages.block_s{_stride(m)}.{m['j']}.conv_list.0.{_libre_conv(m)}",
        ),
        (
            rf"backbone\.stages\.(?P<s>[234])\.0\.down\.{_ZOO_CONV}",
            lambda m: f"encoder.backbone.stages.block_s{_stride(m)}.0.conv_list.1.0.{_libre_conv(m)}",
        ),
        (
            rf"backbone\.stages\.(?P<s>[234])\.(?P<j>\d+)\.branches\.(?P<i>[0-2])\.{_ZOO_CONV}",
            lambda m: (
                f"encoder.backbone.stages.block_s{_stride(m)}.{m['j']}"
                f".conv_list.{_libre_branch(m)}.{_libre_conv(m)}"
            ),
        ),
        (rf"laterals\.(?P<i>\d+)\.{_ZOO_CONV}", lambda m: f"encoder.proj_convs.{m['i']}.{_libre_conv(m)}"),
        (
            rf"context\.branches\.(?P<i>\d+)\.{_ZOO_CONV}",
            lambda m: f"encoder.context_module.branches.{m['i']}.1.{_libre_conv(m)}",
        ),
        (rf"context\.fuse\.{_ZOO_CONV}", lambda m: f"encoder.context_module.conv_out.{_libre_conv(m)}"),
        (
            rf"decoder\.(?P<i>\d+)\.attention\.(?P<k>[01])\.{_ZOO_CONV}",
            lambda m: f"decoder.up_stages.{m['i']}.conv_atten.{m['k']}.{_libre_conv(m)}",
        ),
        (
            rf"decoder\.(?P<i>\d+)\.lateral_proj\.{_ZOO_CONV}",
            lambda m: f"decoder.up_stages.{m['i']}.proj_skip.{_libre_conv(m)}",
        ),
        (rf"decoder\.(?P<i>\d+)\.out\.{_ZOO_CONV}", lambda m: f"decoder.up_stages.{m['i']}.conv_out.{_libre_conv(m)}"),
        (rf"head\.conv\.{_ZOO_CONV}", lambda m: f"seg_head.0.seg_head.0.{_libre_conv(m)}"),
        (r"head\.classifier\.weight", lambda m: "seg_head.0.seg_head.2.weight"),
        (rf"aux_heads\.(?P<i>\d+)\.conv\.{_ZOO_CONV}", lambda m: f"aux_heads.{m['i']}.0.seg_head.0.{_libre_conv(m)}"),
        (r"aux_heads\.(?P<i>\d+)\.classifier\.weight", lambda m: f"aux_heads.{m['i']}.0.seg_head.2.weight"),
    ]
)


def _rename(state_dict: Mapping[str, torch.Tensor], rules: list[Rule], what: str) -> dict[str, torch.Tensor]:
    renamed: dict[str, torch.Tensor] = {}
    unknown = []
    for name, tensor in state_dict.items():
        for pattern, build in rules:
            match = pattern.fullmatch(name)
            if match:
                renamed[build(match)] = tensor
                break
        else:
            unknown.append(name)
    if unknown:
        shown = ", ".join(unknown[:8]) + (f" (+{len(unknown) - 8} more)" if len(unknown) > 8 else "")
        raise ValueError(f"not a {what} PP-LiteSeg state dict: unexpected key(s) {shown}")
    return renamed


def from_libreyolo(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO 1.6.0 ``LibrePPLiteSegNet`` state dict (with its auxiliary heads) in zoo's keys."""
    return _rename(state_dict, _FROM_LIBRE, "LibreYOLO")


def from_upstream(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A SuperGradients ``PPLiteSegBase`` state dict (``module.`` prefix allowed) in zoo's keys."""
    stripped = {name.removeprefix("module."): tensor for name, tensor in state_dict.items()}
    return _rename(stripped, _FROM_LIBRE, "SuperGradients")


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Zoo's PP-LiteSeg state dict in LibreYOLO 1.6.0's keys (``size`` is the same in both; kept for the API)."""
    del size  # one key layout serves every size
    return _rename(state_dict, _TO_LIBRE, "zoo")


def convert(size: str, state_dict: Mapping[str, torch.Tensor], source: str, target: str) -> dict[str, torch.Tensor] | None:
    """The registry ``converter`` of ppliteseg: ``state_dict`` from layout ``source`` to ``target`` (one of them
    ``"zoo"``, the other ``"libreyolo"`` or ``"upstream"``, which share their names); None for any other pair."""
    del size  # 50 and 75 share one network and one key layout
    if target == "zoo" and source == "libreyolo":
        return from_libreyolo(state_dict)
    if target == "zoo" and source == "upstream":
        return from_upstream(state_dict)
    if source == "zoo" and target in ("libreyolo", "upstream"):
        return _rename(state_dict, _TO_LIBRE, "zoo")
    return None

