"""``shapes``: a built-in, offline, deterministic synthetic dataset for every task.

Each scene is a textured background (a colour gradient with stripes, a checkerboard or blotches,
plus sensor-like noise) with 1-4 objects of the classes ``circle``, ``square``, ``triangle`` and
``cross`` in varied sizes, colours, rotations and positions, overlapping a little (every object
keeps at least 60% of its pixels visible). Boxes are the exact extent of each object's visible
pixels; the semantic mask is the exact class of every pixel; an object's instance mask is exactly its
visible pixels.

The dataset is written once into the cache, ``$ZOO_HOME/datasets/<name>/`` (the ``datasets_dir`` setting), in the standard
on-disk formats, so the ordinary loaders read it::

    images/{train,val}/000000.png          RGB scenes
    labels/{train,val}/000000.txt          YOLO labels: class cx cy w h (normalised)
    masks/{train,val}/000000.png           class index per pixel (0 = background)
    classify/{train,val}/<class>/*.png     one crop per object
    segment/images/{train,val}/000000.png  the same scenes (hard links, copies where links fail)
    segment/labels/{train,val}/000000.txt  YOLO-seg labels: class x1 y1 ... xk yk (normalised), one object a line
    coco/instances_{train,val}.json        COCO instance JSON of the same objects: exact RLE masks, images/{split}
    pose/images/{train,val}/000000.png     the same scenes again (links)
    pose/labels/{train,val}/000000.txt     YOLO pose labels: class cx cy w h, then 4 × x y v (normalised)
    coco/person_keypoints_{train,val}.json COCO keypoint JSON of the same objects
    obb/images/{train,val}/000000.png      scenes of rotated rectangles (their own scenes, see below)
    obb/labels/{train,val}/000000.txt      YOLO OBB labels: class x1 y1 x2 y2 x3 y3 x4 y4 (normalised corners)
    detect.yaml  segment.yaml  coco.yaml  pose.yaml  coco-pose.yaml  semantic.yaml  restore.yaml  obb.yaml  shapes.json

Every object has four keypoints (``SHAPES_KEYPOINTS``), the top-left, top-right, bottom-right and bottom-left
of its own upright frame: a square's corners, a cross's inner corners, a triangle's apex (in both top slots)
and base corners, a circle's rim at the diagonals. ``pose.yaml`` gives ``kpt_shape: [4, 3]``, the flip map
``[1, 0, 3, 2]`` and the outline as its ``skeleton``; a point covered by a later object has visibility 1, every
other 2.

The oriented-box scenes (``obb.yaml``, classes ``bar`` and ``slab``) hold 1-3 filled rectangles at any
angle on the same textured backgrounds: a bar 2.8-4 times as long as it is wide, a slab 1.4-1.9 times,
whole inside the image and never overlapping, so each label's corners are exactly the drawn rectangle.
They are drawn from their own random stream, so the other tasks' scenes are unchanged.

A segment label's polygon is the outline of the object's visible pixels (``zoo_core.data.instances.mask_outline``):
an object cut in pieces by an occluder, or holding one, is one ring whose pieces and holes are joined by
zero-width bridges (Ultralytics' converter merges an object's segments the same way), so the polygon
rasterises back to the visible pixels up to rounding at the edges. The COCO file's ``segmentation`` is the
exact visible mask as a compressed RLE, its ``bbox`` the visible extent, and its category ids are 1..4.

Spelling: ``data="shapes"`` (the default size) or ``"shapes:train=256,val=64,size=192,seed=3"``
(any subset of the keys); ``shapes(num_train=..., ...)`` returns that string from Python.
Generation writes into a private temporary folder beside the target and renames it into place,
so two processes generating at once both end up using one complete copy (E17, docs/architecture.md).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo_core.data.errors import DatasetError
from zoo_core.paths import sweep_stale_folders
from zoo_core.settings import datasets_dir

__all__ = [
    "SHAPES_CLASSES",
    "OBB_CLASSES",
    "SHAPES_KEYPOINTS",
    "SHAPES_FLIP_INDEX",
    "SHAPES_SKELETON",
    "GENERATOR_VERSION",
    "OBBScene",
    "render_obb_scene",
    "ShapesConfig",
    "Scene",
    "shapes",
    "parse_shapes",
    "render_scene",
    "write_shapes",
    "materialize_shapes",
]

SHAPES_CLASSES = ("circle", "square", "triangle", "cross")
#: The classes of the oriented-box scenes (``obb.yaml``).
OBB_CLASSES = ("bar", "slab")
# Bump when the rendering changes, so caches written by an older generator are not reused
# (3: keypoints and the pose files, and the oriented-box scenes).
GENERATOR_VERSION = 3
_OBB_STREAM = 7  # the oriented-box scenes' own random stream, beside the split code
#: The shapes' keypoints (``_shape_keypoints``): top-left, top-right, bottom-right, bottom-left of each shape's frame.
SHAPES_KEYPOINTS = ("top_left", "top_right", "bottom_right", "bottom_left")
#: What each keypoint becomes in a left-right mirrored image (the pose YAML's ``flip_idx``).
SHAPES_FLIP_INDEX = (1, 0, 3, 2)
#: The outline joining the keypoints, drawn by pose results (the pose YAML's ``skeleton``).
SHAPES_SKELETON = ((0, 1), (1, 2), (2, 3), (3, 0))
_SPLIT_CODES = {"train": 0, "val": 1}
_SPELLING_KEYS = {"train": "num_train", "val": "num_val", "size": "image_size", "seed": "seed"}
_MIN_VISIBLE_FRACTION = 0.6
_MIN_IMAGE_SIZE = 32
_DEFAULT_DEGRADATION = {"scale": 2, "noise": 15.0}


@dataclass(frozen=True)
class ShapesConfig:
    """How many scenes of which size and seed; the defaults train a tiny model in about a minute on a CPU."""

    num_train: int = 128
    num_val: int = 32
    image_size: int = 160
    seed: int = 0

    def __post_init__(self) -> None:
        for field_name in ("num_train", "num_val"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise DatasetError(f"shapes: {field_name} must be a positive integer, got {value!r}")
        if not isinstance(self.image_size, int) or self.image_size < _MIN_IMAGE_SIZE:
            raise DatasetError(f"shapes: image_size must be an integer >= {_MIN_IMAGE_SIZE}, got {self.image_size!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise DatasetError(f"shapes: seed must be a non-negative integer, got {self.seed!r}")

    @property
    def directory_name(self) -> str:
        """The cache folder name; it encodes every parameter and the generator version."""
        return f"shapes-v{GENERATOR_VERSION}-train{self.num_train}-val{self.num_val}-size{self.image_size}-seed{self.seed}"

    @property
    def spelling(self) -> str:
        """The ``data=`` string that names this configuration."""
        return f"shapes:train={self.num_train},val={self.num_val},size={self.image_size},seed={self.seed}"


def shapes(num_train: int = 128, num_val: int = 32, image_size: int = 160, seed: int = 0) -> str:
    """The ``data=`` string for a ``shapes`` dataset of these parameters (validated now)."""
    return ShapesConfig(num_train=num_train, num_val=num_val, image_size=image_size, seed=seed).spelling


def parse_shapes(data: Any) -> ShapesConfig | None:
    """The ``ShapesConfig`` that ``data`` spells (``"shapes"`` or ``"shapes:key=value,..."``), else ``None``.

    Only strings are read as built-in names; a ``Path`` always means a path on disk (pass
    ``"./shapes"`` to use a local folder called ``shapes``).
    """
    if not isinstance(data, str):
        return None
    text = data.strip()
    if text.lower() == "shapes":
        return ShapesConfig()
    if not text.lower().startswith("shapes:"):
        return None
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(":", 1)[1].split(","))):
        key, separator, value = item.partition("=")
        key = key.strip().lower()
        if not separator or key not in _SPELLING_KEYS:
            raise DatasetError(
                f"shapes spelling {data!r}: unknown item {item!r}; use key=value with keys "
                f"{', '.join(_SPELLING_KEYS)}, e.g. 'shapes:train=128,val=32,size=160,seed=0'"
            )
        try:
            values[_SPELLING_KEYS[key]] = int(value.strip())
        except ValueError:
            raise DatasetError(f"shapes spelling {data!r}: {key} must be an integer, got {value.strip()!r}") from None
    return ShapesConfig(**values)


@dataclass
class Scene:
    """One rendered scene: RGB pixels, the class map (0 = background, c + 1 = class c), the instance map
    (-1 = background, i = object i) and the objects."""

    image: np.ndarray  # H×W×3 uint8
    class_map: np.ndarray  # H×W uint8
    classes: list[int]
    boxes: list[tuple[int, int, int, int]]  # x1, y1, x2, y2 pixel edges of the visible pixels
    instance_map: np.ndarray | None = None  # H×W int16
    #: Per object its four keypoints (4×3: x, y in pixel-edge coordinates, visibility 2 or 1 where another object covers it).
    keypoints: list[np.ndarray] | None = None

    def instance_mask(self, index: int) -> np.ndarray:
        """The visible pixels of object ``index`` (H×W bool)."""
        if self.instance_map is None:
            raise ValueError("this scene was built without an instance map")
        return self.instance_map == index


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A colour gradient with one texture (none, stripes, checkerboard or blotches), float H×W×3."""
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    start, end = rng.uniform(30, 225, 3), rng.uniform(30, 225, 3)
    angle = rng.uniform(0, 2 * math.pi)
    ramp = xs * math.cos(angle) + ys * math.sin(angle)
    ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-6)
    background = start + (end - start) * ramp[..., None]
    texture = int(rng.integers(0, 4))
    if texture == 1:
        frequency, direction = rng.uniform(4, 14), rng.uniform(0, math.pi)
        wave = np.sin(2 * math.pi * frequency * (xs * math.cos(direction) + ys * math.sin(direction)))
        background += rng.uniform(8, 20) * wave[..., None]
    elif texture == 2:
        cell = int(rng.integers(6, 20))
        pixel = np.arange(size) // cell
        checker = ((pixel[:, None] + pixel[None, :]) % 2) * 2.0 - 1.0
        background += rng.uniform(6, 16) * checker[..., None]
    elif texture == 3:
        grid = rng.normal(0, 1, (6, 6, 3))
        from PIL import Image

        channels = [np.asarray(Image.fromarray(grid[..., c].astype(np.float32), mode="F").resize((size, size), Image.BICUBIC)) for c in range(3)]
        background += rng.uniform(8, 18) * np.stack(channels, axis=-1)
    return background


