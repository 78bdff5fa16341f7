"""Pose: boxes plus K keypoints (x, y, visibility) per object, COCO keypoint (OKS) AP and box mAP.

Data (``zoo_core.data.keypoints``): a YOLO pose dataset YAML (Ultralytics' ``kpt_shape: [K, 2|3]``, ``flip_idx``,
optionally ``kpt_sigmas`` and ``skeleton``; label lines ``class cx cy w h`` then K × ``x y [v]``), COCO keypoint
JSON (``person_keypoints_*.json``, read by the instance reader of ``zoo_core.data.coco_format``), or ``"shapes"``
(its ``pose.yaml``: four keypoints per shape, see ``zoo_core.data.shapes``). The layout reaches the model as the
build options ``num_keypoints`` and ``skeleton`` (``DataSpec.extra["model_options"]``, which the engine gives the
model it trains, ``zoo_core/engine/rank.py``).

Augmentation is the detection task's — mosaic, random affine, MixUp, horizontal flip, HSV, the family's letterbox —
with the keypoints moved by the same transforms: each point travels as a zero-size box through the mosaic and the
warp (so it meets exactly the arithmetic its object's box meets), the letterbox scales and shifts it, a horizontal
flip mirrors it and swaps it through ``flip_idx`` (no flip without a ``flip_idx`` when K > 1), and a point that
leaves the image becomes unlabelled (visibility 0, coordinates 0), as Ultralytics marks it.

Batch (after ``collate``): the detection keys (``images``, ``targets`` M×6, ``orig_shapes``, ``ratio_pads``, ``paths``,
``indices``) plus ``keypoints`` (M×K×3 float: x, y in input pixels, visibility 0/1/2; row i the points of ``targets``
row i). Validation samples also carry ``pose_truths``: per image the objects at the original size (boxes, classes,
keypoints, crowd flags and OKS areas).

Model contract: eval outputs are a dict with at least ``boxes`` (N×A×4), ``scores`` (N×A×C), ``keypoints`` (N×A×K×3:
x, y in input pixels and each point's confidence), the exported graph's outputs in that order;
``model.postprocess(outputs, conf, iou, max_det, placements=...)`` returns detection's dicts plus ``keypoints``
(n×K×3, in original pixels with ``placements``); ``model.loss`` reads ``targets`` and ``keypoints``.

Metrics (pycocotools ``COCOeval`` in original pixels, the sigmas of the layout: the dataset's ``kpt_sigmas``,
COCO's 17 constants for 17 points, else uniform ``1/K``): ``pose_mAP50-95``, ``pose_mAP50`` (keypoints, OKS), box
``mAP50-95``, ``mAP50``, and ``fitness``, the box fitness plus the pose fitness (each ``0.1 mAP50 + 0.9 mAP50-95``),
as Ultralytics' pose fitness sums them. A YOLO label's OKS area is its box area × 0.53 (Ultralytics' validator);
a COCO file's is the annotation's ``area``. Under DDP each rank evaluates its shard and the per-image records are
gathered and put back in dataset order, so every rank computes exactly what one process computes.
"""

from __future__ import annotations

import contextlib
import io
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

from zoo_core.data.augment import apply_v2, color_jitter, keep_visible_boxes, make_boxes, mosaic4, random_affine, resize_long_side
from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.input_pipeline import boxes_to_input, fit_to_input
from zoo_core.data.keypoints import OKS_AREA_FROM_BOX, PoseLayout, coco_pose_layout, index_pose_split, parse_pose_layout
from zoo_core.ops.boxes import ImagePlacement
from zoo_core.tasks.base import AugmentSettings, DataSpec, ModelContractError, unwrap_model
from zoo_core.tasks.detect import DetectionDataset, DetectTask, _collate_detection, detection_fitness
from zoo_core.tasks.predictions import PoseResult

