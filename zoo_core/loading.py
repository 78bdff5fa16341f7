"""From a weights file to a model description and tensors in the family's own keys.

``load_weights_file(path, manager)`` recognises the file (``zoo_core.weight_formats``), then:

- zoo files: the metadata says everything; the tensors are already in zoo's keys;
- LibreYOLO checkpoints: the metadata names family, size, classes and input size; the family's
  ``convert_weights`` hook maps ``"libreyolo"`` keys to zoo's (no answer: the keys are zoo's, as
  for the timm-based classifiers);
- state dicts without metadata: the file name names the model (``LibreYOLO9s.pt``,
  ``resnet50.pth``); the tensors are used as they are when their names are the family's own,
  else each foreign layout the family's converter knows is tried (``upstream``, ``libreyolo``,
  ``timm``, ``torchvision``); the class count is read from the class-dependent tensors.

Shapes are compared against models built on the meta device, so nothing is allocated until the
facade builds the real model and loads the tensors strictly.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo_core.building import ConvertedWeights
from zoo_core.errors import ModelNameError, WeightsMismatchError
from zoo_core.naming import canonical_name, resolve_model_name
from zoo_core.weight_formats import RecognisedWeights, recognise

if TYPE_CHECKING:
    from zoo_core.registry import ImageSize
    import torch

    from zoo_core.plugin_manager import ZooPluginManager

__all__ = ["LoadedWeights", "load_weights_file", "zoo_family_of_libreyolo", "FOREIGN_LAYOUTS", "mismatch_report", "class_count_of"]

# The layouts tried, in order, for a state dict whose names are not the family's own.
FOREIGN_LAYOUTS = ("upstream", "libreyolo", "timm", "torchvision")


@dataclass
class LoadedWeights:
    """What a weights file holds, ready for the facade to build and load."""

    family: str
    size: str
    num_classes: int
    state_dict: dict[str, "torch.Tensor"]
    description: str  # e.g. "a LibreYOLO 1.0 checkpoint of yolo9-t"
    layout: str = "zoo"  # the layout the tensors came in
    names: dict[int, str] = field(default_factory=dict)
    input_size: "ImageSize | None" = None
    options: dict[str, Any] = field(default_factory=dict)
    zoo_version: str = ""
    data: str = ""  # the dataset it was trained on, when the file records it
    input_pipeline: dict[str, Any] = field(default_factory=dict)  # input-pipeline fields the file records


def _meta_model_shapes(manager: "ZooPluginManager", family: str, size: str, num_classes: int,
                       options: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    import torch

    with torch.device("meta"):
        model = manager.build_model(family, size, num_classes, dict(options))
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def class_count_of(manager: "ZooPluginManager", family: str, size: str, state_dict: Mapping[str, "torch.Tensor"],
                   options: Mapping[str, Any]) -> int | None:
    """The class count ``state_dict``'s class-dependent tensors were built for, or None if none depend on it.

    Two meta-device builds (at 2 and 3 classes) show which tensor dimensions grow with
    the class count and by how much per class; the file's size of that dimension then solves for
    its count (a YOLOv7 head has ``anchors * (classes + 5)`` outputs, a classifier ``classes``).
    """
    # Small counts: some heads widen with the class count only above a floor (YOLOv9's class tower
    # is max(first neck width, classes)), which would otherwise vote too.
    base = 2
    first = _meta_model_shapes(manager, family, size, base, options)
    second = _meta_model_shapes(manager, family, size, base + 1, options)
    votes: dict[int, int] = {}
    for key, shape in first.items():
        other = second.get(key)
        if other is None or other == shape or key not in state_dict or len(state_dict[key].shape) != len(shape):
            continue
        for dimension, (at_base, at_next) in enumerate(zip(shape, other)):
            per_class = at_next - at_base
            if per_class <= 0:
                continue
            count, remainder = divmod(state_dict[key].shape[dimension] - (at_base - per_class * base), per_class)
            if remainder == 0 and count >= 1:
                votes[count] = votes.get(count, 0) + 1
    return max(votes, key=votes.get) if votes else None


def mismatch_report(expected: Mapping[str, tuple[int, ...]], state_dict: Mapping[str, "torch.Tensor"], limit: int = 3) -> str:
    """The first keys that do not match: missing, unexpected, or of another shape ('' when all match)."""
    missing = [key for key in expected if key not in state_dict]
    unexpected = [key for key in state_dict if key not in expected]
    reshaped = [f"{key} (file {tuple(state_dict[key].shape)}, model {expected[key]})"
                for key in expected if key in state_dict and tuple(state_dict[key].shape) != expected[key]]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing, first {', '.join(missing[:limit])}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected, first {', '.join(unexpected[:limit])}")
    if reshaped:
        parts.append(f"{len(reshaped)} of another shape, first {', '.join(reshaped[:limit])}")
    return "; ".join(parts)


def _converted(manager: "ZooPluginManager", family: str, size: str, state_dict: Mapping[str, "torch.Tensor"],
               layout: str) -> ConvertedWeights | None:
    return manager.convert_weights(family, size, state_dict, layout, "zoo")


def zoo_family_of_libreyolo(model_family: str, task: str | None, manager: "ZooPluginManager") -> str:
    """zoo's family of a LibreYOLO checkpoint's ``model_family`` and (zoo-named) ``task``.

    LibreYOLO names one family for several tasks (``rtmdet`` with task ``segment`` is zoo's
    ``rtmdet_ins``): the family that declares that ``libreyolo_family`` (or has that name) and
    solves that task; else the name as it is.
    """
    matches = [name for name, declaration in manager.families.items()
               if (declaration.libreyolo_family or name) == model_family and declaration.task == task]
    return matches[0] if matches else model_family


def _from_libreyolo(found: RecognisedWeights, manager: "ZooPluginManager") -> LoadedWeights:
    assert found.family is not None and found.size is not None and found.num_classes is not None
    found = replace(found, family=zoo_family_of_libreyolo(found.family, found.task, manager))
    if found.family not in manager.families:
        raise WeightsMismatchError(
            f"{found.path} is {found.describe()}, but zoo has no family {found.family!r}; zoo's families are "
            f"{', '.join(manager.families)}. Install the plugin that provides it (`zoo plugins` lists what is loaded)"
        )
    declaration = manager.family(found.family)
    if found.size not in declaration.sizes:
        raise WeightsMismatchError(
            f"{found.path} is {found.describe()}, but zoo's {found.family} has no size {found.size!r}; "
            f"its sizes are {', '.join(declaration.sizes)}"
        )
    converted = _converted(manager, found.family, found.size, found.state_dict, "libreyolo") or ConvertedWeights(found.state_dict)
    has_classes = manager.task(declaration.task).classes
    return LoadedWeights(
        family=found.family, size=converted.size or found.size, num_classes=found.num_classes if has_classes else 0,
        state_dict=dict(converted.state_dict), description=found.describe(), layout="libreyolo",
        names=dict(found.names) if has_classes else {}, input_size=found.input_size,
        options=dict(converted.options), input_pipeline=dict(found.input_pipeline),
    )


def _from_state_dict(found: RecognisedWeights, manager: "ZooPluginManager", architecture: str | None) -> LoadedWeights:
    try:
        family, size = resolve_model_name(architecture or found.path.name, manager.families)
    except ModelNameError:
        if architecture is not None:
            raise
        raise WeightsMismatchError(
            f"{found.path} is {found.describe()}, and its file name names no model zoo knows; say which model it "
            "holds with LibreYOLO(path, architecture='nafnet-s'), or rename it after its model (e.g. LibreYOLO9s.pt, "
            "resnet50.pth)"
        ) from None
    declaration = manager.family(family)
    candidates = [("zoo", ConvertedWeights(found.state_dict))]
    for layout in FOREIGN_LAYOUTS:
        converted = _converted(manager, family, size, found.state_dict, layout)
        if converted is not None:
            candidates.append((layout, converted))
    reports = []
    for layout, converted in candidates:
        chosen_size = converted.size or size
        options = dict(converted.options)
        if manager.task(declaration.task).classes:
            num_classes: int | None = class_count_of(manager, family, chosen_size, converted.state_dict, options)
        else:
            num_classes = 0
        inferred = num_classes is not None
        if num_classes is None:  # still show how the tensors differ, against the published class count
            num_classes = declaration.published_num_classes or 1
        expected = _meta_model_shapes(manager, family, chosen_size, num_classes, options)
        report = mismatch_report(expected, converted.state_dict) or ("" if inferred else "no class-dependent tensor")
        if not report:
            return LoadedWeights(
                family=family, size=chosen_size, num_classes=num_classes, state_dict=dict(converted.state_dict),
                description=f"{found.describe()} in the {layout} layout of {canonical_name(family, chosen_size)}",
                layout=layout, options=options,
            )
        reports.append(f"as {layout} keys: {report}")
    raise WeightsMismatchError(
        f"{found.path} is {found.describe()} named for {canonical_name(family, size)}, but its tensors fit no "
        f"layout zoo knows for that model ({' | '.join(reports)}). Check that the file is a "
        f"{canonical_name(family, size)} checkpoint, or convert it with the tool that wrote it"
    )


def load_weights_file(path: str | Path, manager: "ZooPluginManager", *, architecture: str | None = None) -> LoadedWeights:
    """The model and tensors in the file at ``path`` (see the module docstring).

    ``architecture`` names the model of a file without metadata when its file name does not.
    """
    found = recognise(path)
    if found.format == "zoo":
        meta = found.meta
        if meta is None:  # a zoo-format dict without metadata cannot happen; a safetensors without it is a state dict
            raise WeightsMismatchError(f"{found.path} carries no zoo metadata")
        return LoadedWeights(
            family=meta.family, size=meta.size, num_classes=meta.num_classes, state_dict=found.state_dict,
            description=found.describe(), names=dict(meta.names), input_size=meta.input_size or None,
            options=dict(meta.options), zoo_version=meta.zoo_version, data=meta.data,
            input_pipeline=dict(meta.input_pipeline),
        )
    if found.format == "libreyolo":
        return _from_libreyolo(found, manager)
    return _from_state_dict(found, manager, architecture)
