"""YOLOv9 weights in other layouts: LibreYOLO's, and the MIT-licensed upstream release's.

- ``libreyolo``: LibreYOLO 1.6's ``LibreYOLO9`` keys (``backbone.elan2.cv2.0.m.0.cv1.conv1.conv``,
  ``head.cv3.<level>``...), both ways. Its auxiliary PGI branch (``aux.*``, ``aux_head.*``) is
  training-only and dropped on import, as LibreYOLO itself does for inference.
- ``upstream``: MultimediaTechLab/YOLO's numbered layout (MIT; ``yolo/config/model/v9-*.yaml``):
  a plain state dict whose keys start with the layer index (``4.conv2.0.bottleneck.0...``,
  ``22.heads.0.class_conv.2.weight``). Layers 0-22 are the inference model; later indices are
  the auxiliary branch and are dropped. Import only.

Both keep the class towers at the width the file has: a model fine-tuned to a few classes from
COCO keeps 80-wide towers, and the upstream release uses ``max(width, min(2 * classes, 128))``,
so the converter passes the width on as the ``class_channels`` builder option when it is not the
default zoo would build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from zoo_core.building import ConvertedWeights
from zoo_core.key_renaming import KeyRenamer

if TYPE_CHECKING:
    import torch

__all__ = ["LIBREYOLO_KEYS", "UPSTREAM_KEYS", "class_tower_option", "convert"]

_LEAVES = [
    (".conv.weight$", ".0.weight$"),
    *[(f".bn.{name}$", f".1.{name}$") for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")],
]
_ELAN_PARTS = [("cv1", "split"), ("cv2", "first_branch"), ("cv3", "second_branch"), ("cv4", "aggregate")]

# LibreYOLO <-> zoo, applied in this order towards zoo (and in reverse towards LibreYOLO).
LIBREYOLO_KEYS = KeyRenamer([
    *_LEAVES,
    (".down{i}.cv.", ".down{i}.conv."),  # AConv
    (".down{i}.cv1.", ".down{i}.conv_path."),  # ADown
    (".down{i}.cv2.", ".down{i}.pool_path."),
    ("^backbone.spp.cv1.", "^backbone.spp.reduce."),  # SPPELAN
    ("^backbone.spp.cv5.", "^backbone.spp.aggregate."),
    (".m.{j}.cv1.conv1.", ".bottlenecks.{j}.rep_conv.dense."),  # RepNBottleneck with its RepConvN
    (".m.{j}.cv1.conv2.", ".bottlenecks.{j}.rep_conv.pointwise."),
    (".m.{j}.cv2.", ".bottlenecks.{j}.conv."),
    (".cv{b}.0.cv1.", ".cv{b}.0.main."),  # RepNCSP inside a RepNCSPELAN branch
    (".cv{b}.0.cv2.", ".cv{b}.0.bypass."),
    (".cv{b}.0.cv3.", ".cv{b}.0.merge."),
    *[(f".{block}.{libre}.", f".{block}.{zoo}.") for block in ("elan{n}", "elan_up{n}", "elan_down{n}") for libre, zoo in _ELAN_PARTS],
    ("^backbone.conv0.", "^backbone.stem.0."),
    ("^backbone.conv1.", "^backbone.stem.1."),
    ("^backbone.elan1.", "^backbone.p2_block."),
    *[(f"^backbone.down{index + 2}.", f"^backbone.downsamples.{index}.") for index in range(3)],
    *[(f"^backbone.elan{index + 2}.", f"^backbone.blocks.{index}.") for index in range(3)],
    ("^backbone.spp.", "^neck.top_down.spp."),
    ("^neck.elan_up1.", "^neck.top_down.merge_p4."),
    ("^neck.elan_up2.", "^neck.top_down.merge_p3."),
    ("^neck.down1.", "^neck.down_p4."),
    ("^neck.elan_down1.", "^neck.merge_p4."),
    ("^neck.down2.", "^neck.down_p5."),
    ("^neck.elan_down2.", "^neck.merge_p5."),
    ("^head.cv2.", "^head.box_branches."),
    ("^head.cv3.", "^head.class_branches."),
])

# MultimediaTechLab's numbered layout -> LibreYOLO's names (towards zoo through LIBREYOLO_KEYS).
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


def class_tower_option(state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, int]:
    """``{"class_channels": width}`` when the class towers of a zoo-keyed state dict are not the
    width zoo builds by default (``max(first neck width, min(classes, 100))``), else ``{}``.

    Public: every family with YOLOv9's DDetect head (``yolo9_e2e`` too) passes it on as a builder option.
    """
    tower = state_dict.get("head.class_branches.0.0.0.weight")
    classifier = state_dict.get("head.class_branches.0.2.weight")
    if tower is None or classifier is None:
        return {}
    width, first_level_channels, classes = int(tower.shape[0]), int(tower.shape[1]), int(classifier.shape[0])
    return {} if width == max(first_level_channels, min(classes, 100)) else {"class_channels": width}


def _from_upstream(state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    kept = {}
    for key, tensor in state_dict.items():
        key = key.removeprefix("model.model.")  # Lightning checkpoints of the upstream trainer
        index = key.split(".", 1)[0]
        if not index.isdigit() or int(index) not in _INFERENCE_LAYERS or ".anc2vec." in key:
            continue  # the auxiliary branch, and the fixed DFL projection zoo computes without a tensor
        kept[key] = tensor
    return UPSTREAM_KEYS.to_zoo(kept)


def convert(state_dict: Mapping[str, "torch.Tensor"], source: str, target: str) -> ConvertedWeights | None:
    """The ``convert_weights`` answer of yolo9 (see the module docstring); None for other layouts."""
    if target == "zoo" and source == "libreyolo":
        inference = {key: value for key, value in state_dict.items() if not key.startswith(("aux.", "aux_head."))}
        converted = LIBREYOLO_KEYS.to_zoo(inference)
    elif target == "zoo" and source == "upstream":
        if not any(key.split(".", 1)[0].isdigit() and ".heads." in key for key in state_dict):
            return None
        converted = LIBREYOLO_KEYS.to_zoo(_from_upstream(state_dict))
    elif source == "zoo" and target == "libreyolo":
        return ConvertedWeights(LIBREYOLO_KEYS.from_zoo(state_dict))
    else:
        return None
    return ConvertedWeights(converted, options=class_tower_option(converted))
