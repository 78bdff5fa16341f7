"""Recognising the weights files users hold, and writing LibreYOLO checkpoints.

``recognise(path)`` reads a file (``torch.load(weights_only=True)`` or safetensors, never
anything else) and says what it is:

- ``zoo``: zoo's safetensors (metadata in the header) or a zoo training checkpoint
  (``{"model": ..., "meta": ...}``);
- ``libreyolo``: a LibreYOLO checkpoint, a dict with ``model`` plus the metadata keys
  ``schema_version`` ("1.0"), ``libreyolo_version``, ``model_family``, ``size``, ``task``,
  ``nc``, ``names``, ``imgsz``;
- ``state_dict``: tensors without metadata, bare or in a common container (``state_dict``,
  ``model``, and BasicSR's ``params_ema`` / ``params``, the layout of NAFNet's official
  releases). The family comes from the file name; the layout (upstream, timm, torchvision...)
  is found by the family's ``convert_weights`` hook.

``libreyolo_checkpoint`` builds the dict LibreYOLO 1.6.0 loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping

from zoo_core.errors import CorruptWeightsError
from zoo_core.registry import builtin_tasks
from zoo_core.weights import DIGEST_KEY, ModelMeta, load_torch_file, read_safetensors, verify_digest

if TYPE_CHECKING:
    import torch

    from zoo_core.registry import ImageSize

__all__ = [
    "LIBREYOLO_SCHEMA_VERSION",
    "LIBREYOLO_METADATA_KEYS",
    "RecognisedWeights",
    "recognise",
    "libreyolo_checkpoint",
]

LIBREYOLO_SCHEMA_VERSION = "1.0"
LIBREYOLO_WRITER_VERSION = "1.6.0"  # the LibreYOLO release whose loader these files are tested against
LIBREYOLO_METADATA_KEYS = ("schema_version", "libreyolo_version", "model_family", "size", "task", "nc", "names", "imgsz")
# Tasks LibreYOLO names differently (zoo's name -> LibreYOLO's).
_CONTAINERS = ("state_dict", "params_ema", "params", "model", "ema")
Format = Literal["zoo", "libreyolo", "state_dict"]


@dataclass
class RecognisedWeights:
    """A weights file: its format, tensors, and what its metadata says (when it has any)."""

    path: Path
    format: Format
    state_dict: dict[str, "torch.Tensor"]
    meta: ModelMeta | None = None  # zoo files
    family: str | None = None  # LibreYOLO files: their metadata
    size: str | None = None
    task: str | None = None
    num_classes: int | None = None
    names: dict[int, str] = field(default_factory=dict)
    input_size: "ImageSize | None" = None
    input_pipeline: dict[str, Any] = field(default_factory=dict)  # LibreYOLO files: the letterbox placement they record
    container: str | None = None  # where a bare state dict was found ("params_ema"...)

    def describe(self) -> str:
        """``a LibreYOLO 1.0 checkpoint of yolo9-t``, as error messages say it."""
        if self.format == "zoo":
            return "a zoo weights file" + (f" of {self.meta.family}-{self.meta.size}" if self.meta else "")
        if self.format == "libreyolo":
            return f"a LibreYOLO {LIBREYOLO_SCHEMA_VERSION} checkpoint of {self.family}-{self.size}"
        where = f" (under {self.container!r})" if self.container else ""
        return f"a state dict without metadata{where}"


def _tensor_dict(value: Any) -> bool:
    import torch

    return isinstance(value, Mapping) and bool(value) and all(isinstance(item, torch.Tensor) for item in value.values())


def _checked_state_dict(path: Path, value: Any, where: str) -> dict[str, "torch.Tensor"]:
    if not _tensor_dict(value):
        raise CorruptWeightsError(
            f"{path}: {where} is not a state dict (a mapping of names to tensors); save weights with "
            "torch.save(model.state_dict(), path)"
        )
    return {str(key): tensor for key, tensor in value.items()}


def _libreyolo(path: Path, content: Mapping[str, Any]) -> RecognisedWeights:
    version = content.get("schema_version")
    if version != LIBREYOLO_SCHEMA_VERSION:
        raise CorruptWeightsError(
            f"{path} is a LibreYOLO checkpoint of schema {version!r}; zoo reads schema {LIBREYOLO_SCHEMA_VERSION!r} "
            "(LibreYOLO 1.x). Re-save it with LibreYOLO 1.6 (model.save(path))"
        )
    missing = [key for key in LIBREYOLO_METADATA_KEYS if key not in content]
    problems = [f"missing {key!r}" for key in missing]
    nc, size, names = content.get("nc"), content.get("size"), content.get("names")
    if "nc" not in missing and (not isinstance(nc, int) or isinstance(nc, bool) or nc < 1):
        problems.append(f"'nc' must be a positive integer, got {nc!r}")
    if "size" not in missing and not (isinstance(size, str) and size):
        problems.append(f"'size' must be a non-empty string, got {size!r}")
    if "names" not in missing and not isinstance(names, (Mapping, list, tuple)):
        problems.append(f"'names' must be a mapping or a list, got {type(names).__name__}")
    imgsz = content.get("imgsz")
    if "imgsz" not in missing and not (isinstance(imgsz, int) and not isinstance(imgsz, bool) and imgsz > 0):
        problems.append(f"'imgsz' must be a positive integer, got {imgsz!r}")
    if problems:
        raise CorruptWeightsError(f"{path} looks like a LibreYOLO checkpoint but its metadata is invalid: {'; '.join(problems)}")
    if isinstance(names, Mapping):
        name_map = {int(key): str(value) for key, value in names.items()}
    else:
        name_map = {index: str(value) for index, value in enumerate(names)}
    return RecognisedWeights(
        path=path, format="libreyolo", state_dict=_checked_state_dict(path, content["model"], "its 'model'"),
        family=str(content["model_family"]), size=str(size), task=_zoo_task_name(str(content["task"])), num_classes=int(nc),
        names=name_map, input_size=_libreyolo_input_size(content, int(imgsz)),
        input_pipeline=_libreyolo_pipeline(content),
    )


# LibreYOLO's YOLOv9 checkpoints say where the letterbox puts the image (``letterbox_pad``): top-left
# for its own training runs, centred for the official release it converts.
LIBREYOLO_LETTERBOX_PADS = {"topleft": "top_left", "center": "centre", "centre": "centre"}


def _libreyolo_pipeline(content: Mapping[str, Any]) -> dict[str, Any]:
    """The input-pipeline fields a LibreYOLO checkpoint records (its ``letterbox_pad``), in zoo's words."""
    pad = content.get("letterbox_pad")
    if not isinstance(pad, str):
        return {}
    return {"placement": LIBREYOLO_LETTERBOX_PADS.get(pad.strip().lower(), "top_left")}


