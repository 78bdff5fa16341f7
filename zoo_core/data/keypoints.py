"""Keypoint (pose) data: YOLO pose labels and COCO keypoint JSON read into ``PoseRecord`` s.

A pose dataset YAML is a detection dataset YAML (``zoo_core.data.yolo_format``) plus the keypoint layout
Ultralytics' pose datasets declare:

- ``kpt_shape: [K, 2]`` or ``[K, 3]``: K keypoints per object, each ``x y`` or ``x y v`` in a label line;
- ``flip_idx``: the keypoint that keypoint ``i`` becomes when the image is flipped left-right (COCO's
  ``[0, 2, 1, 4, 3, ...]`` swaps each left point with its right twin). Without it (``PoseLayout.flip_idx`` None,
  K > 1) the task does not flip training images, since it cannot know which points trade sides;
- optional ``kpt_sigmas`` (or ``sigmas``): the per-keypoint OKS constants; default COCO's 17 values when K is 17,
  else uniform ``1/K`` each, Ultralytics' fallback for other layouts (``np.ones(K) / K``);
- optional ``skeleton``: pairs of keypoint indices (0-based) to draw joined.

A YOLO pose label line is ``class cx cy w h`` then K × ``x y`` (or ``x y v``), all normalised to [0, 1];
``v`` is 0 (not labelled), 1 (labelled, occluded) or 2 (visible). With ``kpt_shape[1] == 2`` a point at
exactly ``0 0`` is not labelled (Ultralytics' convention) and every other point is visible. A line with the
wrong number of fields, a class outside ``names``, a coordinate outside [0, 1] or a visibility other than 0, 1,
2 is skipped and reported with its line number.

COCO keypoint JSON (``person_keypoints_*.json``): the instance files ``zoo_core.data.coco_format`` reads, whose
annotations carry ``keypoints`` (``x1, y1, v1, ...`` in pixels) and whose categories name their ``keypoints``
(K) and a 1-based ``skeleton``; a dataset YAML may add ``flip_idx`` and ``kpt_sigmas``. With 17 keypoints
and no ``flip_idx`` COCO's own left/right pairs are used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.images import images_from_entry, refuse_shared_annotations, usable_images
from zoo_core.data.yolo_format import DetectionRecord, label_path_for
from zoo_core.errors import excerpt

__all__ = [
    "COCO_KEYPOINT_SIGMAS", "COCO_FLIP_INDEX", "COCO_SKELETON", "PoseLayout", "PoseRecord", "parse_pose_layout",
    "coco_pose_layout", "parse_pose_line", "read_pose_labels", "index_pose_split", "OKS_AREA_FROM_BOX",
]

#: COCO's per-keypoint OKS constants (pycocotools ``COCOeval``'s ``kpt_oks_sigmas``, the 17 person keypoints).
COCO_KEYPOINT_SIGMAS = (0.026, 0.025, 0.025, 0.035, 0.035, 0.079, 0.079, 0.072, 0.072, 0.062, 0.062, 0.107, 0.107,
                        0.087, 0.087, 0.089, 0.089)
#: COCO's left/right pairs: nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles (Ultralytics' coco-pose.yaml).
COCO_FLIP_INDEX = (0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15)
#: COCO's person skeleton (its categories' ``skeleton``, made 0-based).
COCO_SKELETON = ((15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8), (7, 9),
                 (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6))
#: A YOLO label has no segment area; the OKS scale is the box area times this (Ultralytics' pose validator).
OKS_AREA_FROM_BOX = 0.53


@dataclass(frozen=True)
class PoseLayout:
    """The keypoint layout of a dataset: ``count`` points of ``dims`` values (2: x y, 3: x y v), the flip map
    (``None``: not given, so a horizontal flip cannot be applied), the OKS ``sigmas`` and the drawing ``skeleton``."""

    count: int
    dims: int
    flip_idx: tuple[int, ...] | None
    sigmas: tuple[float, ...]
    skeleton: tuple[tuple[int, int], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Plain data (what a ``DataSpec.extra`` and a weights file's metadata carry)."""
        return {"kpt_shape": [self.count, self.dims], "flip_idx": None if self.flip_idx is None else list(self.flip_idx),
                "kpt_sigmas": list(self.sigmas), "skeleton": [list(pair) for pair in self.skeleton]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PoseLayout":
        """The inverse of ``as_dict``."""
        count, dims = data["kpt_shape"]
        flip = data.get("flip_idx")
        return cls(int(count), int(dims), None if flip is None else tuple(int(i) for i in flip),
                   tuple(float(s) for s in data["kpt_sigmas"]), tuple((int(a), int(b)) for a, b in data.get("skeleton") or ()))


def default_sigmas(count: int) -> tuple[float, ...]:
    """COCO's 17 sigmas for 17 keypoints, else ``1/K`` each (Ultralytics' fallback for other layouts)."""
    return COCO_KEYPOINT_SIGMAS if count == len(COCO_KEYPOINT_SIGMAS) else tuple([1.0 / count] * count)


def _index_list(value: Any, count: int, key: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) != count or not all(
            isinstance(item, int) and not isinstance(item, bool) and 0 <= item < count for item in value):
        raise DatasetError(f"{where}: {key} must list {count} keypoint indices in 0..{count - 1} (one per keypoint), "
                           f"got {excerpt(value)}")
    return tuple(value)


def parse_pose_layout(content: Mapping[str, Any], where: str, count: int | None = None,
                      skeleton: Any = None) -> PoseLayout:
    """The ``PoseLayout`` a dataset YAML declares (``count``: the K a COCO file gives when the YAML has no
    ``kpt_shape``; ``skeleton``: a COCO file's 0-based skeleton); ``DatasetError`` naming the key otherwise."""
    shape = content.get("kpt_shape")
    if shape is None:
        if count is None:
            raise DatasetError(f"{where}: a pose dataset needs kpt_shape: [K, 2] or [K, 3] (K keypoints of x y or x y v "
                               "per object, as Ultralytics' pose datasets declare)")
        shape = [count, 3]
    if (not isinstance(shape, (list, tuple)) or len(shape) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in shape)
            or shape[0] < 1 or shape[1] not in (2, 3)):
        raise DatasetError(f"{where}: kpt_shape must be [K, 2] or [K, 3] with K >= 1, got {excerpt(shape)}")
    keypoints, dims = int(shape[0]), int(shape[1])
    if count is not None and count != keypoints:
        raise DatasetError(f"{where}: kpt_shape says {keypoints} keypoints but the COCO file's categories name {count}")
    flip = content.get("flip_idx")
    flip_idx = _index_list(flip, keypoints, "flip_idx", where) if flip is not None else (
        COCO_FLIP_INDEX if keypoints == len(COCO_FLIP_INDEX) and count is not None else None)
    if keypoints == 1 and flip_idx is None:
        flip_idx = (0,)  # one point has no side
    sigmas_value = content.get("kpt_sigmas", content.get("sigmas"))
    if sigmas_value is None:
        sigmas = default_sigmas(keypoints)
    else:
        if (not isinstance(sigmas_value, (list, tuple)) or len(sigmas_value) != keypoints
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in sigmas_value)):
            raise DatasetError(f"{where}: kpt_sigmas must list {keypoints} positive OKS constants, got {excerpt(sigmas_value)}")
        sigmas = tuple(float(v) for v in sigmas_value)
    pairs = content.get("skeleton", skeleton)
    edges: list[tuple[int, int]] = []
    if pairs is not None:
        if not isinstance(pairs, (list, tuple)):
            raise DatasetError(f"{where}: skeleton must be a list of [i, j] keypoint index pairs, got {excerpt(pairs)}")
        for pair in pairs:
            if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < keypoints for v in pair)):
                raise DatasetError(f"{where}: skeleton pair {excerpt(pair)} must be two keypoint indices in 0..{keypoints - 1}")
            edges.append((int(pair[0]), int(pair[1])))
    return PoseLayout(keypoints, dims, flip_idx, sigmas, tuple(edges))