def _rotated(points: np.ndarray, angle: float, centre: tuple[float, float]) -> list[tuple[float, float]]:
    cosine, sine = math.cos(angle), math.sin(angle)
    rotation = np.array([[cosine, -sine], [sine, cosine]])
    moved = points @ rotation.T + np.asarray(centre)
    return [(float(x), float(y)) for x, y in moved]


def _shape_keypoints(class_id: int, centre: tuple[float, float], extent: float, angle: float) -> np.ndarray:
    """The four keypoints of one shape (4×2, PIL's drawing coordinates), in the order top-left, top-right,
    bottom-right, bottom-left of the shape's own upright frame (``SHAPES_FLIP_INDEX`` swaps them left-right):
    a square's corners, a cross's four inner corners, a triangle's apex (twice: it is top-left and top-right)
    and base corners, and the circle's rim at the four diagonals."""
    half = extent / 2
    name = SHAPES_CLASSES[class_id]
    if name == "square":
        frame = np.array([[-half, -half], [half, -half], [half, half], [-half, half]])
    elif name == "cross":
        arm = extent / 6
        frame = np.array([[-arm, -arm], [arm, -arm], [arm, arm], [-arm, arm]])
    elif name == "triangle":
        radius = extent / math.sqrt(3) * 1.15
        apex = [radius * math.cos(-math.pi / 2), radius * math.sin(-math.pi / 2)]
        frame = np.array([apex, apex, [radius * math.cos(math.pi / 6), radius * math.sin(math.pi / 6)],
                          [radius * math.cos(5 * math.pi / 6), radius * math.sin(5 * math.pi / 6)]])
    else:  # circle
        rim = half / math.sqrt(2)
        frame = np.array([[-rim, -rim], [rim, -rim], [rim, rim], [-rim, rim]])
    return np.asarray(_rotated(frame, angle, centre), dtype=np.float64)


