"""COCO instance JSON (``instances_*.json``) read into ``InstanceRecord`` s, for the segment and detect tasks.

A file holds ``images`` (``id``, ``file_name``, optional ``height``/``width``), ``categories`` (``id``,
``name``) and ``annotations`` (``id``, ``image_id``, ``category_id``, ``bbox`` ``[x, y, w, h]`` in pixels,
``segmentation``: a list of polygons ``[x1, y1, x2, y2, ...]`` in pixels, several for an object in pieces,
or a run-length encoding ``{"size": [h, w], "counts": ...}`` compressed (a string) or not (a list), and
``iscrowd``). Classes are the categories in sorted id order, numbered 0, 1, ... (COCO's ids 1..90 with gaps
become 0..79); their names are the categories' unless the dataset YAML gives ``names``. An image without
annotations is a background image. ``iscrowd`` regions are kept as crowd instances: training leaves them out
and the mask metric ignores them, as COCO's evaluation does.

Images are found in the image folder of the file (``coco_image_folder``), the first of these that holds the
first image's ``file_name``, where ``<split>`` is the file's name without ``instances_`` (``val2017``)::

    <json folder>/<split>/   <json folder>/images/<split>/   <json folder>/../<split>/   <json folder>/../images/<split>/
    <json folder>/images/    <json folder>/

so COCO's own layout (``annotations/instances_val2017.json`` beside ``val2017/``, or ``images/val2017/``) and
an annotations file beside its images both work.

Bad input: a file that is not JSON, too large (``MAX_COCO_JSON_BYTES``), without ``images`` or ``categories``,
or whose categories disagree with ``names`` is a ``DatasetError`` naming the file and the fix; an annotation
with a malformed field, an unknown ``category_id`` or ``image_id``, and an image that is missing or unreadable
are skipped and reported (``ProblemReport``), naming the file and the annotation or image id.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zoo_core.data.dataset_yaml import dataset_root, parse_names, split_paths
from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.images import usable_images
from zoo_core.data.instances import InstanceRecord, InstanceShape
from zoo_core.data.yolo_format import DetectionYaml
from zoo_core.errors import excerpt

__all__ = [
    "MAX_COCO_JSON_BYTES", "COCO_JSON_SUFFIX", "CocoInstances", "coco_image_folder", "coco_names", "load_coco_json", "read_coco_instances",
    "names_coco_json", "read_coco_yaml", "coco_json_layout", "coco_folder_layout",
]

# COCO's own train2017 instances file is 448 MB; a bound far above it still refuses a runaway file early.
MAX_COCO_JSON_BYTES = 2 * 1024**3
COCO_JSON_SUFFIX = ".json"
_PREFIX = "instances_"
_PREFIXES = (_PREFIX, "person_keypoints_")  # COCO's instance and keypoint files name their split after these


class _Image(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: int
    file_name: str = Field(min_length=1)
    height: int | None = Field(default=None, gt=0)
    width: int | None = Field(default=None, gt=0)


class _Category(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: int
    name: str


class _File(BaseModel):
    model_config = ConfigDict(extra="ignore")
    images: list[_Image]
    categories: list[_Category] = Field(min_length=1)
    annotations: list[dict[str, Any]] = Field(default_factory=list)


class _Rle(BaseModel):
    model_config = ConfigDict(extra="ignore")
    size: tuple[int, int]
    counts: Union[str, list[int]]


class _Annotation(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: int
    image_id: int
    category_id: int
    bbox: tuple[float, float, float, float]
    segmentation: Union[list[list[float]], _Rle, None] = None
    iscrowd: int = Field(default=0, ge=0, le=1)
    keypoints: Union[list[float], None] = None  # COCO person_keypoints: x1, y1, v1, ... in pixels (the pose task)
    area: Union[float, None] = None


@dataclass
class CocoInstances:
    """One COCO instance file read: its image folder, class names and the usable images with their objects."""

    json_path: Path
    image_folder: Path
    names: dict[int, str]
    category_ids: list[int]  # class k is category category_ids[k]
    records: list[InstanceRecord]
    #: With ``read_coco_instances(keypoints=K)``: per record an n×K×3 float32 array (x, y normalised, visibility
    #: 0/1/2) aligned with its box rows, and the annotations' ``area`` in pixels (NaN where the file gives none).
    keypoints: list[np.ndarray] | None = None
    areas: list[np.ndarray] | None = None


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top level"
    return f"{where}: {first['msg']}"


def load_coco_json(json_path: Path) -> dict[str, Any]:
    """The parsed mapping of COCO file ``json_path``, bounded in size; ``DatasetError`` naming the file otherwise."""
    try:
        size = json_path.stat().st_size
    except OSError as error:
        raise DatasetError(f"COCO annotations {json_path} cannot be read ({error.strerror or error}); check the path") from None
    if size > MAX_COCO_JSON_BYTES:
        raise DatasetError(f"{json_path}: {size:,} bytes is larger than zoo reads as COCO JSON ({MAX_COCO_JSON_BYTES:,}); split the file")
    try:
        content = json.loads(json_path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as error:
        raise DatasetError(f"{json_path}: not UTF-8 text (byte offset {error.start}); COCO JSON is UTF-8, re-save it so") from None
    except json.JSONDecodeError as error:
        raise DatasetError(f"{json_path}: not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    except RecursionError:
        raise DatasetError(f"{json_path}: the JSON is nested too deeply to be COCO annotations") from None
    if not isinstance(content, dict):
        raise DatasetError(f"{json_path}: expected a JSON object with images, annotations and categories, got {type(content).__name__}")
    return content


def _parse_file(json_path: Path, content: Mapping[str, Any]) -> _File:
    try:
        return _File.model_validate(content)
    except ValidationError as error:
        raise DatasetError(
            f"{json_path}: not COCO instance annotations ({_first_error(error)}); a COCO file has 'images' (id, file_name), "
            "'categories' (id, name) and 'annotations' (id, image_id, category_id, bbox, segmentation)"
        ) from None


def _category_order(json_path: Path, parsed: _File) -> list[int]:
    ids = [category.id for category in parsed.categories]
    if len(set(ids)) != len(ids):
        raise DatasetError(f"{json_path}: category ids repeat ({excerpt(sorted(ids))}); each category needs its own id")
    return sorted(ids)


def coco_names(json_path: Path) -> dict[int, str]:
    """The class names of COCO file ``json_path``: its categories' names in sorted id order, as classes 0, 1, ..."""
    parsed = _parse_file(json_path, load_coco_json(json_path))
    by_id = {category.id: category.name for category in parsed.categories}
    return {index: by_id[category_id] for index, category_id in enumerate(_category_order(json_path, parsed))}