def coco_pose_layout(json_path: Path, content: Mapping[str, Any], where: str) -> PoseLayout:
    """The layout of a COCO keypoint file: K from its first category's ``keypoints`` names, its 1-based
    ``skeleton`` made 0-based; ``content`` (the dataset YAML, possibly empty) may add ``flip_idx`` and sigmas."""
    from zoo_core.data.coco_format import load_coco_json

    raw = load_coco_json(json_path)
    categories = raw.get("categories") or []
    first = categories[0] if categories and isinstance(categories[0], dict) else {}
    names = first.get("keypoints")
    if not isinstance(names, list) or not names:
        if content.get("kpt_shape") is None:
            raise DatasetError(f"{json_path}: its categories name no 'keypoints', so the keypoint count is unknown; "
                               "use COCO keypoint annotations (person_keypoints_*.json) or give kpt_shape in the dataset YAML")
        return parse_pose_layout(content, where)
    skeleton = first.get("skeleton")
    zero_based = None
    if isinstance(skeleton, list) and all(isinstance(p, list) and len(p) == 2 and all(isinstance(v, int) for v in p) for p in skeleton):
        zero_based = [[a - 1, b - 1] for a, b in skeleton]
    return parse_pose_layout(content, where, count=len(names), skeleton=zero_based)