def _shape_mask(class_id: int, size: int, centre: tuple[float, float], extent: float, angle: float) -> np.ndarray:
    """The boolean mask of one shape (``extent``: its nominal width in pixels)."""
    from PIL import Image, ImageDraw

    canvas = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(canvas)
    half = extent / 2
    name = SHAPES_CLASSES[class_id]
    if name == "circle":
        x, y = centre
        draw.ellipse([x - half, y - half, x + half, y + half], fill=1)
    elif name == "square":
        corners = np.array([[-half, -half], [half, -half], [half, half], [-half, half]])
        draw.polygon(_rotated(corners, angle, centre), fill=1)
    elif name == "triangle":
        radius = extent / math.sqrt(3) * 1.15
        corners = np.array([[radius * math.cos(a), radius * math.sin(a)] for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)])
        draw.polygon(_rotated(corners, angle, centre), fill=1)
    else:  # cross: a plus sign whose arms are a third of its width
        arm = extent / 6
        outline = np.array(
            [[-arm, -half], [arm, -half], [arm, -arm], [half, -arm], [half, arm], [arm, arm],
             [arm, half], [-arm, half], [-arm, arm], [-half, arm], [-half, -arm], [-arm, -arm]]
        )
        draw.polygon(_rotated(outline, angle, centre), fill=1)
    return np.asarray(canvas, dtype=bool)