def _split_name(json_path: Path) -> str:
    stem = json_path.stem
    for prefix in _PREFIXES:
        if stem.startswith(prefix):
            return stem[len(prefix):]
    return stem


def coco_image_folder(json_path: Path, file_name: str | None) -> Path:
    """The image folder of ``json_path``: the first candidate (module docstring) holding ``file_name``.

    ``file_name`` ``None`` (a file without images) gives the first candidate that exists.
    """
    split = _split_name(json_path)
    folder = json_path.resolve().parent
    candidates = [folder / split, folder / "images" / split, folder.parent / split, folder.parent / "images" / split,
                  folder / "images", folder]
    for candidate in candidates:
        if candidate.is_dir() and (file_name is None or (candidate / file_name).is_file()):
            return candidate
    shown = ", ".join(str(candidate) for candidate in candidates)
    raise DatasetError(
        f"{json_path}: cannot find the image folder: none of {shown} holds its first image {file_name!r}. "
        f"Put the images in {folder.parent / split} (COCO's layout) or beside the annotations file"
    )


def _shape_of(annotation: _Annotation, height: int, width: int) -> InstanceShape | str:
    """The annotation's region (normalised polygons or an RLE of the image's size), or why it has none usable."""
    segmentation = annotation.segmentation
    if isinstance(segmentation, _Rle):
        if tuple(segmentation.size) != (height, width):
            return f"an RLE of size {list(segmentation.size)} on an image of {height}×{width}; it must be the image's [height, width]"
        if isinstance(segmentation.counts, list):
            if any(count < 0 for count in segmentation.counts) or sum(segmentation.counts) != height * width:
                return f"uncompressed RLE counts sum to {sum(segmentation.counts)}, not the image's {height * width} pixels"
        elif not segmentation.counts:
            return "an RLE with empty counts"
        return InstanceShape(rle={"size": [height, width], "counts": segmentation.counts})
    if not segmentation:
        return "no segmentation"
    scale = np.array([width, height], dtype=np.float64)
    polygons = []
    for ring in segmentation:
        if len(ring) < 6 or len(ring) % 2:
            return f"a polygon of {len(ring)} coordinates; each needs x, y pairs of at least 3 points"
        if not all(math.isfinite(value) for value in ring):
            return "a non-finite polygon coordinate"
        polygons.append(np.clip(np.asarray(ring, dtype=np.float64).reshape(-1, 2) / scale, 0.0, 1.0).astype(np.float32))
    return InstanceShape(polygons=tuple(polygons))


