"""YOLOv7 checkpoint conversion: LibreYOLO 1.6.0 / official WongKinYiu/yolov7 keys <-> zoo keys.

Both foreign layouts number the layers of the official ``cfg/training/*.yaml`` graph (LibreYOLO's
``v7.yaml``, from MultimediaTechLab/YOLO, keeps the official numbering): ``layers.{i}.…``
(LibreYOLO) or ``model.{i}.…`` (official). Every layer index, concatenations, pools and upsamples
included, is walked here in the yaml's order and paired with zoo's module path, so the mapping is
a table of keys, built per size from the graph's shape (no model is built, tensors are unchanged):

- a conv layer: ``{i}.conv.weight``, ``{i}.bn.*`` <-> ``<path>.0.weight``, ``<path>.1.*``;
- RepConv (YOLOv7 head): LibreYOLO ``conv1`` / ``conv2``, official ``rbr_dense`` / ``rbr_1x1``
  <-> ``dense`` / ``pointwise`` of ``zoo_core.nn.gelan.RepConvN``;
- SPPCSPC (one layer in YOLOv7/X): LibreYOLO ``pre_conv.0-2``, ``short_conv``, ``post_conv.0-1``,
  ``merge_conv``, official ``cv1, cv3, cv4``, ``cv2``, ``cv5, cv6``, ``cv7``;
- IDetect: LibreYOLO ``heads.{l}.head_conv`` / ``implicit_a`` / ``implicit_m``, official
  ``m.{l}`` / ``ia.{l}`` / ``im.{l}`` <-> ``head.levels.{l}.conv`` / ``implicit_add`` /
  ``implicit_mul``. The official head's ``anchors`` and ``anchor_grid`` buffers are dropped
  (zoo's anchors come from the registry config), and the model is asked for with the builder
  option ``official_graph=True``.

LibreYOLO 1.6.0 builds only YOLOv7 (``b``); the same numbering is defined for tiny and X.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Iterator, Mapping

if TYPE_CHECKING:
    from zoo_core.building import ConvertedWeights

__all__ = ["convert", "to_zoo", "to_libreyolo", "key_table", "SOURCES"]

SOURCES = ("libreyolo", "upstream")
_PREFIX = {"libreyolo": "layers", "upstream": "model"}
_BN_FIELDS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
_UPSTREAM_SKIPPED = ("anchors", "anchor_grid")


@dataclass(frozen=True)
class _Graph:
    stem_convs: int
    backbone_downsample: str  # mp_conv | maxpool
    backbone_convs: int
    spp: str  # csp | csp_tiny
    neck_convs: int
    neck_downsample: str  # mp_conv | conv
    head_conv: str  # repconv | conv


# The shape of each size's graph (the rest of the config, widths, does not change key names).
_GRAPHS = {
    "tiny": _Graph(2, "maxpool", 2, "csp_tiny", 2, "conv", "conv"),
    "b": _Graph(4, "mp_conv", 4, "csp", 4, "mp_conv", "repconv"),
    "x": _Graph(4, "mp_conv", 6, "csp", 6, "mp_conv", "conv"),
}

_SPP_NAMES = {  # zoo sub-module: (LibreYOLO name, official name)
    "pooled_branch.0": ("pre_conv.0", "cv1"),
    "pooled_branch.1": ("pre_conv.1", "cv3"),
    "pooled_branch.2": ("pre_conv.2", "cv4"),
    "shortcut": ("short_conv", "cv2"),
    "post.0": ("post_conv.0", "cv5"),
    "post.1": ("post_conv.1", "cv6"),
    "merge": ("merge_conv", "cv7"),
}


def _walk(graph: _Graph) -> Iterator[tuple[int, str, str]]:
    """``(layer index, kind, zoo path)`` of every parameterised layer, in the official yaml's order."""
    index = 0

    def take(kind: str, path: str) -> tuple[int, str, str]:
        nonlocal index
        index += 1
        return index - 1, kind, path

    def skip(count: int = 1) -> None:
        nonlocal index
        index += count

    def elan(path: str, convs: int) -> Iterator[tuple[int, str, str]]:
        yield take("conv", f"{path}.part_a")
        yield take("conv", f"{path}.part_b")
        for k in range(convs):
            yield take("conv", f"{path}.chain.{k}")
        skip()  # Concat
        yield take("conv", f"{path}.merge")

    def downsample(kind: str, path: str) -> Iterator[tuple[int, str, str]]:
        if kind == "mp_conv":
            skip()  # MP
            yield take("conv", f"{path}.pool_branch.1")
            yield take("conv", f"{path}.conv_branch.0")
            yield take("conv", f"{path}.conv_branch.1")
            skip()  # Concat (with the lateral input too, in the neck)
        elif kind == "maxpool":
            skip()
        else:  # a 3×3 stride-2 conv, then the Concat with the lateral input
            yield take("conv", path)
            skip()

    for j in range(graph.stem_convs):
        yield take("conv", f"backbone.stem.{j}")
    for stage in range(4):
        if stage > 0:
            yield from downsample(graph.backbone_downsample, f"backbone.stages.{stage}.downsample")
        yield from elan(f"backbone.stages.{stage}.block", graph.backbone_convs)
    if graph.spp == "csp":
        yield take("spp", "neck.spp")
    else:  # yolov7-tiny's SPP is spelled out as layers
        yield take("conv", "neck.spp.shortcut")
        yield take("conv", "neck.spp.pooled_branch.0")
        skip(4)  # three SP pools and a Concat
        yield take("conv", "neck.spp.post.0")
        skip()  # Concat
        yield take("conv", "neck.spp.merge")
    for lateral, route, merge in (("lateral_p5", "route_p4", "merge_p4"), ("lateral_p4", "route_p3", "merge_p3")):
        yield take("conv", f"neck.{lateral}")
        skip()  # Upsample
        yield take("conv", f"neck.{route}")
        skip()  # Concat
        yield from elan(f"neck.{merge}", graph.neck_convs)
    for down, merge in (("downsample_p3", "bottom_up_p4"), ("downsample_p4", "bottom_up_p5")):
        yield from downsample(graph.neck_downsample, f"neck.{down}")
        yield from elan(f"neck.{merge}", graph.neck_convs)
    for level in range(3):
        yield take(graph.head_conv, f"head_convs.{level}")
    yield take("detect", "head")


