"""LibreYOLO's checkpoint names of the GELAN trunk and the DDetect head (``zoo_core.nn.gelan``).

The YOLOv9 families (``yolo9``, ``yolo9_e2e``) build one trunk and one DDetect head, and
LibreYOLO 1.6 names them alike in both (``backbone.elan2.cv2.0.m.0.cv1.conv1.conv``,
``head.cv3.<level>``...). ``GELAN_LIBREYOLO_KEYS`` renames them both ways; a family extends it
by its own modules (``yolo9_e2e``'s one-to-one towers). ``class_tower_option`` is the builder
option that keeps a file's class-tower width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from zoo_core.key_renaming import KeyRenamer

if TYPE_CHECKING:
    import torch

__all__ = ["GELAN_LIBREYOLO_KEYS", "class_tower_option"]

_LEAVES = [
    (".conv.weight$", ".0.weight$"),
    *[(f".bn.{name}$", f".1.{name}$") for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")],
]
_ELAN_PARTS = [("cv1", "split"), ("cv2", "first_branch"), ("cv3", "second_branch"), ("cv4", "aggregate")]

# LibreYOLO <-> zoo, applied in this order towards zoo (and in reverse towards LibreYOLO).
GELAN_LIBREYOLO_KEYS = KeyRenamer([
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


def class_tower_option(state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, int]:
    """``{"class_channels": width}`` when the class towers of a zoo-keyed state dict are not the
    width zoo builds by default (``max(first neck width, min(classes, 100))``), else ``{}``.

    Every family with YOLOv9's DDetect head passes it on as a builder option, so a model
    fine-tuned to a few classes from COCO keeps its 80-wide towers.
    """
    tower = state_dict.get("head.class_branches.0.0.0.weight")
    classifier = state_dict.get("head.class_branches.0.2.weight")
    if tower is None or classifier is None:
        return {}
    width, first_level_channels, classes = int(tower.shape[0]), int(tower.shape[1]), int(classifier.shape[0])
    return {} if width == max(first_level_channels, min(classes, 100)) else {"class_channels": width}