def _distinct_colour(rng: np.random.Generator, under: np.ndarray) -> np.ndarray:
    """Of a few random colours, the one farthest from the mean background colour ``under``."""
    candidates = rng.uniform(0, 255, (8, 3))
    distances = np.linalg.norm(candidates - under, axis=1)
    return candidates[int(np.argmax(distances))]


def render_scene(rng: np.random.Generator, size: int) -> Scene:
    """Render one scene from ``rng`` (same generator state -> same scene, byte for byte)."""
    background = _background(rng, size)
    image = background.copy()
    owner = np.full((size, size), -1, dtype=np.int16)
    full_areas: list[int] = []
    classes: list[int] = []
    corners: list[np.ndarray] = []
    wanted = int(rng.integers(1, 5))
    for _ in range(wanted):
        for _attempt in range(30):
            class_id = int(rng.integers(0, len(SHAPES_CLASSES)))
            extent = rng.uniform(0.18, 0.42) * size
            reach = extent * 0.75  # radius that contains the shape at any rotation
            centre = (rng.uniform(reach, size - reach), rng.uniform(reach, size - reach))
            angle = rng.uniform(0, 2 * math.pi) if SHAPES_CLASSES[class_id] == "triangle" else rng.uniform(-0.35, 0.35)
            mask = _shape_mask(class_id, size, centre, extent, angle)
            area = int(mask.sum())
            if area < 16:
                continue
            hidden_too_much = any(
                int(((owner == other) & ~mask).sum()) < _MIN_VISIBLE_FRACTION * full_areas[other]
                for other in range(len(classes))
            )
            if hidden_too_much:
                continue
            colour = _distinct_colour(rng, background[mask].mean(axis=0))
            image[mask] = colour
            owner[mask] = len(classes)
            full_areas.append(area)
            classes.append(class_id)
            # PIL draws pixel i's centre at coordinate i; labels count pixel i as spanning i..i+1.
            corners.append(_shape_keypoints(class_id, centre, extent, angle) + 0.5)
            break
    noise = rng.normal(0, rng.uniform(2, 7), image.shape)
    pixels = np.clip(np.rint(image + noise), 0, 255).astype(np.uint8)
    class_map = np.zeros((size, size), dtype=np.uint8)
    boxes = []
    for index, class_id in enumerate(classes):
        visible = owner == index
        class_map[visible] = class_id + 1
        rows, columns = np.nonzero(visible)
        boxes.append((int(columns.min()), int(rows.min()), int(columns.max()) + 1, int(rows.max()) + 1))
    keypoints = []
    for index, points in enumerate(corners):
        # A point under a later object is labelled but occluded (COCO's v=1); every other one is visible (v=2).
        pixel_x = np.clip(np.floor(points[:, 0]).astype(int), 0, size - 1)
        pixel_y = np.clip(np.floor(points[:, 1]).astype(int), 0, size - 1)
        covering = owner[pixel_y, pixel_x]
        visibility = np.where((covering > index), 1.0, 2.0)
        keypoints.append(np.concatenate([np.clip(points, 0.0, size), visibility[:, None]], axis=1).astype(np.float32))
    return Scene(image=pixels, class_map=class_map, classes=classes, boxes=boxes, instance_map=owner, keypoints=keypoints)


