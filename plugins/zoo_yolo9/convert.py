"""YOLOv9 weights in other layouts: LibreYOLO's, and the MIT-licensed upstream release's.

- ``libreyolo``: LibreYOLO 1.6's ``LibreYOLO9`` keys (``backbone.elan2.cv2.0.m.0.cv1.conv1.conv``,
  ``head.cv3.<level>``...), both ways. Its auxiliary PGI branch (``aux.*``, ``aux_head.*``) is
  training-only and dropped on import, as LibreYOLO itself does for inference. The renaming
  rules are the GELAN trunk's and DDetect head's (``zoo_core.nn.gelan_keys``, shared with
  ``yolo9_e2e``).
- ``upstream``: MultimediaTechLab/YOLO's numbered layout (MIT; ``yolo/config/model/v9-*.yaml``):
  a plain state dict whose keys start with the layer index (``4.conv2.0.bottleneck.0...``,
  ``22.heads.0.class_conv.2.weight``). Layers 0-22 are the inference model; later indices are
  the auxiliary branch and are dropped. Import only.

- ``upstream`` for ``yolo9_seg`` (``convert_segmenter``): WongKinYiu/yolov9's numbered layout of
  ``models/segment/gelan-c-seg.yaml`` (GPL-3.0; the state dict of its ``SegmentationModel``,
  ``model.<layer>.<module>...``), whose module names inside each layer are LibreYOLO's (both follow
  the official code): ``model.4.cv2.0.m.0.cv1.conv1.conv.weight``, and the ``Segment`` head at
  layer 22 with ``cv2``/``cv3`` (box and class towers), ``cv4`` (mask coefficients) and ``proto``
  (prototypes). Its fixed DFL projection (``dfl.conv.weight``) is dropped. Import only.

Both keep the class towers at the width the file has: a model fine-tuned to a few classes from
COCO keeps 80-wide towers, and the upstream release uses ``max(width, min(2 * classes, 128))``,
so the converter passes the width on as the ``class_channels`` builder option when it is not the
default zoo would build (``zoo_core.nn.gelan_keys.class_tower_option``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from zoo_core.building import ConvertedWeights
from zoo_core.key_renaming import KeyRenamer
from zoo_core.nn.gelan_keys import GELAN_LIBREYOLO_KEYS, class_tower_option

if TYPE_CHECKING:
    import torch

__all__ = ["UPSTREAM_KEYS", "SEGMENTER_UPSTREAM_KEYS", "convert", "convert_segmenter"]

# MultimediaTechLab's numbered layout -> LibreYOLO's names (towards zoo through GELAN_LIBREYOLO_KEYS).
_LAYER_NAMES = {
    0: "backbone.conv0", 1: "backbone.conv1", 2: "backbone.elan1", 3: "backbone.down2", 4: "backbone.elan2",
    5: "backbone.down3", 6: "backbone.elan3", 7: "backbone.down4", 8: "backbone.elan4", 9: "backbone.spp",
    12: "neck.elan_up1", 15: "neck.elan_up2", 16: "neck.down1", 18: "neck.elan_down1", 19: "neck.down2",
    21: "neck.elan_down2", 22: "head",
}
UPSTREAM_KEYS = KeyRenamer([
    (".bottleneck.{j}.conv1.", ".m.{j}.cv1."),  # the RepConv inside keeps its conv1/conv2
    (".bottleneck.{j}.conv2.", ".m.{j}.cv2."),
    ("^{i}.conv.conv.", "^{i}.cv.conv."),  # AConv (a plain Conv layer is "<i>.conv.weight")
    ("^{i}.conv.bn.", "^{i}.cv.bn."),
    *[(f"^{{i}}.conv{part}.", f"^{{i}}.cv{part}.") for part in (1, 2, 3, 4, 5)],  # ELAN, RepNCSPELAN, ADown, SPPELAN
    *[(f"^{{i}}.cv{branch}.0.conv{part}.", f"^{{i}}.cv{branch}.0.cv{part}.") for branch in (2, 3) for part in (1, 2, 3)],
    ("^22.heads.{n}.anchor_conv.", "^22.cv2.{n}."),
    ("^22.heads.{n}.class_conv.", "^22.cv3.{n}."),
    *[(f"^{index}.", f"^{name}.") for index, name in _LAYER_NAMES.items()],
])
_INFERENCE_LAYERS = set(_LAYER_NAMES)


def _from_upstream(state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    kept = {}
    for key, tensor in state_dict.items():
        key = key.removeprefix("model.model.")  # Lightning checkpoints of the upstream trainer
        index = key.split(".", 1)[0]
        if not index.isdigit() or int(index) not in _INFERENCE_LAYERS or ".anc2vec." in key:
            continue  # the auxiliary branch, and the fixed DFL projection zoo computes without a tensor
        kept[key] = tensor
    return UPSTREAM_KEYS.to_zoo(kept)


def convert(size: str, state_dict: Mapping[str, "torch.Tensor"], source: str, target: str) -> ConvertedWeights | None:
    """The registry ``converter`` of yolo9 (see the module docstring); None for other layouts."""
    del size  # one key layout serves every size
    if target == "zoo" and source == "libreyolo":
        inference = {key: value for key, value in state_dict.items() if not key.startswith(("aux.", "aux_head."))}
        converted = GELAN_LIBREYOLO_KEYS.to_zoo(inference)
    elif target == "zoo" and source == "upstream":
        if not any(key.split(".", 1)[0].isdigit() and ".heads." in key for key in state_dict):
            return None
        converted = GELAN_LIBREYOLO_KEYS.to_zoo(_from_upstream(state_dict))
    elif source == "zoo" and target == "libreyolo":
        return ConvertedWeights(GELAN_LIBREYOLO_KEYS.from_zoo(state_dict))
    else:
        return None
    return ConvertedWeights(converted, options=class_tower_option(converted))


# WongKinYiu's gelan-c-seg: "model.<layer>." -> LibreYOLO's layer names (the same indices as the
# detector's yaml), and the Segment head's own modules -> zoo's (towards zoo through GELAN_LIBREYOLO_KEYS).
SEGMENTER_UPSTREAM_KEYS = KeyRenamer([
    ("^model.22.cv4.{n}.", "^mask_coefficient_branches.branches.{n}."),
    ("^model.22.proto.", "^prototypes."),
    *[(f"^model.{index}.", f"^{name}.") for index, name in _LAYER_NAMES.items()],
])
_SEGMENT_HEAD_MARK = "model.22.proto."


def convert_segmenter(
    size: str, state_dict: Mapping[str, "torch.Tensor"], source: str, target: str
) -> ConvertedWeights | None:
    """The registry ``converter`` of yolo9_seg (see the module docstring); None for other layouts."""
    del size  # one key layout serves every size
    if target != "zoo" or source != "upstream":
        return None
    if not any(key.startswith(_SEGMENT_HEAD_MARK) for key in state_dict):
        return None
    kept = {
        key: tensor for key, tensor in state_dict.items()
        if key.split(".", 2)[1:2] and key.split(".", 2)[1].isdigit() and int(key.split(".", 2)[1]) in _INFERENCE_LAYERS
        and not key.startswith("model.22.dfl.")
    }
    converted = GELAN_LIBREYOLO_KEYS.to_zoo(SEGMENTER_UPSTREAM_KEYS.to_zoo(kept))
    return ConvertedWeights(converted, options=class_tower_option(converted))