@dataclass
class PoseRecord(DetectionRecord):
    """One usable image, its boxes (``labels`` n×5 ``class, x1, y1, x2, y2`` normalised), their keypoints
    (``keypoints`` n×K×3 float32: x, y normalised, visibility 0/1/2), ``crowd`` flags (COCO's ``iscrowd``: left
    out of training, ignored by the metric) and ``areas`` (n, the OKS scale in pixels; NaN: from the box)."""

    keypoints: np.ndarray = field(default_factory=lambda: np.zeros((0, 1, 3), dtype=np.float32))
    crowd: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    areas: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))

    def __post_init__(self) -> None:
        if not (len(self.keypoints) == len(self.labels) == len(self.crowd) == len(self.areas)):
            raise ValueError(f"{self.image}: {len(self.labels)} boxes but {len(self.keypoints)} keypoint sets, "
                             f"{len(self.crowd)} crowd flags and {len(self.areas)} areas")


def parse_pose_line(fields: list[str], num_classes: int, layout: PoseLayout) -> tuple[np.ndarray, np.ndarray] | str:
    """One YOLO pose label line -> ``(box row [class, x1, y1, x2, y2], K×3 keypoints)`` (normalised), or the reason."""
    expected = 5 + layout.count * layout.dims
    if len(fields) != expected:
        return (f"{len(fields)} fields; kpt_shape [{layout.count}, {layout.dims}] needs {expected} "
                f"(class cx cy w h, then {layout.count} keypoints of {'x y' if layout.dims == 2 else 'x y v'})")
    try:
        values = [float(item) for item in fields]
    except ValueError:
        return f"not a number in {' '.join(fields[:8])!r}"
    if not all(math.isfinite(value) for value in values):
        return "non-finite value in the line"
    if values[0] != int(values[0]):
        return f"class id {fields[0]!r} is not an integer"
    class_id = int(values[0])
    if not 0 <= class_id < num_classes:
        return f"class id {class_id} is outside names (0..{num_classes - 1})"
    centre_x, centre_y, width, height = values[1:5]
    points = np.asarray(values[5:], dtype=np.float32).reshape(layout.count, layout.dims)
    if layout.dims == 3:
        if np.any(~np.isin(points[:, 2], (0.0, 1.0, 2.0))):
            return "a keypoint visibility other than 0, 1 or 2"
    else:
        labelled = ~((points[:, 0] == 0) & (points[:, 1] == 0))
        points = np.concatenate([points, np.where(labelled, 2.0, 0.0).astype(np.float32)[:, None]], axis=1)
    coordinates = np.asarray([centre_x, centre_y, width, height, *points[:, :2].reshape(-1)])
    outside = coordinates[(coordinates < 0.0) | (coordinates > 1.0)]
    if len(outside):
        return f"coordinates outside [0, 1] ({', '.join(f'{float(v):g}' for v in outside[:4])}); labels must be normalised"
    x1, y1 = max(centre_x - width / 2, 0.0), max(centre_y - height / 2, 0.0)
    x2, y2 = min(centre_x + width / 2, 1.0), min(centre_y + height / 2, 1.0)
    if x2 <= x1 or y2 <= y1:
        return "box of zero width or height"
    points[points[:, 2] == 0, :2] = 0.0
    return np.array([class_id, x1, y1, x2, y2], dtype=np.float32), points