def _box_polygon(box: np.ndarray) -> InstanceShape:
    x1, y1, x2, y2 = (float(value) for value in box)
    return InstanceShape(polygons=(np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], dtype=np.float32),))


def _keypoints_of(annotation: _Annotation, count: int, height: int, width: int) -> np.ndarray | str:
    """The annotation's ``count`` keypoints as a K×3 float32 array (x, y normalised, visibility), or why not."""
    values = annotation.keypoints
    if values is None:
        return "no keypoints (a pose dataset needs every non-crowd object's 'keypoints': x1, y1, v1, ...)"
    if len(values) != 3 * count:
        return f"{len(values)} keypoint values; the dataset's {count} keypoints need {3 * count} (x, y, v each)"
    if not all(math.isfinite(value) for value in values):
        return "a non-finite keypoint value"
    points = np.asarray(values, dtype=np.float64).reshape(count, 3)
    if np.any(~np.isin(points[:, 2], (0.0, 1.0, 2.0))):
        return "a keypoint visibility other than 0, 1 or 2"
    points[:, 0] /= width
    points[:, 1] /= height
    points[points[:, 2] == 0, :2] = 0.0  # COCO writes unlabelled points as 0, 0, 0
    points[:, :2] = np.clip(points[:, :2], 0.0, 1.0)
    return points.astype(np.float32)