def _conv_keys(foreign: str, zoo: str) -> Iterator[tuple[str, str]]:
    yield f"{foreign}.conv.weight", f"{zoo}.0.weight"
    for field in _BN_FIELDS:
        yield f"{foreign}.bn.{field}", f"{zoo}.1.{field}"


def _layer_keys(source: str, index: int, kind: str, path: str) -> Iterator[tuple[str, str]]:
    layer = f"{_PREFIX[source]}.{index}"
    if kind == "conv":
        yield from _conv_keys(layer, path)
    elif kind == "repconv":
        dense, pointwise = ("conv1", "conv2") if source == "libreyolo" else ("rbr_dense", "rbr_1x1")
        for foreign, zoo in ((dense, "dense"), (pointwise, "pointwise")):
            if source == "libreyolo":
                yield from _conv_keys(f"{layer}.{foreign}", f"{path}.{zoo}")
            else:  # official RepConv branches are Sequential(conv, bn)
                yield f"{layer}.{foreign}.0.weight", f"{path}.{zoo}.0.weight"
                for field in _BN_FIELDS:
                    yield f"{layer}.{foreign}.1.{field}", f"{path}.{zoo}.1.{field}"
    elif kind == "spp":
        for zoo, names in _SPP_NAMES.items():
            foreign = names[0] if source == "libreyolo" else names[1]
            yield from _conv_keys(f"{layer}.{foreign}", f"{path}.{zoo}")
    else:  # detect
        for level in range(3):
            if source == "libreyolo":
                head = f"heads.{level}"
                conv, add, mul = f"{head}.head_conv", f"{head}.implicit_a.implicit", f"{head}.implicit_m.implicit"
            else:
                conv, add, mul = f"m.{level}", f"ia.{level}.implicit", f"im.{level}.implicit"
            yield f"{layer}.{conv}.weight", f"{path}.levels.{level}.conv.weight"
            yield f"{layer}.{conv}.bias", f"{path}.levels.{level}.conv.bias"
            yield f"{layer}.{add}", f"{path}.levels.{level}.implicit_add"
            yield f"{layer}.{mul}", f"{path}.levels.{level}.implicit_mul"


@lru_cache(maxsize=None)
def key_table(size: str, source: str = "libreyolo") -> dict[str, str]:
    """``{foreign key: zoo key}`` of every tensor of a YOLOv7 ``size`` (tiny, b, x) in ``source`` layout."""
    if size not in _GRAPHS:
        raise ValueError(f"unknown yolo7 size {size!r}; choose one of {', '.join(_GRAPHS)}")
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    return {foreign: zoo for entry in _walk(_GRAPHS[size]) for foreign, zoo in _layer_keys(source, *entry)}


def to_zoo(size: str, state_dict: Mapping[str, object], source: str = "libreyolo") -> dict:
    """zoo keys of a LibreYOLO (``layers.*``) or official (``model.*``) YOLOv7 state dict."""
    table = key_table(size, source)
    converted: dict = {}
    for key, value in state_dict.items():
        if key not in table:
            if source == "upstream" and key.rsplit(".", 1)[-1] in _UPSTREAM_SKIPPED:
                continue
            raise ValueError(f"{key!r} is not a key of a {source} YOLOv7-{size} state dict")
        converted[table[key]] = value
    return converted


def to_libreyolo(size: str, state_dict: Mapping[str, object]) -> dict:
    """LibreYOLO (``layers.*``) keys of a zoo YOLOv7 state dict (unfused)."""
    inverse = {zoo: foreign for foreign, zoo in key_table(size, "libreyolo").items()}
    unknown = [key for key in state_dict if key not in inverse]
    if unknown:
        raise ValueError(
            f"{unknown[:3]} are not keys of an unfused zoo YOLOv7-{size} model (fused models cannot be exported)"
        )
    return {inverse[key]: value for key, value in state_dict.items()}


def convert(
    size: str, state_dict: Mapping[str, object], source: str, target: str = "zoo"
) -> "dict | ConvertedWeights | None":
    """The registry ``converter`` of yolo7: ``state_dict`` from layout ``source`` to ``target``:
    ``libreyolo``/``upstream`` -> ``zoo``, or ``zoo`` -> ``libreyolo``; None for a pair this module
    does not handle (no export to the official layout: its checkpoints are pickled model objects).

    Official weights were trained on the official graph, so ``upstream`` files come back as
    ``ConvertedWeights`` with the builder option ``official_graph=True`` (it matters for ``b``,
    whose registry graph follows LibreYOLO; see ``zoo_yolo7.model``).
    """
    if source == "upstream" and target == "zoo":
        from zoo_core.building import ConvertedWeights

        return ConvertedWeights(to_zoo(size, state_dict, source), options={"official_graph": True})
    if source == "libreyolo" and target == "zoo":
        return to_zoo(size, state_dict, source)
    if source == "zoo" and target == "libreyolo":
        return to_libreyolo(size, state_dict)
    return None

