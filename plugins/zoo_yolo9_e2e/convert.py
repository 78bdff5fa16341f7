"""YOLOv9-E2E weights in LibreYOLO 1.6's layout, both ways (pure key/tensor maps).

LibreYOLO's ``LibreYOLO9E2E`` is its ``LibreYOLO9`` with a second pair of head towers,
``head.one2one_cv2.<level>`` / ``head.one2one_cv3.<level>`` (zoo: ``one_to_one_head.box_branches``
/ ``class_branches``). Everything else is renamed by the GELAN trunk's and DDetect head's rules
that ``yolo9`` uses too (``zoo_core.nn.gelan_keys.GELAN_LIBREYOLO_KEYS``), extended here by the
one-to-one towers. LibreYOLO's legacy ``detect.`` head prefix is read as ``head.``; the DFL's
fixed bin weights that some older files carry (``head.dfl.conv.weight``) are dropped (zoo
computes the expectation with an arange).

Class towers keep the width the file has (a model fine-tuned from COCO keeps 80-wide towers):
when it is not the width zoo builds by default, the converter passes it on as the
``class_channels`` builder option, as ``yolo9``'s converter does; both heads must agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from zoo_core.building import ConvertedWeights
from zoo_core.key_renaming import KeyRenamer
from zoo_core.nn.gelan_keys import GELAN_LIBREYOLO_KEYS, class_tower_option

if TYPE_CHECKING:
    import torch

__all__ = ["LIBREYOLO_KEYS", "from_libreyolo", "to_libreyolo", "convert"]

# GELAN's rules, then the one-to-one towers (after the conv/bn leaves were renamed).
LIBREYOLO_KEYS = KeyRenamer([
    *GELAN_LIBREYOLO_KEYS.pairs,
    ("^head.one2one_cv2.", "^one_to_one_head.box_branches."),
    ("^head.one2one_cv3.", "^one_to_one_head.class_branches."),
])


def _class_channels_option(converted: Mapping[str, "torch.Tensor"]) -> dict[str, int]:
    many = converted.get("head.class_branches.0.0.0.weight")
    one = converted.get("one_to_one_head.class_branches.0.0.0.weight")
    if many is not None and one is not None and many.shape[0] != one.shape[0]:
        raise ValueError(
            f"the one-to-many and one-to-one class towers differ in width ({many.shape[0]} vs {one.shape[0]}); "
            "zoo's yolo9_e2e builds both heads alike"
        )
    return class_tower_option(converted)


def from_libreyolo(state_dict: Mapping[str, "torch.Tensor"]) -> ConvertedWeights:
    """A LibreYOLO 1.6 ``yolo9_e2e`` ``model`` state dict → zoo's keys (and the builder options it needs)."""
    kept = {}
    for key, tensor in state_dict.items():
        key = "head." + key.removeprefix("detect.") if key.startswith("detect.") else key
        if key.startswith("head.dfl."):
            continue
        kept[key] = tensor
    converted = LIBREYOLO_KEYS.to_zoo(kept)
    return ConvertedWeights(converted, options=_class_channels_option(converted))


def to_libreyolo(size: str, state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """zoo's ``yolo9_e2e`` state dict → LibreYOLO 1.6's ``model`` state dict (``size`` is not needed)."""
    del size
    return LIBREYOLO_KEYS.from_zoo(state_dict)


def convert(size: str, state_dict: Mapping[str, "torch.Tensor"], source: str, target: str = "zoo") -> ConvertedWeights | dict | None:
    """The registry ``converter`` of yolo9_e2e; None for other layouts (there is no official release)."""
    if target == "zoo" and source == "libreyolo":
        return from_libreyolo(state_dict)
    if source == "zoo" and target == "libreyolo":
        return to_libreyolo(size, state_dict)
    return None
