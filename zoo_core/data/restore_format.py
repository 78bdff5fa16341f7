"""Restoration data: clean images degraded on the fly, or paired degraded/clean images.

Two spellings (docs/data.md):

- a folder with ``train/`` and ``val/`` (optional ``test/``): each split is either a folder of
  clean images (degraded on the fly) or holds ``input/`` (degraded) and ``target/`` (clean)
  sub-folders whose images pair up by relative path and stem;
- a YAML (``task: restore`` optional)::

      path: /data/photos
      train: clean/train                           # clean images, degraded on the fly
      val: {input: pairs/val/noisy, target: pairs/val/gt}   # or paired folders
      degradation: {scale: 2, noise: 15}           # optional; the defaults shown

On-the-fly degradation of a clean image: bicubic downscale by ``scale`` (antialiased) and back up
to the same size, then Gaussian noise of standard deviation ``noise`` (in 0-255 units), rounded
to 8 bits. Training draws the noise from torch's global RNG; validation seeds it per image, so
every run and every rank sees the same degraded validation images.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo_core.data.dataset_yaml import YAML_SUFFIXES, dataset_root, read_dataset_yaml, resolve_under
from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.images import images_from_entry, images_in_directory, refuse_shared_annotations, usable_images
from zoo_core.errors import excerpt

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_DEGRADATION",
    "RestoreSplit",
    "RestoreRecord",
    "RestoreLayout",
    "read_restore_layout",
    "parse_degradation",
    "index_restore_split",
    "degrade",
]

DEFAULT_DEGRADATION = {"scale": 2, "noise": 15.0}


@dataclass
class RestoreSplit:
    """One split: ``clean`` entries (degraded on the fly) or an ``input``/``target`` folder pair."""

    clean: list[Path] | None = None
    input: Path | None = None
    target: Path | None = None

    @property
    def paired(self) -> bool:
        """Whether the degraded images are given (paired) rather than made on the fly."""
        return self.clean is None


@dataclass
class RestoreRecord:
    """One sample: the clean image and, when paired, its degraded input."""

    target: Path
    input: Path | None = None


@dataclass
class RestoreLayout:
    """A restoration dataset resolved to folders, with its degradation recipe."""

    root: Path
    splits: dict[str, RestoreSplit]
    degradation: dict[str, float]


def parse_degradation(value: Any, where: str) -> dict[str, float]:
    """``{scale, noise}`` from a YAML mapping (defaults for missing keys), validated."""
    if value is None:
        return dict(DEFAULT_DEGRADATION)
    if not isinstance(value, dict) or not set(value) <= {"scale", "noise"}:
        raise DatasetError(f"{where}: degradation must be a mapping with keys scale and noise, got {excerpt(value)}")
    recipe = {**DEFAULT_DEGRADATION, **value}
    scale, noise = recipe["scale"], recipe["noise"]
    if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
        raise DatasetError(f"{where}: degradation.scale must be an integer >= 1 (1: no resampling), got {excerpt(scale)}")
    if not isinstance(noise, (int, float)) or isinstance(noise, bool) or noise < 0:
        raise DatasetError(f"{where}: degradation.noise must be a number >= 0 (0-255 units), got {excerpt(noise)}")
    if scale == 1 and noise == 0:
        raise DatasetError(f"{where}: degradation with scale 1 and noise 0 leaves images unchanged; set scale > 1 or noise > 0")
    return {"scale": int(scale), "noise": float(noise)}


def _folder_split(folder: Path) -> RestoreSplit:
    if (folder / "input").is_dir() and (folder / "target").is_dir():
        return RestoreSplit(input=folder / "input", target=folder / "target")
    return RestoreSplit(clean=[folder])


def _yaml_split(yaml_path: Path, root: Path, key: str, value: Any) -> RestoreSplit:
    if isinstance(value, dict):
        if set(value) != {"input", "target"}:
            raise DatasetError(f"{yaml_path}: {key!r} as a mapping needs exactly the keys 'input' and 'target', got {excerpt(sorted(map(str, value)))}")
        pair = {name: resolve_under(root, value[name]) for name in ("input", "target")}
        for name, folder in pair.items():
            if not folder.is_dir():
                raise DatasetError(f"{yaml_path}: {key}.{name} {folder} is not a folder")
        return RestoreSplit(input=pair["input"], target=pair["target"])
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) for item in values):
        raise DatasetError(f"{yaml_path}: {key!r} must be a folder, a list of folders or {{input: dir, target: dir}}; got {excerpt(value)}")
    return RestoreSplit(clean=[resolve_under(root, item) for item in values])


def read_restore_layout(data: Path) -> RestoreLayout:
    """Resolve a restoration dataset folder or YAML; ``DatasetError`` naming what is missing."""
    if data.is_file() and data.suffix.lower() in YAML_SUFFIXES:
        content = read_dataset_yaml(data)
        root = dataset_root(data, content)
        splits = {}
        for key in ("train", "val", "test"):
            value = content.get(key)
            if value in (None, "", []):
                if key != "test":
                    raise DatasetError(f"{data}: missing {key!r}; give a clean-image folder or {{input: dir, target: dir}}")
                continue
            splits[key] = _yaml_split(data, root, key, value)
        return RestoreLayout(root=root, splits=splits, degradation=parse_degradation(content.get("degradation"), str(data)))
    if data.is_dir():
        splits = {}
        for key in ("train", "val", "test"):
            if (data / key).is_dir():
                splits[key] = _folder_split(data / key)
            elif key != "test":
                raise DatasetError(f"{data}: missing {key}/ (clean images, or input/ and target/ sub-folders)")
        return RestoreLayout(root=data, splits=splits, degradation=dict(DEFAULT_DEGRADATION))
    raise DatasetError(f"restoration data {str(data)!r} does not exist; give a folder with train/ and val/, or a dataset YAML")


def _pair_key(folder: Path, path: Path) -> str:
    """What pairs a degraded input with its target: the relative path without the suffix."""
    return path.relative_to(folder).with_suffix("").as_posix()


def index_restore_split(split: RestoreSplit, what: str = "restoration split") -> list[RestoreRecord]:
    """Every usable sample of ``split``; unreadable or unpaired images are warned about and skipped."""
    report = ProblemReport(what)
    records: list[RestoreRecord] = []
    if split.clean is not None:
        candidates: list[Path] = []
        for entry in split.clean:
            candidates.extend(images_from_entry(entry, report))
        records = [RestoreRecord(target=path) for path, _ in usable_images(candidates, report)]
    else:
        assert split.input is not None and split.target is not None
        inputs_by_key = {}
        input_paths = images_in_directory(split.input)
        # Pairs are matched by relative path and stem: a.jpg and a.png in one folder would both claim one partner.
        for folder, paths in ((split.input, input_paths), (split.target, images_in_directory(split.target))):
            refuse_shared_annotations([(path, folder / _pair_key(folder, path)) for path in paths], "pairing key",
                                      only_existing=False)
        for path in input_paths:
            inputs_by_key[_pair_key(split.input, path)] = path
        targets = usable_images(images_in_directory(split.target), report)
        inputs = dict(usable_images(list(inputs_by_key.values()), report))
        for target_path, target_shape in targets:
            key = _pair_key(split.target, target_path)
            input_path = inputs_by_key.get(key)
            if input_path is None:
                report.add(target_path, f"no degraded partner in {split.input} (same relative path and stem); skipped")
            elif input_path not in inputs:
                continue  # unreadable input, already reported
            elif inputs[input_path] != target_shape:
                report.add(input_path, f"size {inputs[input_path]} differs from its target {target_path} {target_shape}; skipped")
            else:
                records.append(RestoreRecord(target=target_path, input=input_path))
    report.finish()
    if not records:
        where = ", ".join(map(str, split.clean)) if split.clean is not None else f"{split.input} / {split.target}"
        raise DatasetError(f"{what}: no usable image in {where}; see the warnings above")
    return records


def degrade(clean: "torch.Tensor", scale: int, noise: float, generator: "torch.Generator | None" = None) -> "torch.Tensor":
    """Degrade a uint8 ``3×H×W`` image: bicubic down by ``scale`` and back up, plus Gaussian noise (0-255 units)."""
    import torch
    import torch.nn.functional as F

    image = clean.to(torch.float32)[None] / 255.0
    height, width = image.shape[-2:]
    if scale > 1:
        small = F.interpolate(image, size=(max(height // scale, 1), max(width // scale, 1)), mode="bicubic", antialias=True, align_corners=False)
        image = F.interpolate(small, size=(height, width), mode="bicubic", align_corners=False)
    if noise > 0:
        image = image + torch.randn(image.shape, generator=generator) * (noise / 255.0)
    return (image.clamp(0, 1) * 255.0).round().to(torch.uint8)[0]