if TYPE_CHECKING:
    from zoo_core.data.images import SourceImage
    from zoo_core.data.keypoints import PoseRecord
    from zoo_core.reports.validation_report import ValidationReport

__all__ = ["PoseTask", "PoseDataset", "pose_fitness", "keypoint_average_precision", "PoseLayout"]

#: The ``classes`` marker of a keypoint riding through the mosaic and the warp as a zero-size box.
_POINT_MARK = -1


def pose_fitness(box_map50: float, box_map50_95: float, pose_map50: float, pose_map50_95: float) -> float:
    """Ultralytics' pose model-selection score: the box fitness plus the keypoint fitness (each ``0.1 mAP50 + 0.9 mAP50-95``)."""
    return detection_fitness(box_map50, box_map50_95) + detection_fitness(pose_map50, pose_map50_95)


def points_to_input(points: torch.Tensor, ratio_pad: Any) -> torch.Tensor:
    """K×3 (or n×K×3) original-pixel keypoints placed on the input as the pipeline placed the image (scale, then shift)."""
    (ratio_x, ratio_y), (pad_x, pad_y) = ratio_pad
    moved = points.clone()
    moved[..., 0] = points[..., 0] * ratio_x + pad_x
    moved[..., 1] = points[..., 1] * ratio_y + pad_y
    return moved


