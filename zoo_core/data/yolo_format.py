"""The YOLO detection format (the Ultralytics convention).

A dataset YAML names the root (``path``), the splits (``train``, ``val``, optional ``test``: image
folders, ``.txt`` lists of images, or lists of either) and the classes (``names``, a list or a
mapping ``{0: name}``). The label file of an image is found by replacing the last ``/images/``
component of its path with ``/labels/`` and the suffix with ``.txt``, so two images that differ only
in their suffix (``a.jpg`` and ``a.png``) would share ``a.txt``: that is a ``DatasetError`` naming
both (``refuse_shared_annotations``), never one image trained on the other's boxes. Label files may
start with a UTF-8 byte-order mark and end lines with CRLF. Each line is
``class cx cy w h`` normalised to [0, 1] (a segment polygon ``class x1 y1 x2 y2 ...`` is read as
its bounding box). An image without a label file, or with an empty one, is a background image.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from zoo_core.data.dataset_yaml import dataset_root, parse_names, read_dataset_yaml, split_paths
from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.images import images_from_entry, refuse_shared_annotations, usable_images

__all__ = ["DetectionRecord", "DetectionYaml", "label_path_for", "read_labels", "read_detection_yaml", "index_detection_split"]


@dataclass
class DetectionRecord:
    """One usable image and its boxes: ``labels`` is n×5 float32 ``class, x1, y1, x2, y2`` (normalised)."""

    image: Path
    height: int
    width: int
    labels: np.ndarray


@dataclass
class DetectionYaml:
    """What a detection dataset YAML declares, resolved to paths."""

    yaml_path: Path
    root: Path
    names: dict[int, str]
    splits: dict[str, list[Path]]  # "train", "val" and, when given, "test"


def label_path_for(image_path: Path) -> Path:
    """The label file of ``image_path``: the last ``/images/`` replaced by ``/labels/``, suffix ``.txt``."""
    text = str(image_path)
    images_part, labels_part = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    if images_part in text:
        text = labels_part.join(text.rsplit(images_part, 1))
    return Path(text).with_suffix(".txt")


def _parse_line(fields: list[str], num_classes: int) -> tuple[np.ndarray | None, str]:
    """One label line -> ``[class, x1, y1, x2, y2]`` (normalised), or ``None`` and the reason."""
    if len(fields) != 5 and (len(fields) < 7 or len(fields) % 2 == 0):
        return None, f"{len(fields)} fields; expected 5 (class cx cy w h) or a polygon (class x1 y1 x2 y2 x3 y3 ...)"
    try:
        values = [float(field) for field in fields]
    except ValueError:
        return None, f"not a number in {' '.join(fields)!r}"
    if not all(math.isfinite(value) for value in values):
        return None, f"non-finite value in {' '.join(fields)!r}"
    class_value, coordinates = values[0], values[1:]
    if class_value != int(class_value):
        return None, f"class id {fields[0]!r} is not an integer"
    class_id = int(class_value)
    if not 0 <= class_id < num_classes:
        return None, f"class id {class_id} is outside names (0..{num_classes - 1})"
    outside = [value for value in coordinates if not 0.0 <= value <= 1.0]
    if outside:
        return None, f"coordinates outside [0, 1] ({', '.join(f'{value:g}' for value in outside[:4])}); labels must be normalised"
    if len(fields) == 5:
        centre_x, centre_y, width, height = coordinates
        x1, y1, x2, y2 = centre_x - width / 2, centre_y - height / 2, centre_x + width / 2, centre_y + height / 2
    else:
        xs, ys = coordinates[0::2], coordinates[1::2]
        x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
    x1, y1, x2, y2 = max(x1, 0.0), max(y1, 0.0), min(x2, 1.0), min(y2, 1.0)
    if x2 <= x1 or y2 <= y1:
        return None, "box of zero width or height"
    return np.array([class_id, x1, y1, x2, y2], dtype=np.float32), ""


def read_labels(label_path: Path, num_classes: int, report: ProblemReport) -> np.ndarray | None:
    """The usable boxes of ``label_path`` (n×5), every bad line reported; ``None`` if the file is unreadable."""
    try:
        # utf-8-sig: a byte-order mark (Windows tools write one) would otherwise glue itself to the first class
        # id and drop the file's first box. CRLF line ends are split by splitlines() below.
        text = label_path.read_text(encoding="utf-8-sig")
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
    return np.stack(rows) if rows else np.zeros((0, 5), dtype=np.float32)


def read_detection_yaml(yaml_path: Path) -> DetectionYaml:
    """Parse a detection dataset YAML; ``DatasetError`` naming the file and key for anything missing."""
    content = read_dataset_yaml(yaml_path)
    root = dataset_root(yaml_path, content)
    names = parse_names(content.get("names"), str(yaml_path), content.get("nc"))
    splits = {"train": split_paths(yaml_path, content, "train", root), "val": split_paths(yaml_path, content, "val", root)}
    test = split_paths(yaml_path, content, "test", root, required=False)
    if test is not None:
        splits["test"] = test
    return DetectionYaml(yaml_path=yaml_path, root=root, names=names, splits=splits)  # type: ignore[arg-type]


def index_detection_split(entries: list[Path], names: Mapping[int, str], what: str = "detection split",
                          report: ProblemReport | None = None) -> list[DetectionRecord]:
    """Every usable image of ``entries`` with its boxes; problems are warned about and skipped.

    ``report`` (default: a new one) collects the problems, so a caller can say afterwards how many label
    lines were skipped and why. Raises ``DatasetError`` when no usable image is left.
    """
    report = report if report is not None else ProblemReport(what)
    candidates: list[Path] = []
    for entry in entries:
        candidates.extend(images_from_entry(entry, report))
    records = []
    usable = usable_images(candidates, report)
    refuse_shared_annotations([(image_path, label_path_for(image_path)) for image_path, _ in usable], "label file")
    for image_path, (height, width) in usable:
        label_path = label_path_for(image_path)
        labels: Any = np.zeros((0, 5), dtype=np.float32)
        if label_path.is_file():
            labels = read_labels(label_path, len(names), report)
            if labels is None:
                continue
        records.append(DetectionRecord(image=image_path, height=height, width=width, labels=labels))
    report.finish()
    if not records:
        shown = ", ".join(str(entry) for entry in entries)
        raise DatasetError(f"{what}: no usable image in {shown}; see the warnings above for each skipped file")
    return records