def read_pose_labels(label_path: Path, num_classes: int, layout: PoseLayout,
                     report: ProblemReport) -> tuple[np.ndarray, np.ndarray] | None:
    """The usable objects of a YOLO pose label file: boxes (n×5) and keypoints (n×K×3); ``None`` if unreadable."""
    try:
        text = label_path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        report.add(label_path, f"unreadable label file ({type(error).__name__}: {error}); its image is skipped")
        return None
    rows, points = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        parsed = parse_pose_line(fields, num_classes, layout)
        if isinstance(parsed, str):
            report.add(label_path, f"{parsed}; line skipped", line=number)
            continue
        rows.append(parsed[0])
        points.append(parsed[1])
    boxes = np.stack(rows) if rows else np.zeros((0, 5), dtype=np.float32)
    keypoints = np.stack(points) if points else np.zeros((0, layout.count, 3), dtype=np.float32)
    return boxes, keypoints


def index_pose_split(entries: list[Path], names: Mapping[int, str], layout: PoseLayout, what: str = "pose split",
                     report: ProblemReport | None = None) -> list[PoseRecord]:
    """Every usable image of ``entries`` with its objects and keypoints; problems are reported and skipped.

    A ``.json`` entry is a COCO keypoint file; any other an image folder, image list or image of a YOLO pose
    dataset. Raises ``DatasetError`` when no usable image is left.
    """
    report = report if report is not None else ProblemReport(what)
    records: list[PoseRecord] = []
    yolo_entries = [entry for entry in entries if entry.suffix.lower() != ".json"]
    if yolo_entries:
        candidates: list[Path] = []
        for entry in yolo_entries:
            candidates.extend(images_from_entry(entry, report))
        usable = usable_images(candidates, report)
        refuse_shared_annotations([(image_path, label_path_for(image_path)) for image_path, _ in usable], "label file")
        for image_path, (height, width) in usable:
            label_path = label_path_for(image_path)
            boxes, points = np.zeros((0, 5), dtype=np.float32), np.zeros((0, layout.count, 3), dtype=np.float32)
            if label_path.is_file():
                read = read_pose_labels(label_path, len(names), layout, report)
                if read is None:
                    continue
                boxes, points = read
            records.append(PoseRecord(image=image_path, height=height, width=width, labels=boxes, keypoints=points,
                                      crowd=np.zeros(len(boxes), dtype=bool), areas=np.full(len(boxes), np.nan)))
    for entry in (entry for entry in entries if entry.suffix.lower() == ".json"):
        from zoo_core.data.coco_format import read_coco_instances

        read = read_coco_instances(entry, names, report, need_shapes=False, keypoints=layout.count)
        for record, points, areas in zip(read.records, read.keypoints or [], read.areas or []):
            records.append(PoseRecord(image=record.image, height=record.height, width=record.width, labels=record.labels,
                                      keypoints=points, crowd=record.crowd, areas=areas))
    report.finish()
    if not records:
        shown = ", ".join(str(entry) for entry in entries)
        raise DatasetError(f"{what}: no usable image in {shown}; see the warnings above for each skipped file")
    return records