@dataclass
class OBBScene:
    """One oriented-box scene: RGB pixels, the class of each rectangle and its four corners (pixels, loop order)."""

    image: np.ndarray  # H×W×3 uint8
    classes: list[int]
    corners: list[np.ndarray]  # each 4×2 float64


def render_obb_scene(rng: np.random.Generator, size: int) -> OBBScene:
    """Render one oriented-box scene from ``rng`` (same generator state -> same scene, byte for byte)."""
    from PIL import Image, ImageDraw

    background = _background(rng, size)
    image = background.copy()
    taken = np.zeros((size, size), dtype=bool)
    classes: list[int] = []
    corners: list[np.ndarray] = []
    for _ in range(int(rng.integers(1, 4))):
        for _attempt in range(30):
            class_id = int(rng.integers(0, len(OBB_CLASSES)))
            length = rng.uniform(0.3, 0.55) * size
            aspect = rng.uniform(2.8, 4.0) if OBB_CLASSES[class_id] == "bar" else rng.uniform(1.4, 1.9)
            angle = rng.uniform(-math.pi / 2, math.pi / 2)
            half = np.array([[length / 2, length / aspect / 2]])
            offsets = half * np.array([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])
            reach = np.abs(_rotated(offsets, angle, (0.0, 0.0))).max(axis=0)
            if np.any(reach * 2 + 2 >= size):
                continue
            centre = (rng.uniform(reach[0] + 1, size - reach[0] - 1), rng.uniform(reach[1] + 1, size - reach[1] - 1))
            quad = np.asarray(_rotated(offsets, angle, centre))
            canvas = Image.new("L", (size, size), 0)
            ImageDraw.Draw(canvas).polygon([tuple(point) for point in quad], fill=1)
            mask = np.asarray(canvas, dtype=bool)
            if mask.sum() < 16 or (mask & taken).any():
                continue
            image[mask] = _distinct_colour(rng, background[mask].mean(axis=0))
            taken |= mask
            classes.append(class_id)
            corners.append(quad)
            break
    noise = rng.normal(0, rng.uniform(2, 7), image.shape)
    pixels = np.clip(np.rint(image + noise), 0, 255).astype(np.uint8)
    return OBBScene(image=pixels, classes=classes, corners=corners)


def _crop_box(box: tuple[int, int, int, int], size: int) -> tuple[int, int, int, int]:
    """A square around ``box`` with a margin, clipped to the image."""
    x1, y1, x2, y2 = box
    side = max(x2 - x1, y2 - y1) * 1.2
    centre_x, centre_y = (x1 + x2) / 2, (y1 + y2) / 2
    left, top = max(int(round(centre_x - side / 2)), 0), max(int(round(centre_y - side / 2)), 0)
    right, bottom = min(int(round(centre_x + side / 2)), size), min(int(round(centre_y + side / 2)), size)
    return left, top, right, bottom


def _write_yaml(path: Path, content: dict[str, Any]) -> None:
    import yaml

    path.write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (no second copy of the pixels), a copy where links fail."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _polygon_line(class_id: int, mask: np.ndarray) -> str:
    """The YOLO-seg label line of one object's visible ``mask``."""
    from zoo_core.data.instances import mask_outline

    height, width = mask.shape
    outline = mask_outline(mask)
    if outline is None:  # cannot happen for a rendered object (it keeps most of its pixels); kept explicit
        raise ValueError("an object without visible pixels")
    normalised = np.clip(outline / np.array([width, height], dtype=np.float32), 0.0, 1.0)
    return f"{class_id} " + " ".join(f"{value:.6f}" for value in normalised.reshape(-1))


def _coco_annotation(annotation_id: int, image_id: int, class_id: int, mask: np.ndarray, box: tuple[int, int, int, int]) -> dict[str, Any]:
    """The COCO annotation of one object: its exact visible mask as a compressed RLE."""
    from zoo_core.data.instances import mask_to_rle

    rle = mask_to_rle(mask)
    x1, y1, x2, y2 = box
    return {
        "id": annotation_id, "image_id": image_id, "category_id": class_id + 1, "iscrowd": 0,
        "bbox": [x1, y1, x2 - x1, y2 - y1], "area": int(mask.sum()),
        "segmentation": {"size": [int(value) for value in rle["size"]], "counts": rle["counts"].decode("ascii")},
    }


