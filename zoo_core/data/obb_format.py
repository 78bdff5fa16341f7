"""Oriented-box data: Ultralytics' YOLO OBB labels, and DOTA's text format converted to them.

YOLO OBB (what the ``obb`` task reads): the dataset YAML and folder layout of the detection format
(``zoo_core.data.yolo_format``: ``path``/``train``/``val``/``names``, ``labels/`` beside ``images/``);
each label line is ``class x1 y1 x2 y2 x3 y3 x4 y4``, the four corners of the object normalised to
[0, 1] by the image's width and height, in loop order (around the box). Any four corners are read
as the minimum-area rectangle around them (OpenCV's ``minAreaRect``, as Ultralytics reads them), so
hand-drawn quadrilaterals become rotated rectangles.

DOTA (Xia et al., CVPR 2018): ``labelTxt/<image>.txt`` beside ``images/``, optional header lines
(``imagesource:...``, ``gsd:...``), then ``x1 y1 x2 y2 x3 y3 x4 y4 class difficult`` in pixels.
``convert_dota(source, target)`` writes a YOLO OBB dataset from a DOTA folder (``zoo convert-dota``):
corners divided by the image's size and clipped to [0, 1], class names numbered in sorted order
unless given, ``difficult`` objects kept unless ``skip_difficult``; images are hard-linked (copied
where links fail), never moved: the source is not modified.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.images import IMAGE_SUFFIXES, images_from_entry, refuse_shared_annotations, usable_images
from zoo_core.data.yolo_format import label_path_for

__all__ = ["OBBRecord", "read_obb_labels", "index_obb_split", "quadrilateral_to_xywhr", "convert_dota", "DotaConversion"]


@dataclass
class OBBRecord:
    """One usable image and its oriented boxes: ``labels`` is n×9 float32 ``class, x1, y1, ..., x4, y4`` (normalised)."""

    image: Path
    height: int
    width: int
    labels: np.ndarray


def quadrilateral_to_xywhr(corners: np.ndarray) -> np.ndarray:
    """``n×4×2`` corners (pixels) as the ``n×5`` minimum-area rotated rectangles ``cx, cy, w, h, angle`` (canonical:
    long side first, angle in ``[-pi/2, pi/2)``, radians)."""
    import cv2

    rows = []
    for quad in np.asarray(corners, dtype=np.float32).reshape(-1, 4, 2):
        (centre_x, centre_y), (width, height), degrees = cv2.minAreaRect(quad)
        rows.append((centre_x, centre_y, width, height, math.radians(degrees)))
    boxes = np.asarray(rows, dtype=np.float64).reshape(-1, 5)
    swap = boxes[:, 3] > boxes[:, 2]
    boxes[swap, 2], boxes[swap, 3] = boxes[swap, 3].copy(), boxes[swap, 2].copy()
    boxes[swap, 4] += math.pi / 2
    boxes[:, 4] = np.remainder(boxes[:, 4] + math.pi / 2, math.pi) - math.pi / 2
    return boxes.astype(np.float32)


def _parse_line(fields: list[str], num_classes: int) -> tuple[np.ndarray | None, str]:
    if len(fields) != 9:
        return None, f"{len(fields)} fields; expected 9 (class x1 y1 x2 y2 x3 y3 x4 y4, normalised corners)"
    try:
        values = [float(field) for field in fields]
    except ValueError:
        return None, f"not a number in {' '.join(fields)!r}"
    if not all(math.isfinite(value) for value in values):
        return None, f"non-finite value in {' '.join(fields)!r}"
    if values[0] != int(values[0]):
        return None, f"class id {fields[0]!r} is not an integer"
    if not 0 <= int(values[0]) < num_classes:
        return None, f"class id {int(values[0])} is outside names (0..{num_classes - 1})"
    outside = [value for value in values[1:] if not 0.0 <= value <= 1.0]
    if outside:
        return None, (f"corners outside [0, 1] ({', '.join(f'{value:g}' for value in outside[:4])}); OBB labels are "
                      "normalised corners (zoo convert-dota clips DOTA's pixel corners for you)")
    corners = np.asarray(values[1:], dtype=np.float64).reshape(4, 2)
    x, y = corners[:, 0], corners[:, 1]
    if abs(0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))) <= 0.0:
        return None, "a box of zero area (its four corners are on one line)"
    return np.asarray(values, dtype=np.float32), ""


def read_obb_labels(label_path: Path, num_classes: int, report: ProblemReport) -> np.ndarray | None:
    """The usable oriented boxes of ``label_path`` (n×9), each bad line reported with its number; ``None`` if unreadable."""
    try:
        text = label_path.read_text(encoding="utf-8-sig")  # a byte-order mark would glue itself to the first class id
    except (OSError, UnicodeDecodeError) as error:
        report.add(label_path, f"unreadable label file ({type(error).__name__}: {error}); its image is skipped")
        return None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        row, problem = _parse_line(fields, num_classes)
        if row is None:
            report.add(label_path, f"{problem}; line skipped", line=number)
        else:
            rows.append(row)
    return np.stack(rows) if rows else np.zeros((0, 9), dtype=np.float32)


def index_obb_split(entries: list[Path], names: Mapping[int, str], what: str = "obb split",
                    report: ProblemReport | None = None) -> list[OBBRecord]:
    """Every usable image of ``entries`` with its oriented boxes; problems are warned about and skipped."""
    report = report if report is not None else ProblemReport(what)
    candidates: list[Path] = []
    for entry in entries:
        candidates.extend(images_from_entry(entry, report))
    usable = usable_images(candidates, report)
    refuse_shared_annotations([(image_path, label_path_for(image_path)) for image_path, _ in usable], "label file")
    records = []
    for image_path, (height, width) in usable:
        label_path = label_path_for(image_path)
        labels: np.ndarray | None = np.zeros((0, 9), dtype=np.float32)
        if label_path.is_file():
            labels = read_obb_labels(label_path, len(names), report)
            if labels is None:
                continue
        records.append(OBBRecord(image=image_path, height=height, width=width, labels=labels))
    report.finish()
    if not records:
        raise DatasetError(f"{what}: no usable image in {', '.join(map(str, entries))}; see the warnings above for each skipped file")
    return records


@dataclass
class DotaConversion:
    """What ``convert_dota`` wrote: the dataset YAML, the class names, and counts per split."""

    yaml_path: Path
    names: dict[int, str]
    images: dict[str, int]
    objects: dict[str, int]
    skipped_lines: int


def _dota_objects(label_path: Path, report: ProblemReport) -> list[tuple[list[float], str, bool]]:
    """The objects of one DOTA label file: corners (pixels), class name, difficult flag; header and bad lines skipped."""
    objects = []
    for number, line in enumerate(label_path.read_text(encoding="utf-8-sig").splitlines(), start=1):
        fields = line.split()
        if not fields or fields[0].startswith(("imagesource:", "gsd:")):
            continue
        if len(fields) not in (9, 10):
            report.add(label_path, f"{len(fields)} fields; DOTA lines are 'x1 y1 x2 y2 x3 y3 x4 y4 class difficult'; line skipped",
                       line=number)
            continue
        try:
            corners = [float(value) for value in fields[:8]]
        except ValueError:
            report.add(label_path, f"not a number in {' '.join(fields[:8])!r}; line skipped", line=number)
            continue
        if not all(math.isfinite(value) for value in corners):
            report.add(label_path, "non-finite corner; line skipped", line=number)
            continue
        objects.append((corners, fields[8], len(fields) == 10 and fields[9] not in ("0", "0.0")))
    return objects


def _split_folders(source: Path) -> dict[str, Path]:
    """DOTA's splits under ``source``: ``train``/``val``(/``test``) folders each holding images/ and labelTxt/."""
    splits = {split: source / split for split in ("train", "val", "test")
              if (source / split / "images").is_dir() and (source / split / "labelTxt").is_dir()}
    if "train" not in splits or "val" not in splits:
        raise DatasetError(
            f"{source}: not a DOTA folder; zoo convert-dota expects {source}/train/images, {source}/train/labelTxt, "
            f"{source}/val/images and {source}/val/labelTxt (DOTA's own layout; test/ is optional)"
        )
    return splits


