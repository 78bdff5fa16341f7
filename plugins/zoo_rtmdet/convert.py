"""RTMDet weights in other layouts: LibreYOLO 1.6's and mmdetection's (pure key/tensor maps).

- ``libreyolo``: LibreYOLO 1.6's ``LibreRTMDet`` keys, both ways. LibreYOLO keeps mmdetection's
  module names: ``ConvModule``s (``.conv`` / ``.bn``, zoo's ``ConvNormAct`` ``.0`` / ``.1``),
  backbone stages ``stage1..4`` (``0`` the downsample, then ``1`` the SPP of stage 4 or the CSP
  layer, ``2`` stage 4's CSP layer), CSP layers with ``main_conv`` / ``short_conv`` /
  ``final_conv`` and blocks ``conv1`` / ``conv2.depthwise_conv`` / ``conv2.pointwise_conv``, the
  neck's ``reduce_layers`` / ``top_down_blocks`` / ``downsamples`` / ``bottom_up_blocks`` /
  ``out_convs``, and the head's ``rtm_cls`` / ``rtm_reg``.
- ``upstream``: an mmdetection RTMDet checkpoint's ``state_dict``: LibreYOLO's keys with
  ``bbox_head.`` for ``head.`` and a ``data_preprocessor.*`` that zoo does not need. Import only.

Two changes are more than renaming. The head's tower convs are shared by the levels: the foreign
layouts store the same tensor once per level (``head.cls_convs.<level>.<i>.conv.weight``), zoo
once (``head.cls_convs.<i>.weight``), next to per-level BatchNorms ``head.cls_norms.<level>.<i>``.
And the published models read BGR images where zoo's read RGB, so the stem's first conv has its
input channels reversed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Mapping

from zoo_core.key_renaming import KeyRenamer

if TYPE_CHECKING:
    import torch

__all__ = [
    "LIBREYOLO_KEYS", "from_libreyolo", "to_libreyolo", "from_upstream", "convert",
    "INSTANCE_KEYS", "from_libreyolo_instance", "to_libreyolo_instance", "convert_instance",
]

_BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
_STAGES = 4  # CSPNeXt's P5 arch; the last stage holds the SPP
_FIRST_CONV = "backbone.stem.0.0.weight"  # zoo's name; LibreYOLO's is backbone.stem.0.conv.weight
_SHARED_CONV = re.compile(r"^head\.(cls|reg)_convs\.(\d+)\.(\d+)\.conv\.weight$")  # LibreYOLO: branch, level, index

# LibreYOLO <-> zoo, applied in this order towards zoo (and in reverse towards LibreYOLO).
LIBREYOLO_KEYS = KeyRenamer([
    (".conv.weight$", ".0.weight$"),
    *[(f".bn.{name}$", f".1.{name}$") for name in _BN],
    *[(f"^backbone.stage{number}.0.", f"^backbone.stages.{number - 1}.downsample.") for number in range(1, _STAGES + 1)],
    *[(f"^backbone.stage{number}.1.", f"^backbone.stages.{number - 1}.csp.") for number in range(1, _STAGES)],
    (f"^backbone.stage{_STAGES}.1.", f"^backbone.stages.{_STAGES - 1}.spp."),
    (f"^backbone.stage{_STAGES}.2.", f"^backbone.stages.{_STAGES - 1}.csp."),
    (".spp.conv1.", ".spp.reduce."),
    (".spp.conv2.", ".spp.aggregate."),
    (".main_conv.", ".main."),
    (".short_conv.", ".bypass."),
    (".final_conv.", ".merge."),
    (".blocks.{j}.conv1.", ".blocks.{j}.conv."),
    (".blocks.{j}.conv2.depthwise_conv.", ".blocks.{j}.depthwise."),
    (".blocks.{j}.conv2.pointwise_conv.", ".blocks.{j}.pointwise."),
    ("^neck.reduce_layers.", "^neck.lateral."),
    ("^neck.top_down_blocks.", "^neck.top_down."),
    ("^neck.downsamples.", "^neck.downsample."),
    ("^neck.bottom_up_blocks.", "^neck.bottom_up."),
    ("^neck.out_convs.", "^neck.outputs."),
    # Head: level 0's copy of a shared tower conv, and each level's tower BatchNorm. (The prediction
    # convs, zoo's head.cls_preds.<level>, are renamed apart: ".0.weight" would read as a ConvNormAct.)
    *[(f"^head.{branch}_convs.0.{{i}}.0.weight$", f"^head.{branch}_convs.{{i}}.weight$") for branch in ("cls", "reg")],
    *[(f"^head.{branch}_convs.{{level}}.{{i}}.1.", f"^head.{branch}_norms.{{level}}.{{i}}.") for branch in ("cls", "reg")],
])
_PREDICTIONS = {"head.rtm_cls.": "head.cls_preds.", "head.rtm_reg.": "head.reg_preds."}  # LibreYOLO -> zoo prefixes


def _rename_predictions(state_dict: Mapping[str, "torch.Tensor"], prefixes: Mapping[str, str]) -> tuple[dict, dict]:
    """``(renamed prediction-conv entries, every other entry)`` for the ``prefixes`` old -> new."""
    predictions, rest = {}, {}
    for key, tensor in state_dict.items():
        old = next((prefix for prefix in prefixes if key.startswith(prefix)), None)
        if old is None:
            rest[key] = tensor
        else:
            predictions[prefixes[old] + key[len(old) :]] = tensor
    return predictions, rest


def from_libreyolo(state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """A LibreYOLO 1.6 RTMDet ``model`` state dict → zoo's keys.

    The levels' copies of each shared tower conv must be equal (they are in every LibreYOLO and
    mmdetection checkpoint: the modules are aliases); level 0's is kept.
    """
    kept: dict[str, "torch.Tensor"] = {}
    copies: dict[tuple[str, str], "torch.Tensor"] = {}
    for key, tensor in state_dict.items():
        if any(part in key for part in ("rtm_kernel", "mask_head.")):
            raise ValueError(f"{key!r} belongs to RTMDet-Ins (instance segmentation): load the file as rtmdet_ins; rtmdet is the detector")
        shared = _SHARED_CONV.match(key)
        if shared:
            branch, level, index = shared.groups()
            first = copies.setdefault((branch, index), tensor)
            if first.shape != tensor.shape or not bool((first == tensor).all()):
                raise ValueError(f"{key} differs from level 0's copy: RTMDet's head tower convs must be shared")
            if level != "0":
                continue
        kept[key] = tensor
    predictions, kept = _rename_predictions(kept, _PREDICTIONS)
    converted = {**LIBREYOLO_KEYS.to_zoo(kept), **predictions}
    if _FIRST_CONV in converted:
        converted[_FIRST_CONV] = converted[_FIRST_CONV].flip(1)  # BGR -> RGB input channels
    return converted


def to_libreyolo(size: str, state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """zoo's RTMDet state dict → LibreYOLO 1.6's ``model`` state dict, as its own ``state_dict()``
    holds it (every level's alias of the shared tower convs included). ``size`` is not needed."""
    del size
    weights = dict(state_dict)
    if _FIRST_CONV in weights:
        weights[_FIRST_CONV] = weights[_FIRST_CONV].flip(1)  # RGB -> BGR
    predictions, weights = _rename_predictions(weights, {zoo: libre for libre, zoo in _PREDICTIONS.items()})
    converted = {**LIBREYOLO_KEYS.from_zoo(weights), **predictions}
    levels = sorted({int(match.group(1)) for key in state_dict if (match := re.match(r"^head\.cls_preds\.(\d+)\.", key))})
    for key in [key for key in converted if _SHARED_CONV.match(key)]:
        branch, _, index = _SHARED_CONV.match(key).groups()
        for level in levels:
            converted[f"head.{branch}_convs.{level}.{index}.conv.weight"] = converted[key]
    return converted


def from_upstream(state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"] | None:
    """An mmdetection RTMDet ``state_dict`` → zoo's keys (None when it is not one)."""
    if not any(key.startswith("bbox_head.rtm_") for key in state_dict):
        return None
    renamed = {
        ("head." + key.removeprefix("bbox_head.") if key.startswith("bbox_head.") else key): tensor
        for key, tensor in state_dict.items()
        if not key.startswith("data_preprocessor.")
    }
    return from_libreyolo(renamed)


def convert(size: str, state_dict: Mapping[str, "torch.Tensor"], source: str, target: str = "zoo") -> dict | None:
    """The registry ``converter`` of rtmdet (see the module docstring); None for other layouts."""
    if target == "zoo" and source == "libreyolo":
        return from_libreyolo(state_dict)
    if target == "zoo" and source == "upstream":
        return from_upstream(state_dict)
    if source == "zoo" and target == "libreyolo":
        return to_libreyolo(size, state_dict)
    return None


# RTMDet-Ins (LibreYOLO 1.6's LibreRTMDet with task "segment", mmdetection's RTMDetInsSepBNHead). The published
# head files its class tower under reg_convs too (the same modules), so a foreign file holds every tower tensor
# twice: zoo keeps the cls_convs copy and writes both back. The kernel towers are per level (not shared), the
# mask-feature branch is mmdetection's mask_head.
INSTANCE_KEYS = KeyRenamer([
    *LIBREYOLO_KEYS.pairs,
    ("^head.mask_head.fusion_conv.", "^head.mask_features.fusion."),
    ("^head.mask_head.stacked_convs.", "^head.mask_features.convs."),
    ("^head.mask_head.projection.", "^head.mask_features.projection."),
])
_INSTANCE_PREDICTIONS = {**_PREDICTIONS, "head.rtm_kernel.": "head.kernel_preds."}
_ALIASED_TOWER = re.compile(r"^head\.reg_convs\.(.+)$")  # RTMDet-Ins: reg_convs.<level>.<i>.* are the cls_convs'


def from_libreyolo_instance(state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """A LibreYOLO 1.6 RTMDet-Ins ``model`` state dict → zoo's ``rtmdet_ins`` keys.

    The ``reg_convs`` entries must equal the ``cls_convs`` ones (aliases in every LibreYOLO and
    mmdetection checkpoint) and the levels' copies of each shared conv must be equal; one is kept.
    """
    if not any(key.startswith("head.rtm_kernel.") for key in state_dict):
        raise ValueError("this RTMDet state dict has no dynamic-kernel convs (head.rtm_kernel.*): it is the detector, "
                         "load it as rtmdet, not rtmdet_ins")
    kept: dict[str, "torch.Tensor"] = {}
    copies: dict[str, "torch.Tensor"] = {}
    for key, tensor in state_dict.items():
        aliased = _ALIASED_TOWER.match(key)
        if aliased:
            twin = state_dict.get(f"head.cls_convs.{aliased.group(1)}")
            if twin is None or twin.shape != tensor.shape or not bool((twin == tensor).all()):
                raise ValueError(f"{key} differs from its head.cls_convs twin: RTMDet-Ins's regression reads the class tower")
            continue
        shared = _SHARED_CONV.match(key)
        if shared:
            _, level, index = shared.groups()
            first = copies.setdefault(index, tensor)
            if first.shape != tensor.shape or not bool((first == tensor).all()):
                raise ValueError(f"{key} differs from level 0's copy: RTMDet's head tower convs must be shared")
            if level != "0":
                continue
        kept[key] = tensor
    predictions, kept = _rename_predictions(kept, _INSTANCE_PREDICTIONS)
    converted = {**INSTANCE_KEYS.to_zoo(kept), **predictions}
    if _FIRST_CONV in converted:
        converted[_FIRST_CONV] = converted[_FIRST_CONV].flip(1)  # BGR -> RGB input channels
    return converted


def to_libreyolo_instance(size: str, state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """zoo's ``rtmdet_ins`` state dict → LibreYOLO 1.6's RTMDet-Ins ``model`` state dict as its own ``state_dict()``
    holds it (every level's copy of the shared convs and the ``reg_convs`` aliases included). ``size`` is not needed."""
    del size
    weights = dict(state_dict)
    if _FIRST_CONV in weights:
        weights[_FIRST_CONV] = weights[_FIRST_CONV].flip(1)  # RGB -> BGR
    predictions, weights = _rename_predictions(weights, {zoo: libre for libre, zoo in _INSTANCE_PREDICTIONS.items()})
    converted = {**INSTANCE_KEYS.from_zoo(weights), **predictions}
    levels = sorted({int(match.group(1)) for key in state_dict if (match := re.match(r"^head\.cls_preds\.(\d+)\.", key))})
    for key in [key for key in converted if _SHARED_CONV.match(key)]:
        _, _, index = _SHARED_CONV.match(key).groups()
        for level in levels:
            converted[f"head.cls_convs.{level}.{index}.conv.weight"] = converted[key]
    for key in [key for key in converted if key.startswith("head.cls_convs.")]:
        converted["head.reg_convs." + key.removeprefix("head.cls_convs.")] = converted[key]
    return converted


def convert_instance(size: str, state_dict: Mapping[str, "torch.Tensor"], source: str, target: str = "zoo") -> dict | None:
    """The registry ``converter`` of rtmdet_ins: LibreYOLO's layout both ways, mmdetection's (``bbox_head.``) into zoo."""
    if target == "zoo" and source == "libreyolo":
        return from_libreyolo_instance(state_dict)
    if target == "zoo" and source == "upstream":
        if not any(key.startswith("bbox_head.rtm_kernel") for key in state_dict):
            return None
        return from_libreyolo_instance({
            ("head." + key.removeprefix("bbox_head.") if key.startswith("bbox_head.") else key): tensor
            for key, tensor in state_dict.items() if not key.startswith("data_preprocessor.")
        })
    if source == "zoo" and target == "libreyolo":
        return to_libreyolo_instance(size, state_dict)
    return None