def unlabel_outside(points: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``points`` (n×K×3) with every point outside the ``(height, width)`` canvas, or unlabelled, set to ``0, 0, 0``."""
    height, width = size
    outside = (points[..., 0] < 0) | (points[..., 0] >= width) | (points[..., 1] < 0) | (points[..., 1] >= height)
    gone = outside | (points[..., 2] <= 0)
    points = points.clone()
    points[gone] = 0.0
    return points


def flip_points_lr(points: torch.Tensor, width: int, flip_idx: tuple[int, ...]) -> torch.Tensor:
    """Keypoints (n×K×3) of an image mirrored left-right: x -> ``width - x``, each point renamed through ``flip_idx``."""
    flipped = points.clone()
    labelled = flipped[..., 2] > 0
    flipped[..., 0] = torch.where(labelled, width - flipped[..., 0], flipped[..., 0])
    return flipped[:, list(flip_idx)]


def _as_point_boxes(points: torch.Tensor) -> torch.Tensor:
    """n×K×3 keypoints as n·K zero-size xyxy boxes (a point is its own corners, so every warp moves it exactly)."""
    xy = points[..., :2].reshape(-1, 2)
    return torch.cat([xy, xy], dim=1)


class PoseDataset(DetectionDataset):
    """Images fitted to the input with their boxes and keypoints; random mosaic/MixUp/affine/flip/HSV when
    ``augment`` is on, the keypoints moved with the pixels (see the module docstring).

    A sample is a detection sample plus ``keypoints`` (n×K×3, input pixels, aligned with ``boxes``) and, when not
    augmented, ``pose_truths`` (the objects at the original size, crowd regions included, for the metric).
    """

    records: list["PoseRecord"]

    def __init__(self, records: list["PoseRecord"], names: Mapping[int, str], image_size: int, augment: AugmentSettings | None,
                 pipeline: Any, layout: PoseLayout) -> None:
        super().__init__(records, names, image_size, augment, pipeline)  # type: ignore[arg-type]
        self.layout = layout

    def load_pose(self, index: int) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Image ``index`` (uint8 3×H×W), its boxes in pixels, classes (int64) and keypoints (n×K×3 pixels), crowd left out."""
        record = self.records[index]
        image = self.read_image(record.image)
        height, width = int(image.shape[-2]), int(image.shape[-1])
        keep = ~np.asarray(record.crowd, dtype=bool)
        labels = torch.from_numpy(np.asarray(record.labels, dtype=np.float32)[keep]).reshape(-1, 5)
        scale = torch.tensor([width, height, width, height], dtype=torch.float32)
        points = torch.from_numpy(np.asarray(record.keypoints, dtype=np.float32)[keep]).reshape(-1, self.layout.count, 3).clone()
        points[..., 0] *= width
        points[..., 1] *= height
        return image, make_boxes(labels[:, 1:] * scale, (height, width)), labels[:, 0].long(), points

    def pose_truths(self, index: int) -> dict[str, Any]:
        """The objects of image ``index`` as the metric scores them: original-pixel boxes, classes, keypoints, crowd, areas."""
        record = self.records[index]
        height, width = record.height, record.width
        labels = np.asarray(record.labels, dtype=np.float64).reshape(-1, 5)
        boxes = labels[:, 1:] * np.array([width, height, width, height])
        points = np.asarray(record.keypoints, dtype=np.float64).reshape(-1, self.layout.count, 3).copy()
        points[..., 0] *= width
        points[..., 1] *= height
        box_areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        areas = np.where(np.isnan(record.areas), box_areas * OKS_AREA_FROM_BOX, record.areas)
        return {"boxes": boxes, "labels": labels[:, 0].astype(np.int64), "keypoints": points,
                "iscrowd": np.asarray(record.crowd, dtype=bool), "areas": areas, "box_areas": box_areas}

    def fitted_pose(self, index: int) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor, tuple[int, int], Any]:
        """Image ``index`` fitted to the input by the pipeline, its boxes and keypoints with it, classes, original shape, geometry."""
        image, boxes, classes, points = self.load_pose(index)
        original_shape = (int(image.shape[-2]), int(image.shape[-1]))
        pipeline = self.pipeline if self.augment is None else self.pipeline.merged({"resize_in_float": False})
        image, _, ratio_pad = fit_to_input(image, self.image_size, pipeline)
        canvas = tuple(int(side) for side in image.shape[-2:])
        boxes = make_boxes(boxes_to_input(boxes.as_subclass(torch.Tensor), ratio_pad), canvas)
        labelled = points[..., 2:] > 0
        points = torch.where(labelled, points_to_input(points, ratio_pad), points)
        return image, boxes, classes, points, original_shape, ratio_pad

    def _with_points(self, boxes: Any, classes: torch.Tensor, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Boxes then the keypoints as zero-size boxes, classes then ``_POINT_MARK`` for each point."""
        stacked = torch.cat([boxes.as_subclass(torch.Tensor).reshape(-1, 4), _as_point_boxes(points)])
        return stacked, torch.cat([classes, torch.full((points.shape[0] * points.shape[1],), _POINT_MARK, dtype=classes.dtype)])

    def _split_points(self, boxes: torch.Tensor, classes: torch.Tensor, visibility: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The inverse of ``_with_points`` after a transform: (boxes, classes, n×K×3 keypoints with ``visibility``)."""
        is_point = classes == _POINT_MARK
        point_boxes = boxes[is_point]
        xy = point_boxes[:, :2].reshape(-1, self.layout.count, 2)
        return boxes[~is_point], classes[~is_point], torch.cat([xy, visibility[..., None]], dim=-1)

    def _mosaic_pose(self, index: int, settings: AugmentSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Image ``index`` and three random others in a 2×2 mosaic with their keypoints, warped and cropped to the input size."""
        size = self.image_size
        pieces, visibilities = [], []
        for piece_index in [index] + [random.randrange(len(self.records)) for _ in range(3)]:
            piece_image, piece_boxes, piece_classes, points = self.load_pose(piece_index)
            piece_image, piece_boxes, _, ratios = resize_long_side(piece_image, size, boxes=piece_boxes)
            points = points.clone()
            points[..., 0] *= ratios[0]
            points[..., 1] *= ratios[1]
            stacked, marked = self._with_points(piece_boxes, piece_classes, points)
            pieces.append((piece_image, make_boxes(stacked, tuple(piece_image.shape[-2:])), marked))
            visibilities.append(points[..., 2])
        image, boxes, classes = mosaic4(pieces, size)
        affine = random_affine(settings, output_size=(size, size))
        if affine is not None:
            image, boxes = apply_v2(affine, image, boxes)
        else:
            image, boxes = F.center_crop(image, [size, size]), F.center_crop(boxes, [size, size])
        boxes, classes, points = self._split_points(boxes.as_subclass(torch.Tensor), classes, torch.cat(visibilities))
        return image, boxes, classes, points

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self.records[index]
        size = self.image_size
        settings = self.augment
        layout = self.layout
        if settings is None:
            image, boxes, classes, points, original_shape, ratio_pad = self.fitted_pose(index)
            boxes = boxes.as_subclass(torch.Tensor).reshape(-1, 4)
        else:
            if settings.mosaic > 0 and random.random() < settings.mosaic:
                image, boxes, classes, points = self._mosaic_pose(index, settings)
                if settings.mixup > 0 and random.random() < settings.mixup:
                    other = self._mosaic_pose(random.randrange(len(self)), settings)
                    ratio = random.betavariate(32.0, 32.0)  # DetectionDataset._mixup's blend, both sets of objects kept
                    image = (image.float() * ratio + other[0].float() * (1.0 - ratio)).round_().to(torch.uint8)
                    boxes, classes, points = torch.cat([boxes, other[1]]), torch.cat([classes, other[2]]), torch.cat([points, other[3]])
                original_shape, ratio_pad = (size, size), ((1.0, 1.0), (0.0, 0.0))
            else:
                image, boxes, classes, points, original_shape, ratio_pad = self.fitted_pose(index)
                affine = random_affine(settings)
                if affine is not None:
                    stacked, marked = self._with_points(boxes, classes, points)
                    image, warped = apply_v2(affine, image, make_boxes(stacked, tuple(image.shape[-2:])))
                    boxes, classes, points = self._split_points(warped.as_subclass(torch.Tensor), marked, points[..., 2])
                else:
                    boxes = boxes.as_subclass(torch.Tensor)
            canvas = (int(image.shape[-2]), int(image.shape[-1]))
            # keep_visible_boxes judges every box; given the row numbers as "classes", it says which rows stay.
            boxes, kept = keep_visible_boxes(boxes, torch.arange(len(classes)), canvas)
            classes, points = classes[kept], unlabel_outside(points[kept], canvas)
            if settings.fliplr > 0 and (layout.flip_idx is not None) and random.random() < settings.fliplr:
                image = image.flip(-1)
                boxes = torch.stack([canvas[1] - boxes[:, 2], boxes[:, 1], canvas[1] - boxes[:, 0], boxes[:, 3]], dim=1)
                points = flip_points_lr(points, canvas[1], layout.flip_idx)
            if settings.flipud > 0 and random.random() < settings.flipud:  # no draw at the default 0: runs stay as they were
                image = image.flip(-2)
                boxes = torch.stack([boxes[:, 0], canvas[0] - boxes[:, 3], boxes[:, 2], canvas[0] - boxes[:, 1]], dim=1)
                labelled = points[..., 2] > 0
                points[..., 1] = torch.where(labelled, canvas[0] - points[..., 1], points[..., 1])
            jitter = color_jitter(settings)
            if jitter is not None:
                (image,) = apply_v2(jitter, image)
        sample = {
            "image": image.contiguous(),
            "boxes": boxes.reshape(-1, 4),
            "classes": classes,
            "keypoints": points.reshape(-1, layout.count, 3).float().contiguous(),
            "orig_shape": (int(original_shape[0]), int(original_shape[1])),
            "ratio_pad": ratio_pad,
            "path": str(record.image),
            "index": index,
        }
        if settings is None:
            sample["pose_truths"] = self.pose_truths(index)
        return sample


def _collate_pose(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The detection batch plus ``keypoints`` (M×K×3, in ``targets`` order) and, for validation, ``pose_truths``."""
    batch = _collate_detection(samples)
    count = samples[0]["keypoints"].shape[1] if samples else 1
    points = [sample["keypoints"] for sample in samples if len(sample["keypoints"])]
    batch["keypoints"] = torch.cat(points) if points else torch.zeros((0, count, 3))
    if all("pose_truths" in sample for sample in samples):
        batch["pose_truths"] = [sample["pose_truths"] for sample in samples]
    return batch


def _coco_results(truths: list[dict[str, Any]], predictions: list[dict[str, Any]], count: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """In-memory COCO ground truth and detections (pycocotools' formats) of images in dataset order."""
    images, annotations, results = [], [], []
    categories: set[int] = set()
    for image_id, (truth, found) in enumerate(zip(truths, predictions), start=1):
        images.append({"id": image_id})
        for box, label, points, crowd, area in zip(truth["boxes"], truth["labels"], truth["keypoints"], truth["iscrowd"], truth["areas"]):
            x1, y1, x2, y2 = (float(v) for v in box)
            labelled = int((points[:, 2] > 0).sum())
            annotations.append({
                "id": len(annotations) + 1, "image_id": image_id, "category_id": int(label) + 1, "iscrowd": int(crowd),
                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": float(area), "num_keypoints": labelled,
                "keypoints": [float(v) for point in points for v in (point[0], point[1], point[2])],
            })
            categories.add(int(label) + 1)
        for box, score, label, points in zip(found["boxes"], found["scores"], found["labels"], found["keypoints"]):
            x1, y1, x2, y2 = (float(v) for v in box)
            results.append({
                "image_id": image_id, "category_id": int(label) + 1, "score": float(score), "bbox": [x1, y1, x2 - x1, y2 - y1],
                "keypoints": [float(v) for point in points for v in (point[0], point[1], point[2])],
            })
            categories.add(int(label) + 1)
    return {"images": images, "annotations": annotations, "categories": [{"id": c} for c in sorted(categories)]}, results


def keypoint_average_precision(truths: list[dict[str, Any]], predictions: list[dict[str, Any]],
                               sigmas: tuple[float, ...]) -> dict[str, float]:
    """COCO box and keypoint AP of images (truths and predictions in the same order), pycocotools' ``COCOeval``.

    Returns ``mAP50-95``, ``mAP50``, ``mAP75`` (boxes), ``pose_mAP50-95``, ``pose_mAP50``, ``pose_mAP75`` (OKS with
    ``sigmas``); 0 where nothing was scored. ``truths`` as ``PoseDataset.pose_truths`` gives them; ``predictions``
    dicts of numpy ``boxes`` (n×4 xyxy), ``scores``, ``labels`` and ``keypoints`` (n×K×3), in original pixels.
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    values = {key: 0.0 for key in ("mAP50-95", "mAP50", "mAP75", "pose_mAP50-95", "pose_mAP50", "pose_mAP75")}
    dataset, results = _coco_results(truths, predictions, len(sigmas))
    if not results or not dataset["annotations"]:
        return values
    with contextlib.redirect_stdout(io.StringIO()):  # COCOeval prints its tables
        ground = COCO()
        ground.dataset = dataset
        ground.createIndex()
        found = ground.loadRes(results)
        for kind, prefix in (("bbox", ""), ("keypoints", "pose_")):
            evaluation = COCOeval(ground, found, iouType=kind)
            if kind == "keypoints":
                evaluation.params.kpt_oks_sigmas = np.asarray(sigmas, dtype=np.float64)
            evaluation.evaluate()
            evaluation.accumulate()
            evaluation.summarize()
            stats = evaluation.stats
            values[f"{prefix}mAP50-95"], values[f"{prefix}mAP50"], values[f"{prefix}mAP75"] = (
                max(float(stats[0]), 0.0), max(float(stats[1]), 0.0), max(float(stats[2]), 0.0))
    return values


def _gather_in_order(local: list[tuple[int, Any]]) -> list[Any]:
    """Per-image records ``(dataset index, record)`` of every rank (all of them under DDP), in dataset order, each once."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        local = [item for part in gathered for item in part]
    by_index: dict[int, Any] = {}
    for index, record in local:
        by_index.setdefault(int(index), record)
    return [by_index[index] for index in sorted(by_index)]


class PoseTask(DetectTask):
    """Keypoint detection (boxes and K keypoints per object); fitness is the box plus the keypoint fitness.

    ``conf``, ``iou`` and ``max_det`` are the thresholds ``validate`` hands to the family's ``postprocess``
    (as detection's). The loss contract is the family's (``model.loss`` reads ``targets`` and ``keypoints``).
    """

    name = "pose"
    fitness_metric = "fitness"
    export_outputs = ("boxes", "scores", "keypoints")
    result_type = "zoo_core.tasks.predictions:PoseResult"
    shapes_yaml = "pose.yaml"
    supports_multi_scale = True
    validation_modules = ("pycocotools.cocoeval",)
    # Keypoints have no crops of their own; save_crop stays detection's (the boxes), the others apply as they do.
    predict_options = DetectTask.predict_options

    def prepare(self, data: str | Path) -> DataSpec:
        """Detection's resolution of ``data`` plus the keypoint layout, in ``extra["pose"]`` and as the model's options."""
        from zoo_core.data.dataset_yaml import read_dataset_yaml

        spec = super().prepare(data)
        source = Path(spec.extra["yaml"])
        json_entries = [entry for entry in list(spec.train) + list(spec.val) if entry.suffix.lower() == ".json"]
        content = read_dataset_yaml(source) if source.suffix.lower() != ".json" else {}
        layout = coco_pose_layout(json_entries[0], content, str(source)) if json_entries else parse_pose_layout(content, str(source))
        spec.extra["pose"] = layout.as_dict()
        spec.extra["model_options"] = {"num_keypoints": layout.count, "skeleton": [list(pair) for pair in layout.skeleton]}
        return spec

    @staticmethod
    def layout_of(spec: DataSpec) -> PoseLayout:
        """The keypoint layout ``prepare`` stored in ``spec``; ``DatasetError`` if the spec is not a pose dataset's."""
        if "pose" not in spec.extra:
            raise DatasetError(f"{spec.root}: not prepared as a pose dataset (no keypoint layout); prepare it with the pose task")
        return PoseLayout.from_dict(spec.extra["pose"])

    def dataset(self, spec: DataSpec, split: str, image_size: int, augment: AugmentSettings | None) -> PoseDataset:
        layout = self.layout_of(spec)
        self.layout = layout
        report = ProblemReport(f"{spec.root} ({split})")
        records = spec.relabelled(index_pose_split(list(spec.split(split)), spec.label_names, layout, what=report.what,
                                                   report=report))
        if split == "train" and not any(len(record.labels) and not np.all(record.crowd) for record in records):
            skipped = f" ({report.skipped_lines} label lines were skipped, first: {'; '.join(report.first_skipped_lines)})" \
                if report.skipped_lines else ""
            raise DatasetError(
                f"{spec.root}: none of the {len(records)} training images has an object with keypoints{skipped}, so a pose model "
                f"would learn nothing. Pose reads YOLO pose labels ('class cx cy w h' then {layout.count} keypoints of "
                f"{'x y' if layout.dims == 2 else 'x y v'}, normalised, in a labels/ folder beside images/) or COCO keypoint JSON"
            )
        return PoseDataset(records, spec.names, image_size, augment if split == "train" else None, self.input_pipeline, layout)

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        return _collate_pose(samples)

    def resize_batch(self, batch: Mapping[str, Any], size: tuple[int, int]) -> dict[str, Any]:
        """Detection's resize (images bilinear, ``targets`` scaled) with the keypoints scaled the same way."""
        height, width = batch["images"].shape[-2:]
        resized = super().resize_batch(batch, size)
        points = batch["keypoints"].clone()
        points[..., 0] *= size[1] / width
        points[..., 1] *= size[0] / height
        return {**resized, "keypoints": points}

    def default_loss(self, outputs: Any, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise ModelContractError(
            "pose has no task-level loss: the family's model must define loss(outputs, batch) -> (loss, items), reading "
            "batch['targets'] and batch['keypoints'] (see zoo_core/tasks/pose.py)"
        )

    postprocess_contract = ("has no postprocess(outputs, conf, iou, max_det, placements); a pose family's model must define "
                            "it and return boxes, scores, labels and keypoints (zoo_core/tasks/pose.py)")

    @staticmethod
    def _found(found: Mapping[str, torch.Tensor], count: int | None = None) -> dict[str, torch.Tensor]:
        """A postprocess dict on the CPU in the metric's types, its keypoint contract checked."""
        if "keypoints" not in found:
            raise ModelContractError(f"postprocess returned {sorted(found)}; a pose model also returns 'keypoints' (n×K×3) per "
                                     "image (zoo_core/tasks/pose.py)")
        points = found["keypoints"].detach().float().cpu()
        if points.ndim != 3 or points.shape[-1] != 3 or len(points) != len(found["boxes"]) or (count is not None and points.shape[1] != count):
            wanted = f"{count}" if count is not None else "K"
            raise ModelContractError(
                f"postprocess returned keypoints of shape {tuple(points.shape)} for {len(found['boxes'])} boxes; a pose model gives "
                f"n×{wanted}×3 (x, y, confidence). A model built for another keypoint count than the dataset's needs the "
                f"build option num_keypoints={wanted} (training adapts it by itself)"
            )
        return {
            "boxes": found["boxes"].detach().float().cpu().reshape(-1, 4),
            "scores": found["scores"].detach().float().cpu().reshape(-1),
            "labels": found["labels"].detach().long().cpu().reshape(-1),
            "keypoints": points,
        }

    def validate(
        self, model: torch.nn.Module, loader: Any, device: torch.device, names: Mapping[int, str], report: "ValidationReport | None" = None
    ) -> dict[str, float]:
        postprocess = self._postprocess(model)
        layout = getattr(loader.dataset, "layout", None) if hasattr(loader, "dataset") else None
        layout = layout or getattr(self, "layout", None)
        local: list[tuple[int, Any]] = []
        with torch.inference_mode():
            for batch_index, batch in enumerate(loader):
                if "pose_truths" not in batch:
                    raise ValueError("pose validation needs the un-augmented dataset's batches (they carry 'pose_truths')")
                batch = self.preprocess(batch, device)
                placements = [ImagePlacement(ratio_pad, shape) for ratio_pad, shape in zip(batch["ratio_pads"], batch["orig_shapes"])]
                outputs = model(batch["images"])
                found = postprocess(outputs, conf=self.conf, iou=self.iou, max_det=self.max_det, placements=placements)
                count = int(batch["keypoints"].shape[1])
                for index, detection, truth in zip(batch["indices"].tolist(), found, batch["pose_truths"]):
                    item = self._found(detection, count)
                    local.append((index, (truth, {key: value.numpy() for key, value in item.items()})))
                if report is not None and report.draws_batch(batch_index):
                    drawn = postprocess(outputs, conf=self.conf, iou=self.iou, max_det=self.max_det)
                    self._draw_pose_validation_batch(report, batch_index, batch, drawn, names, layout)
        records = _gather_in_order(local)
        sigmas = layout.sigmas if layout is not None else None
        if sigmas is None:
            from zoo_core.data.keypoints import default_sigmas

            sigmas = default_sigmas(int(records[0][0]["keypoints"].shape[1]) if records and len(records[0][0]["keypoints"]) else 17)
        values = keypoint_average_precision([truth for truth, _ in records], [found for _, found in records], sigmas)
        return {**values, "fitness": pose_fitness(values["mAP50"], values["mAP50-95"], values["pose_mAP50"], values["pose_mAP50-95"])}

    @staticmethod
    def _draw_pose_validation_batch(report: "ValidationReport", index: int, batch: Mapping[str, Any],
                                    found: list[dict[str, torch.Tensor]], names: Mapping[int, str], layout: PoseLayout | None) -> None:
        """``val_batch<index>_labels.jpg`` (true boxes and keypoints) and ``_pred.jpg`` (objects scoring at least 0.25)."""
        from zoo_core.reports.drawing import draw_pose_batch

        skeleton = layout.skeleton if layout is not None else ()
        images = batch["images"]
        report.image(f"val_batch{index}_labels.jpg", draw_pose_batch(images, batch["targets"], batch["keypoints"], names, skeleton))
        rows, points = [], []
        for position, detection in enumerate(found):
            keep = detection["scores"].detach().float().cpu() >= 0.25
            boxes = detection["boxes"].detach().float().cpu().reshape(-1, 4)[keep]
            rows.append(torch.cat([
                torch.full((len(boxes), 1), float(position)), detection["labels"].detach().float().cpu().reshape(-1, 1)[keep],
                boxes, detection["scores"].detach().float().cpu().reshape(-1, 1)[keep],
            ], dim=1))
            points.append(detection["keypoints"].detach().float().cpu()[keep])
        count = int(batch["keypoints"].shape[1])
        report.image(f"val_batch{index}_pred.jpg", draw_pose_batch(
            images, torch.cat(rows) if rows else torch.zeros(0, 7), torch.cat(points) if points else torch.zeros(0, count, 3), names, skeleton))

    def draw_batch(self, batch: Mapping[str, Any], names: Mapping[int, str]) -> torch.Tensor:
        from zoo_core.reports.drawing import draw_pose_batch

        layout = getattr(self, "layout", None)
        return draw_pose_batch(batch["images"], batch["targets"], batch["keypoints"], names, layout.skeleton if layout else ())

    def example_batch(self, batch_size: int, image_size: int, num_classes: int) -> dict[str, Any]:
        batch = super().example_batch(batch_size, image_size, num_classes)
        # Each synthetic object's keypoints lie inside its box (visible), as a real batch's do.
        count = getattr(getattr(self, "layout", None), "count", 17)
        boxes = batch["targets"][:, 2:6]
        fractions = torch.rand(len(boxes), count, 2)
        xy = boxes[:, None, :2] + fractions * (boxes[:, None, 2:] - boxes[:, None, :2])
        batch["keypoints"] = torch.cat([xy, torch.full((len(boxes), count, 1), 2.0)], dim=-1)
        return batch

    def predict(self, model: torch.nn.Module, sources: "list[SourceImage]", device: torch.device, image_size: int,
                names: Mapping[int, str], conf: float = 0.25, iou: float = 0.7, max_det: int = 300) -> list[PoseResult]:
        """Detection's predict; each result also carries the keypoints and the model's skeleton (for drawing)."""
        self._skeleton = tuple(tuple(pair) for pair in getattr(unwrap_model(model), "skeleton", ()) or ())
        return super().predict(model, sources, device, image_size, names, conf=conf, iou=iou, max_det=max_det)  # type: ignore[return-value]

    def _result(self, source: "SourceImage", names: Mapping[int, str], detection: Mapping[str, torch.Tensor],
                shape: tuple[int, int]) -> PoseResult:
        """Detection's result plus the keypoints (n×K×3 in original pixels), the postprocess contract checked."""
        found = self._found(detection)
        return PoseResult(
            orig_image=source.image, path=source.path, name=source.name, names=dict(names),
            boxes=found["boxes"], scores=found["scores"], labels=found["labels"], keypoints=found["keypoints"],
            skeleton=getattr(self, "_skeleton", ()),
        )
