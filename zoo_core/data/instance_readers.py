"""Reading instance-segmentation data into ``InstanceRecord`` s: YOLO segmentation labels or COCO instance JSON.

``index_instance_split(entries, names)`` takes the entries of one split as ``DetectTask.prepare`` puts them
in a ``DataSpec``: image folders or ``.txt`` image lists of a YOLO-seg dataset, or COCO instance JSON
files (``zoo_core.data.coco_format``, dispatched by the ``.json`` suffix).

YOLO segmentation labels (Ultralytics' convention) are found as detection labels are
(``zoo_core.data.yolo_format.label_path_for``: ``/images/`` -> ``/labels/``, suffix ``.txt``). Each line is one
object: ``class x1 y1 x2 y2 ... xk yk``, k >= 3 points normalised to [0, 1]; its box is the extent of the
polygon. (Ultralytics' format holds one polygon per line: its COCO converter joins an object's pieces into
one ring, so a line is one object however many pieces it had.) A malformed line (an odd number of
coordinates, fewer than 3 points, a class outside ``names``, a coordinate outside [0, 1]) and a box-only line
``class cx cy w h`` (a segmentation dataset needs polygons) are skipped and reported with their reason.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np

from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.images import images_from_entry, refuse_shared_annotations, usable_images
from zoo_core.data.instances import InstanceRecord, InstanceShape, polygons_box
from zoo_core.data.yolo_format import label_path_for

__all__ = ["COCO_SUFFIX", "parse_polygon_line", "read_polygon_labels", "index_instance_split"]

COCO_SUFFIX = ".json"
_BOX_ONLY_FIELDS = 5


def parse_polygon_line(fields: list[str], num_classes: int) -> tuple[int, np.ndarray] | str:
    """One YOLO-seg label line -> ``(class id, k×2 float32 polygon)`` (normalised), or the reason it is refused."""
    if len(fields) == _BOX_ONLY_FIELDS:
        return ("a box line (class cx cy w h), but instance segmentation needs each object's polygon "
                "(class x1 y1 x2 y2 x3 y3 ...): convert the labels to polygons, or train task=detect on boxes")
    if len(fields) % 2 == 0:
        return f"{len(fields)} fields: a class and an odd number of coordinates; expected class x1 y1 ... xk yk"
    if len(fields) < 7:
        return f"{(len(fields) - 1) // 2} points; a polygon needs at least 3 (class x1 y1 x2 y2 x3 y3)"
    try:
        values = [float(field) for field in fields]
    except ValueError:
        return f"not a number in {' '.join(fields[:8])!r}"
    if not all(math.isfinite(value) for value in values):
        return "non-finite value in the line"
    if values[0] != int(values[0]):
        return f"class id {fields[0]!r} is not an integer"
    class_id = int(values[0])
    if not 0 <= class_id < num_classes:
        return f"class id {class_id} is outside names (0..{num_classes - 1})"
    points = np.asarray(values[1:], dtype=np.float32).reshape(-1, 2)
    outside = points[(points < 0.0) | (points > 1.0)]
    if len(outside):
        shown = ", ".join(f"{float(value):g}" for value in outside[:4])
        return f"coordinates outside [0, 1] ({shown}); polygon points must be normalised to the image"
    return class_id, points


def read_polygon_labels(label_path: Path, num_classes: int, report: ProblemReport) -> tuple[np.ndarray, list[InstanceShape]] | None:
    """The usable objects of a YOLO-seg label file: boxes (n×5 ``class, x1, y1, x2, y2``) and their shapes.

    Every refused line is reported with its line number; ``None`` if the file cannot be read.
    """
    try:
        text = label_path.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark is not part of a class id
    except (OSError, UnicodeDecodeError) as error:
        report.add(label_path, f"unreadable label file ({type(error).__name__}: {error}); its image is skipped")
        return None
    rows, shapes = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        parsed = parse_polygon_line(fields, num_classes)
        if isinstance(parsed, str):
            report.add(label_path, f"{parsed}; line skipped", line=number)
            continue
        class_id, polygon = parsed
        x1, y1, x2, y2 = polygons_box([polygon])
        if x2 <= x1 or y2 <= y1:
            report.add(label_path, "polygon of zero width or height; line skipped", line=number)
            continue
        rows.append(np.array([class_id, x1, y1, x2, y2], dtype=np.float32))
        shapes.append(InstanceShape(polygons=(polygon,)))
    boxes = np.stack(rows) if rows else np.zeros((0, 5), dtype=np.float32)
    return boxes, shapes


def _index_yolo_entries(entries: list[Path], names: Mapping[int, str], report: ProblemReport) -> list[InstanceRecord]:
    candidates: list[Path] = []
    for entry in entries:
        candidates.extend(images_from_entry(entry, report))
    usable = usable_images(candidates, report)
    refuse_shared_annotations([(image_path, label_path_for(image_path)) for image_path, _ in usable], "label file")
    records = []
    for image_path, (height, width) in usable:
        label_path = label_path_for(image_path)
        boxes, shapes = np.zeros((0, 5), dtype=np.float32), []
        if label_path.is_file():
            read = read_polygon_labels(label_path, len(names), report)
            if read is None:
                continue
            boxes, shapes = read
        records.append(InstanceRecord(image=image_path, height=height, width=width, labels=boxes, shapes=shapes,
                                      crowd=np.zeros(len(boxes), dtype=bool)))
    return records


def index_instance_split(entries: list[Path], names: Mapping[int, str], what: str = "instance split",
                         report: ProblemReport | None = None) -> list[InstanceRecord]:
    """Every usable image of ``entries`` with its objects (boxes, shapes, crowd flags); problems are reported and skipped.

    A ``.json`` entry is a COCO instance file (``zoo_core.data.coco_format.read_coco_instances``); any other
    entry is an image folder, image list or image of a YOLO-seg dataset. ``report`` (default: a new one)
    collects the problems, so the caller can say how many lines were skipped and why. An image without
    labels is a background image. Raises ``DatasetError`` when no usable image is left.
    """
    report = report if report is not None else ProblemReport(what)
    coco_entries = [entry for entry in entries if entry.suffix.lower() == COCO_SUFFIX]
    yolo_entries = [entry for entry in entries if entry.suffix.lower() != COCO_SUFFIX]
    records: list[InstanceRecord] = []
    if yolo_entries:
        records.extend(_index_yolo_entries(yolo_entries, names, report))
    if coco_entries:
        from zoo_core.data.coco_format import read_coco_instances

        for entry in coco_entries:
            records.extend(read_coco_instances(entry, names, report).records)
    report.finish()
    if not records:
        shown = ", ".join(str(entry) for entry in entries)
        raise DatasetError(f"{what}: no usable image in {shown}; see the warnings above for each skipped file")
    return records