def _zoo_task_name(libreyolo_task: str) -> str:
    """zoo's name of a LibreYOLO task (``point`` -> ``points``: the tasks' ``libreyolo_name``)."""
    renamed = {task.libreyolo_name: name for name, task in builtin_tasks().items() if task.libreyolo_name}
    return renamed.get(libreyolo_task, libreyolo_task)


def _libreyolo_task_name(task: str) -> str:
    """LibreYOLO's name of a zoo task (``points`` -> ``point``)."""
    declared = builtin_tasks().get(task)
    return (declared.libreyolo_name if declared is not None else None) or task


def _libreyolo_input_size(content: Mapping[str, Any], imgsz: int) -> "ImageSize":
    """LibreYOLO's input size: ``imgsz`` (the longer side), or the ``imgsz_h`` × ``imgsz_w`` rectangle it writes beside it."""
    height, width = content.get("imgsz_h"), content.get("imgsz_w")
    if all(isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in (height, width)):
        return imgsz if height == width == imgsz else (int(height), int(width))
    return imgsz


def recognise(path: str | Path) -> RecognisedWeights:
    """What the weights file at ``path`` is (see the module docstring); a ``WeightsError`` naming the file if none."""
    path = Path(path)
    if path.is_dir():
        raise CorruptWeightsError(f"{path} is a directory, not a weights file; give the path of a .pt, .pth or .safetensors file")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        tensors, meta = read_safetensors(path)
        return RecognisedWeights(path, "zoo" if meta else "state_dict", tensors, meta=meta)
    if suffix not in (".pt", ".pth"):
        raise CorruptWeightsError(f"{path}: unknown weights format {path.suffix!r}; use .safetensors, .pt or .pth")
    content = load_torch_file(path)
    if not isinstance(content, Mapping):
        raise CorruptWeightsError(
            f"{path} holds a {type(content).__name__}, not a state dict; save weights with torch.save(model.state_dict(), path)"
        )
    if isinstance(content.get("meta"), Mapping) and "model" in content:
        meta = ModelMeta.from_dict(content["meta"], path)
        state_dict = _checked_state_dict(path, content["model"], "its 'model'")
        verify_digest(path, state_dict, content["meta"].get(DIGEST_KEY))
        return RecognisedWeights(path, "zoo", state_dict, meta=meta)
    if "schema_version" in content or "model_family" in content:
        return _libreyolo(path, content)
    if _tensor_dict(content):
        return RecognisedWeights(path, "state_dict", {str(key): value for key, value in content.items()})
    for container in _CONTAINERS:
        if _tensor_dict(content.get(container)):
            return RecognisedWeights(path, "state_dict", _checked_state_dict(path, content[container], container),
                                     container=container)
    raise CorruptWeightsError(
        f"{path} is not a state dict zoo recognises: a dict with keys {sorted(map(str, content))[:6]}, but not a zoo or "
        "LibreYOLO checkpoint, a mapping of names to tensors, or one under 'state_dict', 'model', 'params_ema' or "
        "'params'. Save weights with torch.save(model.state_dict(), path)"
    )


def libreyolo_checkpoint(state_dict: Mapping[str, "torch.Tensor"], *, family: str, size: str, task: str,
                         names: Mapping[int, str], input_size: int, letterbox_placement: str | None = None) -> dict[str, Any]:
    """The dict LibreYOLO 1.6.0 loads: ``model`` (in LibreYOLO's keys) plus its schema-1.0 metadata.

    ``names`` is written as ``{int: str}``: LibreYOLO accepts a list in validation but not when
    loading. ``letterbox_placement`` (``top_left`` or ``centre``) is written as LibreYOLO's
    ``letterbox_pad`` for a model that letterboxes.
    """
    placement = {} if letterbox_placement is None else {
        "letterbox_pad": {"top_left": "topleft", "centre": "center"}[letterbox_placement]}
    return {
        **placement,
        "model": {key: tensor.detach().cpu().contiguous() for key, tensor in state_dict.items()},
        "schema_version": LIBREYOLO_SCHEMA_VERSION,
        "libreyolo_version": LIBREYOLO_WRITER_VERSION,
        "model_family": family,
        "size": size,
        "task": _libreyolo_task_name(task),
        "nc": max(len(names), 1),
        "names": {int(key): str(value) for key, value in names.items()} or {0: "image"},
        "imgsz": int(input_size),
    }