def convert_dota(source: str | Path, target: str | Path, names: Sequence[str] | None = None,
                 skip_difficult: bool = False) -> DotaConversion:
    """Write the DOTA dataset at ``source`` as a YOLO OBB dataset at ``target`` (a new or empty folder).

    ``names``: the class order (default: every class seen, sorted); an object of a class not in ``names`` is
    reported and skipped. Returns what was written; ``target/data.yaml`` trains with ``zoo train ... data=``.
    """
    from PIL import Image

    source, target = Path(source).expanduser(), Path(target).expanduser()
    splits = _split_folders(source)
    if target.exists() and any(target.iterdir()):
        raise DatasetError(f"{target} exists and is not empty; give convert-dota a new folder to write into")
    report = ProblemReport(f"DOTA {source}")
    parsed: dict[str, list[tuple[Path, tuple[int, int], list[tuple[list[float], str, bool]]]]] = {}
    seen: set[str] = set()
    for split, folder in splits.items():
        items = []
        for image_path in sorted(path for path in (folder / "images").iterdir() if path.suffix.lower() in IMAGE_SUFFIXES):
            label_path = folder / "labelTxt" / f"{image_path.stem}.txt"
            objects = _dota_objects(label_path, report) if label_path.is_file() else []
            with Image.open(image_path) as image:
                width, height = image.size
            items.append((image_path, (width, height), objects))
            seen.update(name for _, name, _ in objects)
        parsed[split] = items
    class_names = list(names) if names is not None else sorted(seen)
    if not class_names:
        raise DatasetError(f"{source}: no object in any labelTxt file; nothing to train on")
    index_of = {name: index for index, name in enumerate(class_names)}
    images_written: dict[str, int] = {}
    objects_written: dict[str, int] = {}
    for split, items in parsed.items():
        (target / "images" / split).mkdir(parents=True, exist_ok=True)
        (target / "labels" / split).mkdir(parents=True, exist_ok=True)
        count = 0
        for image_path, (width, height), objects in items:
            copy = target / "images" / split / image_path.name
            try:
                os.link(image_path, copy)
            except OSError:
                shutil.copyfile(image_path, copy)
            lines = []
            for corners, name, difficult in objects:
                if difficult and skip_difficult:
                    continue
                if name not in index_of:
                    report.add(splits[split] / "labelTxt" / f"{image_path.stem}.txt",
                               f"class {name!r} is not in names ({', '.join(class_names)}); object skipped")
                    continue
                scaled = np.asarray(corners, dtype=np.float64).reshape(4, 2) / np.array([width, height])
                values = np.clip(scaled, 0.0, 1.0).reshape(-1)
                lines.append(f"{index_of[name]} " + " ".join(f"{value:.6f}" for value in values))
            (target / "labels" / split / f"{image_path.stem}.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
            count += len(lines)
        images_written[split] = len(items)
        objects_written[split] = count
    import yaml

    content = {"path": ".", **{split: f"images/{split}" for split in parsed}, "names": dict(enumerate(class_names))}
    yaml_path = target / "data.yaml"
    yaml_path.write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
    skipped = report.skipped_lines
    report.finish()
    return DotaConversion(yaml_path=yaml_path, names=dict(enumerate(class_names)), images=images_written,
                          objects=objects_written, skipped_lines=skipped)
