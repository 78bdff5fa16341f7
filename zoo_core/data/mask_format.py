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

A YOLO segmentation dataset (plain image folders or lists, polygon labels in ``labels/`` beside
``images/``, no ``masks/``: Ultralytics' coco8-seg layout) is read as semantic data too: each image's
polygons are rasterised into a class mask (``class_mask_from_instances``). Class ``k`` of the YAML
becomes index ``k + 1`` and index 0 is ``background`` (names gain it); where objects overlap, larger
objects are painted first and smaller ones over them (Ultralytics' ``polygons2masks_overlap`` orders its
masks by area the same way), ties in label-file order; COCO ``iscrowd`` regions become ``ignore_index``.
A split is read this way when its first image has no mask file and has a label file.
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
from zoo_core.data.instances import InstanceRecord
from zoo_core.errors import excerpt

__all__ = [
    "SemanticRecord", "PolygonMaskRecord", "SemanticYaml", "SemanticSplit", "DEFAULT_IGNORE_INDEX", "mask_path_for", "read_semantic_yaml",
    "index_semantic_split", "reads_polygon_labels", "index_polygon_split", "class_mask_from_instances",
]

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
class PolygonMaskRecord:
    """A usable image whose class mask is rasterised from its instances (YOLO-seg polygons) when it is loaded."""

    image: Path
    instances: InstanceRecord


@dataclass
class SemanticYaml:
    """What a semantic dataset YAML declares, resolved to paths."""

    yaml_path: Path
    root: Path
    names: dict[int, str]
    ignore_index: int
    splits: dict[str, SemanticSplit]
    polygon_labels: bool = False  # a YOLO-seg dataset: names gained "background", masks come from polygons


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
    if reads_polygon_labels(splits["train"]):
        # YOLO-seg classes 0..n-1 move up one to make room for the background
        names = {0: "background", **{index + 1: name for index, name in names.items()}}
        if ignore_index in names:
            raise DatasetError(f"{yaml_path}: ignore_index {ignore_index} is a class index once 'background' is added; choose another (e.g. 255)")
        return SemanticYaml(yaml_path=yaml_path, root=root, names=names, ignore_index=ignore_index, splits=splits, polygon_labels=True)
    return SemanticYaml(yaml_path=yaml_path, root=root, names=names, ignore_index=ignore_index, splits=splits)


def _first_image(split: SemanticSplit) -> Path | None:
    for entry in split.images:
        try:  # quietly: the split is indexed, and its problems reported, when its dataset is built
            found = images_in_directory(entry) if entry.is_dir() else images_from_entry(entry, ProblemReport(str(entry), limit=0))
        except DatasetError:
            found = []
        if found:
            return found[0]
    return None


def reads_polygon_labels(split: SemanticSplit) -> bool:
    """Whether ``split`` is YOLO-seg data: plain image entries whose first image has a label file and no mask."""
    from zoo_core.data.yolo_format import label_path_for

    if split.masks is not None:
        return False
    image = _first_image(split)
    return image is not None and not mask_path_for(image, split).is_file() and label_path_for(image).is_file()


def index_polygon_split(split: SemanticSplit, names: Mapping[int, str], what: str = "semantic split") -> list[PolygonMaskRecord]:
    """Every usable image of a YOLO-seg ``split`` with its objects; ``names`` include ``background`` at 0."""
    from zoo_core.data.instance_readers import index_instance_split

    object_names = {index - 1: name for index, name in names.items() if index > 0}
    return [PolygonMaskRecord(image=record.image, instances=record)
            for record in index_instance_split(list(split.images), object_names, what=what)]


def class_mask_from_instances(record: InstanceRecord, ignore_index: int = DEFAULT_IGNORE_INDEX) -> np.ndarray:
    """The ``height×width`` class mask of ``record``'s objects (uint8, or int32 for indices above 255; rule in the
    module docstring): 0 where no object is, ``class + 1`` under an object, ``ignore_index`` under a crowd region."""
    regions = [shape.rasterise(record.height, record.width) for shape in record.shapes]
    values = [ignore_index if crowd else int(row[0]) + 1 for row, crowd in zip(record.labels, record.crowd)]
    dtype = np.uint8 if max([0, *values]) <= 255 else np.int32
    mask = np.zeros((record.height, record.width), dtype=dtype)
    for position in sorted(range(len(regions)), key=lambda index: -int(regions[index].sum())):  # stable: ties in file order
        mask[regions[position]] = values[position]
    return mask


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