def read_coco_instances(json_path: Path, names: Mapping[int, str] | None, report: ProblemReport,
                        need_shapes: bool = True, keypoints: int | None = None) -> CocoInstances:
    """The usable images of COCO file ``json_path`` with their objects (see the module docstring).

    ``names`` (``None``: the file's categories) must have one class per category. ``need_shapes=False``
    (detection) keeps an annotation without ``segmentation`` for its box, its shape then the box's rectangle;
    with ``need_shapes`` such an annotation is skipped and reported. ``keypoints=K`` (the pose task) also reads
    every annotation's ``keypoints`` (K points); a non-crowd annotation without them is skipped and reported.
    """
    parsed = _parse_file(json_path, load_coco_json(json_path))
    category_ids = _category_order(json_path, parsed)
    by_id = {category.id: category.name for category in parsed.categories}
    file_names = {index: by_id[category_id] for index, category_id in enumerate(category_ids)}
    if names is None:
        names = file_names
    elif len(names) != len(category_ids):
        raise DatasetError(
            f"{json_path}: {len(category_ids)} categories ({excerpt(list(file_names.values()))}) but names lists {len(names)} "
            "classes; give one name per category (in sorted category-id order) or drop names to use the file's"
        )
    class_of = {category_id: index for index, category_id in enumerate(category_ids)}
    image_folder = coco_image_folder(json_path, parsed.images[0].file_name if parsed.images else None)
    images: dict[int, _Image] = {}
    for image in parsed.images:
        if image.id in images:
            report.add(json_path, f"image id {image.id} ({image.file_name}) repeats an earlier image id; skipped")
            continue
        images[image.id] = image
    found = usable_images([image_folder / image.file_name for image in images.values()], report)
    shapes_on_disk = dict(found)
    objects: dict[int, list[tuple[np.ndarray, InstanceShape, bool]]] = {image_id: [] for image_id in images}
    points: dict[int, list[tuple[np.ndarray, float]]] = {image_id: [] for image_id in images}
    usable: dict[int, tuple[int, int]] = {}
    for image_id, image in images.items():
        shape = shapes_on_disk.get(image_folder / image.file_name)
        if shape is None:
            continue  # reported by usable_images (missing or unreadable)
        if (image.height, image.width) not in ((None, None), shape):
            report.add(json_path, f"image id {image_id} ({image.file_name}) is declared {image.height}×{image.width} but is "
                                  f"{shape[0]}×{shape[1]} on disk; its annotations would be misplaced, so it is skipped")
            continue
        usable[image_id] = shape
    for raw in parsed.annotations:
        label = f"annotation id {raw.get('id', '?')}"
        try:
            annotation = _Annotation.model_validate(raw)
        except ValidationError as error:
            report.add(json_path, f"{label}: malformed ({_first_error(error)}); skipped")
            continue
        if annotation.category_id not in class_of:
            report.add(json_path, f"{label}: category_id {annotation.category_id} is not among the categories "
                                  f"{excerpt(category_ids)}; skipped (add the category or fix the id)")
            continue
        if annotation.image_id not in images:
            report.add(json_path, f"{label}: image_id {annotation.image_id} is not among the images; skipped")
            continue
        if annotation.image_id not in usable:
            continue  # the image itself was skipped and reported
        height, width = usable[annotation.image_id]
        x, y, box_width, box_height = annotation.bbox
        if not all(math.isfinite(value) for value in annotation.bbox) or box_width <= 0 or box_height <= 0:
            report.add(json_path, f"{label}: bbox {list(annotation.bbox)} has no area (COCO's bbox is [x, y, width, height]); skipped")
            continue
        box = np.clip(np.array([x / width, y / height, (x + box_width) / width, (y + box_height) / height]), 0.0, 1.0)
        if box[2] <= box[0] or box[3] <= box[1]:
            report.add(json_path, f"{label}: bbox {list(annotation.bbox)} lies outside its {width}×{height} image; skipped")
            continue
        region = _shape_of(annotation, height, width)
        if isinstance(region, str):
            if need_shapes or region != "no segmentation":
                fix = "; a segmentation dataset needs every object's polygons or RLE (or train task=detect)" if region == "no segmentation" else ""
                report.add(json_path, f"{label}: {region}{fix}; skipped")
                continue
            region = _box_polygon(box)
        if keypoints is not None:
            if annotation.iscrowd and annotation.keypoints is None:
                found = np.zeros((keypoints, 3), dtype=np.float32)  # a crowd region is only ignored by the metric
            else:
                found = _keypoints_of(annotation, keypoints, height, width)
            if isinstance(found, str):
                report.add(json_path, f"{label}: {found}; skipped")
                continue
            points[annotation.image_id].append((found, float("nan") if annotation.area is None else float(annotation.area)))
        row = np.concatenate([[class_of[annotation.category_id]], box]).astype(np.float32)
        objects[annotation.image_id].append((row, region, bool(annotation.iscrowd)))
    records = []
    record_points: list[np.ndarray] = []
    record_areas: list[np.ndarray] = []
    for image_id, (height, width) in usable.items():
        rows = objects[image_id]
        if keypoints is not None:
            found_points = points[image_id]
            record_points.append(np.stack([item for item, _ in found_points]) if found_points
                                 else np.zeros((0, keypoints, 3), dtype=np.float32))
            record_areas.append(np.array([area for _, area in found_points], dtype=np.float64))
        records.append(InstanceRecord(
            image=image_folder / images[image_id].file_name, height=height, width=width,
            labels=np.stack([row for row, _, _ in rows]) if rows else np.zeros((0, 5), dtype=np.float32),
            shapes=[region for _, region, _ in rows], crowd=np.array([crowd for _, _, crowd in rows], dtype=bool),
        ))
    return CocoInstances(json_path=json_path, image_folder=image_folder, names=dict(names), category_ids=category_ids, records=records,
                         keypoints=record_points if keypoints is not None else None,
                         areas=record_areas if keypoints is not None else None)


