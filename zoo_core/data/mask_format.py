"""The semantic-segmentation format: images with PNG class-index masks, described by a YAML.

```yaml
path: /data/streets          # root (relative: to this file's folder; missing: this folder)
train: {images: images/train, masks: masks/train}
val: {images: images/val, masks: masks/val}
names: [background, road, car]
ignore_index: 255            # optional, default 255: pixels excluded from loss and metric
```

In the mapping form the mask of ``images/train/a/b.jpg`` is ``masks/train/a/b.png``. A split may
also be a plain string (an image folder or ``.txt`` list): masks are then found by replacing the
last ``/images/`` of each image path with ``/masks/`` and the suffix with ``.png`` (as YOLO labels
are found). Masks are single-channel PNGs (mode ``L``, ``P`` or 16-bit) whose pixel values are
class indices, the same size as their image.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from zoo_core.data.dataset_yaml import dataset_root, parse_names, read_dataset_yaml, resolve_under
from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.images import images_from_entry, images_in_directory, refuse_shared_annotations, usable_images
from zoo_core.errors import excerpt

__all__ = ["SemanticRecord", "SemanticYaml", "SemanticSplit", "DEFAULT_IGNORE_INDEX", "mask_path_for", "read_semantic_yaml", "index_semantic_split"]

DEFAULT_IGNORE_INDEX = 255
_MASK_MODES = ("L", "P", "I;16", "I")


@dataclass
class SemanticSplit:
    """One split: image entries and, in the mapping form, the folder the masks mirror them in."""

    images: list[Path]
    masks: Path | None = None  # None: the /images/ -> /masks/ convention


@dataclass
class SemanticRecord:
    """A usable image and its mask file."""

    image: Path
    mask: Path


@dataclass
class SemanticYaml:
    """What a semantic dataset YAML declares, resolved to paths."""

    yaml_path: Path
    root: Path
    names: dict[int, str]
    ignore_index: int
    splits: dict[str, SemanticSplit]


def mask_path_for(image_path: Path, split: SemanticSplit) -> Path:
    """The mask file of ``image_path`` in ``split`` (mirrored folder, or the ``/masks/`` convention)."""
    if split.masks is not None:
        for images_dir in split.images:
            try:
                relative = image_path.relative_to(images_dir)
            except ValueError:
                continue
            return (split.masks / relative).with_suffix(".png")
    text = str(image_path)
    images_part, masks_part = f"{os.sep}images{os.sep}", f"{os.sep}masks{os.sep}"
    if images_part in text:
        text = masks_part.join(text.rsplit(images_part, 1))
    return Path(text).with_suffix(".png")


def _parse_split(yaml_path: Path, root: Path, key: str, value: Any) -> SemanticSplit:
    if isinstance(value, dict):
        if set(value) != {"images", "masks"}:
            raise DatasetError(f"{yaml_path}: {key!r} as a mapping needs exactly the keys 'images' and 'masks', got {excerpt(sorted(map(str, value)))}")
        images_dir, masks_dir = resolve_under(root, value["images"]), resolve_under(root, value["masks"])
        for label, folder in (("images", images_dir), ("masks", masks_dir)):
            if not folder.is_dir():
                raise DatasetError(f"{yaml_path}: {key}.{label} {folder} is not a folder")
        return SemanticSplit(images=[images_dir], masks=masks_dir)
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) for item in values):
        raise DatasetError(f"{yaml_path}: {key!r} must be {{images: dir, masks: dir}}, a path or a list of paths; got {excerpt(value)}")
    return SemanticSplit(images=[resolve_under(root, item) for item in values])


def read_semantic_yaml(yaml_path: Path) -> SemanticYaml:
    """Parse a semantic dataset YAML; ``DatasetError`` naming the file and key for anything wrong."""
    content = read_dataset_yaml(yaml_path)
    root = dataset_root(yaml_path, content)
    names = parse_names(content.get("names"), str(yaml_path), content.get("nc"))
    ignore_index = content.get("ignore_index", DEFAULT_IGNORE_INDEX)
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool) or ignore_index in names:
        raise DatasetError(f"{yaml_path}: ignore_index must be an integer that is not a class index (e.g. 255), got {excerpt(ignore_index)}")
    splits = {}
    for key in ("train", "val", "test"):
        value = content.get(key)
        if value in (None, "", []):
            if key != "test":
                raise DatasetError(f"{yaml_path}: missing {key!r}; give {{images: dir, masks: dir}} relative to {root}")
            continue
        splits[key] = _parse_split(yaml_path, root, key, value)
    return SemanticYaml(yaml_path=yaml_path, root=root, names=names, ignore_index=ignore_index, splits=splits)


def _mask_problem(mask_path: Path, shape: tuple[int, int], num_classes: int, ignore_index: int) -> str:
    """Why ``mask_path`` cannot label an image of ``shape`` (empty string when it can)."""
    from PIL import Image

    try:
        with Image.open(mask_path) as mask:
            if mask.mode not in _MASK_MODES:
                return f"mask must be a single-channel PNG of class indices (mode L or P), got mode {mask.mode}"
            values = np.asarray(mask)
    except Exception as error:  # PIL raises many types for bad files
        return f"unreadable mask ({type(error).__name__}: {error})"
    if values.shape != shape:
        return f"mask is {values.shape[1]}×{values.shape[0]} but its image is {shape[1]}×{shape[0]}"
    present = np.unique(values)
    bad = [int(value) for value in present if value >= num_classes and value != ignore_index]
    if bad:
        shown = ", ".join(map(str, bad[:8]))
        return f"class index {shown} outside names (0..{num_classes - 1}) and not ignore_index {ignore_index}"
    return ""


def index_semantic_split(split: SemanticSplit, names: Mapping[int, str], ignore_index: int, what: str = "semantic split") -> list[SemanticRecord]:
    """Every usable (image, mask) pair of ``split``; bad ones are warned about and skipped.

    Each mask is read once here to check its mode, size and values. Raises ``DatasetError``
    when no usable pair is left.
    """
    report = ProblemReport(what)
    candidates: list[Path] = []
    for entry in split.images:
        candidates.extend(images_in_directory(entry) if entry.is_dir() else images_from_entry(entry, report))
    images = usable_images(candidates, report)
    refuse_shared_annotations([(image_path, mask_path_for(image_path, split)) for image_path, _ in images], "mask")
    pairs = []
    for image_path, shape in images:
        mask_path = mask_path_for(image_path, split)
        if not mask_path.is_file():
            report.add(image_path, f"no mask (expected {mask_path}); skipped")
        else:
            pairs.append((image_path, mask_path, shape))
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:
        problems = list(pool.map(lambda pair: _mask_problem(pair[1], pair[2], len(names), ignore_index), pairs))
    records = []
    for (image_path, mask_path, _), problem in zip(pairs, problems):
        if problem:
            report.add(mask_path, f"{problem}; its image is skipped")
        else:
            records.append(SemanticRecord(image=image_path, mask=mask_path))
    report.finish()
    if not records:
        raise DatasetError(f"{what}: no usable image with a valid mask in {', '.join(map(str, split.images))}; see the warnings above")
    return records
