"""YOLOX checkpoint conversion: LibreYOLO 1.6.0 / official Megvii YOLOX keys <-> zoo keys.

LibreYOLO's ``LibreYOLOXModel`` keeps the official YOLOX module names (``backbone.backbone.dark3``,
``backbone.C3_p4``, ``head.cls_convs`` ...), so one mapping serves both sources (``"libreyolo"``:
a LibreYOLO checkpoint's ``model`` state dict; ``"upstream"``: the ``model`` entry of an official
``yolox_*.pth``). Tensors are passed through unchanged; the mapping is pure key renaming, the
same for every size.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

__all__ = ["convert", "to_zoo", "to_libreyolo", "SOURCES"]

SOURCES = ("libreyolo", "upstream")

_Rule = tuple["re.Pattern[str]", "str | Callable[[re.Match[str]], str]"]


def _rules(pairs: list[tuple[str, "str | Callable[[re.Match[str]], str]"]]) -> list[_Rule]:
    return [(re.compile(pattern), replacement) for pattern, replacement in pairs]


_NECK_NAMES = {
    "lateral_conv0": "reduce_p5",
    "C3_p4": "top_down_p4",
    "reduce_conv1": "reduce_p4",
    "C3_p3": "top_down_p3",
    "bu_conv2": "downsample_p3",
    "C3_n3": "bottom_up_p4",
    "bu_conv1": "downsample_p4",
    "C3_n4": "bottom_up_p5",
}
_HEAD_NAMES = {
    "stems": "stems",
    "cls_convs": "class_towers",
    "reg_convs": "box_towers",
    "cls_preds": "class_preds",
    "reg_preds": "box_preds",
    "obj_preds": "objectness_preds",
}
_NECK_BACK = {zoo: lib for lib, zoo in _NECK_NAMES.items()}
_HEAD_BACK = {zoo: lib for lib, zoo in _HEAD_NAMES.items()}
_BN_FIELDS = "weight|bias|running_mean|running_var|num_batches_tracked"

# LibreYOLO -> zoo, applied in order to every key.
_TO_ZOO = _rules(
    [
        (r"^backbone\.backbone\.stem\.", "backbone.stem."),
        (r"^backbone\.backbone\.dark([2-5])\.", lambda m: f"backbone.stages.{int(m.group(1)) - 2}."),
        (rf"^backbone\.({'|'.join(_NECK_NAMES)})\.", lambda m: f"neck.{_NECK_NAMES[m.group(1)]}."),
        (rf"^head\.({'|'.join(_HEAD_NAMES)})\.", lambda m: f"head.{_HEAD_NAMES[m.group(1)]}."),
        (r"\.m\.(\d+)\.conv1\.", r".blocks.\1.reduce."),  # bottleneck 1×1
        (r"\.m\.(\d+)\.conv2\.", r".blocks.\1.spatial."),  # bottleneck 3×3
        (r"^backbone\.stages\.3\.1\.conv1\.", "backbone.stages.3.1.reduce."),  # SPP
        (r"^backbone\.stages\.3\.1\.conv2\.", "backbone.stages.3.1.expand."),
        (r"\.conv1\.", ".main."),  # CSP block
        (r"\.conv2\.", ".bypass."),
        (r"\.conv3\.", ".merge."),
        (r"\.dconv\.", ".depthwise."),
        (r"\.pconv\.", ".pointwise."),
        (r"\.conv\.weight$", ".0.weight"),  # BaseConv -> ConvNormAct
        (rf"\.bn\.({_BN_FIELDS})$", r".1.\1"),
    ]
)

_PREDICTOR = re.compile(r"^head\.(class_preds|box_preds|objectness_preds)\.(\d+)\.(weight|bias)$")

# zoo -> LibreYOLO (predictor keys are handled first: they are plain convs, not ConvNormAct).
_TO_LIBREYOLO = _rules(
    [
        (r"\.0\.weight$", ".conv.weight"),
        (rf"\.1\.({_BN_FIELDS})$", r".bn.\1"),
        (r"\.depthwise\.", ".dconv."),
        (r"\.pointwise\.", ".pconv."),
        (r"\.blocks\.(\d+)\.reduce\.", r".m.\1.conv1."),
        (r"\.blocks\.(\d+)\.spatial\.", r".m.\1.conv2."),
        (r"^backbone\.stages\.3\.1\.reduce\.", "backbone.stages.3.1.conv1."),
        (r"^backbone\.stages\.3\.1\.expand\.", "backbone.stages.3.1.conv2."),
        (r"\.main\.", ".conv1."),
        (r"\.bypass\.", ".conv2."),
        (r"\.merge\.", ".conv3."),
        (r"^backbone\.stem\.", "backbone.backbone.stem."),
        (r"^backbone\.stages\.([0-3])\.", lambda m: f"backbone.backbone.dark{int(m.group(1)) + 2}."),
        (rf"^neck\.({'|'.join(_NECK_BACK)})\.", lambda m: f"backbone.{_NECK_BACK[m.group(1)]}."),
        (rf"^head\.({'|'.join(_HEAD_BACK)})\.", lambda m: f"head.{_HEAD_BACK[m.group(1)]}."),
    ]
)


def _apply(rules: list[_Rule], key: str) -> str:
    for pattern, replacement in rules:
        key = pattern.sub(replacement, key, count=1)
    return key


def _zoo_key_to_libreyolo(key: str) -> str:
    predictor = _PREDICTOR.match(key)
    if predictor:
        name, level, field = predictor.groups()
        return f"head.{_HEAD_BACK[name]}.{level}.{field}"
    return _apply(_TO_LIBREYOLO, key)


def _rename(
    state_dict: Mapping[str, object], rename: Callable[[str], str], expected_roots: tuple[str, ...], what: str
) -> dict:
    converted: dict = {}
    for key, value in state_dict.items():
        new_key = rename(key)
        if not new_key.startswith(expected_roots) or new_key in converted:
            raise ValueError(f"cannot convert {what} key {key!r} (got {new_key!r}); is this a YOLOX state dict?")
        converted[new_key] = value
    return converted


def to_zoo(state_dict: Mapping[str, object]) -> dict:
    """zoo keys of a LibreYOLO (or official YOLOX) state dict; tensors unchanged."""
    roots = ("backbone.stem.", "backbone.stages.", "neck.", "head.")
    return _rename(state_dict, lambda key: _apply(_TO_ZOO, key), roots, "LibreYOLO")


def to_libreyolo(size: str, state_dict: Mapping[str, object]) -> dict:
    """LibreYOLO (= official YOLOX) keys of a zoo YOLOX state dict, any size; tensors unchanged."""
    del size  # the mapping is the same for every size
    return _rename(state_dict, _zoo_key_to_libreyolo, ("backbone.backbone.", "backbone.", "head."), "zoo")


def convert(size: str, state_dict: Mapping[str, object], source: str, target: str = "zoo") -> dict | None:
    """The registry ``converter`` of yolox: ``state_dict`` from layout ``source`` to ``target``: ``libreyolo``/
    ``upstream`` -> ``zoo``, or ``zoo`` -> ``libreyolo``/``upstream`` (the same keys); None for another pair."""
    if source in SOURCES and target == "zoo":
        return to_zoo(state_dict)
    if source == "zoo" and target in SOURCES:
        return to_libreyolo(size, state_dict)
    return None