def names_coco_json(content: Mapping[str, Any]) -> bool:
    """Whether a dataset YAML's ``train``, ``val`` or ``test`` names a COCO ``.json`` file."""
    for key in ("train", "val", "test"):
        value = content.get(key)
        values = value if isinstance(value, list) else [value]
        if any(isinstance(item, str) and item.lower().endswith(".json") for item in values):
            return True
    return False


def read_coco_yaml(yaml_path: Path, content: Mapping[str, Any]) -> DetectionYaml:
    """A dataset YAML whose splits name COCO files: ``names`` from the YAML, else from the training file's categories."""
    root = dataset_root(yaml_path, content)
    splits: dict[str, list[Path]] = {"train": split_paths(yaml_path, content, "train", root),  # type: ignore[dict-item]
                                     "val": split_paths(yaml_path, content, "val", root)}  # type: ignore[dict-item]
    test = split_paths(yaml_path, content, "test", root, required=False)
    if test is not None:
        splits["test"] = test
    for split, entries in splits.items():
        for entry in entries:
            if not entry.exists():
                raise DatasetError(f"{yaml_path}: {split} entry {entry} does not exist; check 'path' and '{split}'")
    if content.get("names") is not None:
        names = parse_names(content.get("names"), str(yaml_path), content.get("nc"))
    else:
        json_entries = [entry for entry in splits["train"] + splits["val"] if entry.suffix.lower() == ".json"]
        names = coco_names(json_entries[0])
    return DetectionYaml(yaml_path=yaml_path, root=root, names=names, splits=splits)


def coco_json_layout(json_path: Path) -> DetectionYaml:
    """``data=`` one COCO file: it trains; it validates too, unless a sibling of its name with ``train`` -> ``val`` exists."""
    if not json_path.is_file():
        raise DatasetError(f"COCO annotations {json_path} do not exist; check the path")
    json_path = json_path.resolve()
    val_path = json_path.with_name(json_path.name.replace("train", "val"))
    val = val_path if "train" in json_path.name and val_path.is_file() else json_path
    return DetectionYaml(yaml_path=json_path, root=json_path.parent, names=coco_names(json_path), splits={"train": [json_path], "val": [val]})


def coco_folder_layout(folder: Path) -> DetectionYaml | None:
    """A folder in COCO's layout (``annotations/instances_train*.json`` and ``instances_val*.json``, or those files
    in the folder itself), else ``None``."""
    for annotations_folder in (folder / "annotations", folder):
        train = sorted(annotations_folder.glob(f"{_PREFIX}train*.json"))
        val = sorted(annotations_folder.glob(f"{_PREFIX}val*.json"))
        if train and val:
            return DetectionYaml(yaml_path=train[0].resolve(), root=folder.resolve(), names=coco_names(train[0]),
                                 splits={"train": [path.resolve() for path in train], "val": [path.resolve() for path in val]})
        if train or val:
            raise DatasetError(f"{annotations_folder}: COCO layout needs both instances_train*.json and instances_val*.json; "
                               f"found only {(train or val)[0].name}. Add the other, or pass data= a dataset YAML naming both")
    return None