def write_shapes(config: ShapesConfig, root: Path) -> None:
    """Render every scene of ``config`` into ``root`` (an empty folder) in the on-disk formats."""
    from PIL import Image

    size = config.image_size
    categories = [{"id": index + 1, "name": name, "supercategory": "shape"} for index, name in enumerate(SHAPES_CLASSES)]
    for split, count in (("train", config.num_train), ("val", config.num_val)):
        for kind in ("images", "labels", "masks", "segment/images", "segment/labels", "pose/images", "pose/labels"):
            (root / kind / split).mkdir(parents=True)
        (root / "coco").mkdir(exist_ok=True)
        coco_images: list[dict[str, Any]] = []
        coco_annotations: list[dict[str, Any]] = []
        keypoint_annotations: list[dict[str, Any]] = []
        for name in SHAPES_CLASSES:
            (root / "classify" / split / name).mkdir(parents=True)
        for index in range(count):
            scene = render_scene(np.random.default_rng([config.seed, _SPLIT_CODES[split], index]), size)
            stem = f"{index:06d}"
            Image.fromarray(scene.image).save(root / "images" / split / f"{stem}.png", compress_level=1)
            _link_or_copy(root / "images" / split / f"{stem}.png", root / "segment" / "images" / split / f"{stem}.png")
            _link_or_copy(root / "images" / split / f"{stem}.png", root / "pose" / "images" / split / f"{stem}.png")
            Image.fromarray(scene.class_map).save(root / "masks" / split / f"{stem}.png", compress_level=1)
            image_id = index + 1
            coco_images.append({"id": image_id, "file_name": f"{stem}.png", "height": size, "width": size})
            lines, polygon_lines, pose_lines = [], [], []
            for object_index, (class_id, box) in enumerate(zip(scene.classes, scene.boxes)):
                x1, y1, x2, y2 = box
                lines.append(f"{class_id} {(x1 + x2) / 2 / size:.6f} {(y1 + y2) / 2 / size:.6f} {(x2 - x1) / size:.6f} {(y2 - y1) / size:.6f}")
                visible = scene.instance_mask(object_index)
                polygon_lines.append(_polygon_line(class_id, visible))
                coco_annotations.append(_coco_annotation(len(coco_annotations) + 1, image_id, class_id, visible, box))
                points = scene.keypoints[object_index]  # type: ignore[index]
                pose_lines.append(lines[-1] + "".join(f" {x / size:.6f} {y / size:.6f} {int(v)}" for x, y, v in points.tolist()))
                keypoint_annotations.append({**coco_annotations[-1], "num_keypoints": len(points),
                                             "keypoints": [round(value, 3) for point in points.tolist() for value in point]})
                left, top, right, bottom = _crop_box(box, size)
                crop = Image.fromarray(scene.image[top:bottom, left:right])
                crop.save(root / "classify" / split / SHAPES_CLASSES[class_id] / f"{stem}_{object_index}.png", compress_level=1)
            (root / "labels" / split / f"{stem}.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            (root / "segment" / "labels" / split / f"{stem}.txt").write_text("".join(line + "\n" for line in polygon_lines), encoding="utf-8")
            (root / "pose" / "labels" / split / f"{stem}.txt").write_text("".join(line + "\n" for line in pose_lines), encoding="utf-8")
        coco = {"images": coco_images, "annotations": coco_annotations, "categories": categories}
        (root / "coco" / f"instances_{split}.json").write_text(json.dumps(coco, separators=(",", ":")) + "\n", encoding="utf-8")
        keypoint_categories = [{**category, "keypoints": list(SHAPES_KEYPOINTS),
                                "skeleton": [[a + 1, b + 1] for a, b in SHAPES_SKELETON]} for category in categories]
        keypoint_file = {"images": coco_images, "annotations": keypoint_annotations, "categories": keypoint_categories}
        (root / "coco" / f"person_keypoints_{split}.json").write_text(json.dumps(keypoint_file, separators=(",", ":")) + "\n",
                                                                        encoding="utf-8")
        (root / "obb" / "images" / split).mkdir(parents=True)
        (root / "obb" / "labels" / split).mkdir(parents=True)
        for index in range(count):
            obb_scene = render_obb_scene(np.random.default_rng([config.seed, _SPLIT_CODES[split], index, _OBB_STREAM]), size)
            stem = f"{index:06d}"
            Image.fromarray(obb_scene.image).save(root / "obb" / "images" / split / f"{stem}.png", compress_level=1)
            obb_lines = [f"{class_id} " + " ".join(f"{value:.6f}" for value in (quad / size).reshape(-1))
                         for class_id, quad in zip(obb_scene.classes, obb_scene.corners)]
            (root / "obb" / "labels" / split / f"{stem}.txt").write_text("".join(line + "\n" for line in obb_lines), encoding="utf-8")
    detection_names = dict(enumerate(SHAPES_CLASSES))
    _write_yaml(root / "obb.yaml", {"path": ".", "train": "obb/images/train", "val": "obb/images/val", "names": dict(enumerate(OBB_CLASSES))})
    _write_yaml(root / "detect.yaml", {"path": ".", "train": "images/train", "val": "images/val", "names": detection_names})
    _write_yaml(root / "segment.yaml", {"path": ".", "train": "segment/images/train", "val": "segment/images/val", "names": detection_names})
    pose_layout = {"kpt_shape": [len(SHAPES_KEYPOINTS), 3], "flip_idx": list(SHAPES_FLIP_INDEX),
                   "skeleton": [list(pair) for pair in SHAPES_SKELETON]}
    _write_yaml(root / "pose.yaml", {"path": ".", "train": "pose/images/train", "val": "pose/images/val", "names": detection_names,
                                     **pose_layout})
    _write_yaml(root / "coco-pose.yaml", {"path": ".", "train": "coco/person_keypoints_train.json",
                                          "val": "coco/person_keypoints_val.json", "flip_idx": list(SHAPES_FLIP_INDEX)})
    # No names: a COCO-JSON dataset takes them from the file's categories (ids in sorted order).
    _write_yaml(root / "coco.yaml", {"path": ".", "train": "coco/instances_train.json", "val": "coco/instances_val.json"})
    _write_yaml(
        root / "semantic.yaml",
        {
            "path": ".",
            "train": {"images": "images/train", "masks": "masks/train"},
            "val": {"images": "images/val", "masks": "masks/val"},
            "names": {0: "background", **{index + 1: name for index, name in enumerate(SHAPES_CLASSES)}},
            "ignore_index": 255,
        },
    )
    _write_yaml(
        root / "restore.yaml",
        {"path": ".", "train": "images/train", "val": "images/val", "degradation": dict(_DEFAULT_DEGRADATION)},
    )
    (root / "shapes.json").write_text(
        json.dumps({"generator_version": GENERATOR_VERSION, "classes": list(SHAPES_CLASSES), **asdict(config)}, indent=2) + "\n",
        encoding="utf-8",
    )


def materialize_shapes(config: ShapesConfig | str | None = None, cache: Path | None = None) -> Path:
    """The folder of the ``shapes`` dataset ``config``, generated into the cache if missing.

    Safe when several processes call it at once: each generates into a private temporary
    folder beside the target and renames it into place; a process whose rename loses the race
    deletes its copy and uses the winner's. An existing folder is complete by construction.
    """
    if config is None:
        config = ShapesConfig()
    elif isinstance(config, str):
        parsed = parse_shapes(config)
        if parsed is None:
            raise DatasetError(f"{config!r} does not name the shapes dataset; use 'shapes' or 'shapes:train=...,val=...'")
        config = parsed
    parent = cache / "datasets" if cache is not None else datasets_dir()
    target = parent / config.directory_name
    if target.is_dir():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    # The staging folder names its owner (".<name>.<pid>-..."), so one left by a killed process is swept here
    # by the next process that generates this dataset.
    prefix = f".{config.directory_name}."
    sweep_stale_folders([prefix], parent)
    staging = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
    try:
        write_shapes(config, staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():
                raise
            # another process finished first: its copy is complete, ours is redundant
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
