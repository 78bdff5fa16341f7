"""Object detection: YOLO-format datasets, mosaic/affine/HSV/flip augmentation, COCO box mAP.

Data: a dataset YAML in the Ultralytics convention (``zoo_core.data.yolo_format``), a dataset YAML
whose ``train``/``val`` name COCO instance JSON files (``names`` optional: the categories' otherwise), a
COCO annotations JSON or a folder in COCO's layout (``zoo_core.data.coco_format``), or ``"shapes"``.
COCO's ``iscrowd`` boxes are left out of detection training and validation (COCO's evaluation would
ignore detections on them instead; leaving them out counts such detections as false positives).
Samples are fitted to ``image_size×image_size`` by the family's input pipeline
(``zoo_core/data/input_pipeline.py``: a letterbox or a stretch, as its published weights expect);
training adds mosaic, random affine, horizontal flip and HSV jitter as ``AugmentSettings`` says.

Batch (after ``collate``): ``images`` uint8 N×3×S×S, ``targets`` M×6 float (image index, class,
x1, y1, x2, y2 in input pixels), ``orig_shapes``, ``ratio_pads``, ``paths``, ``indices``.

Postprocess contract a family fulfils: ``model.postprocess(outputs, conf, iou, max_det, placements=...)``
on eval outputs returns one dict per image with ``boxes`` (n×4 xyxy), ``scores`` (n) and ``labels``
(n, int64). ``placements`` (one ``zoo_core.ops.boxes.ImagePlacement`` per image: where the original
image lies on the input) asks for boxes in original-image pixels, mapped back in the family's
reference order (a dense detector maps, clips and drops empty boxes before NMS, as its published
postprocess does; a DETR does not clip); without it the boxes stay in input pixels. The family
also supplies ``model.loss`` (detection has no default loss).

Metrics: COCO mAP50-95, mAP50 and mAP75 and mean recall (torchmetrics ``MeanAveragePrecision``,
pycocotools backend) in original-image coordinates; ``fitness = 0.1 mAP50 + 0.9 mAP50-95``; with them
the per-class table (images, instances, P, R, mAP50, mAP50-95: ``zoo_core.tasks.class_table``) as the
returned dict's ``class_table``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch
from torch.utils.data import Dataset
from torchvision.transforms.v2 import functional as F

from zoo_core.data.augment import (
    apply_v2,
    color_jitter,
    keep_visible_boxes,
    make_boxes,
    mosaic4,
    random_affine,
    resize_long_side,
)
from zoo_core.data.dataset_yaml import YAML_SUFFIXES
from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.image_cache import CachedImages
from zoo_core.data.input_pipeline import boxes_to_input, boxes_to_original, fit_to_input
from zoo_core.data.shapes import materialize_shapes, parse_shapes
from zoo_core.data.yolo_format import (
    DetectionRecord,
    DetectionYaml,
    index_detection_split,
    label_path_for,
    read_detection_yaml,
)
from zoo_core.ops.boxes import ImagePlacement
from zoo_core.registry import InputPipeline
from zoo_core.tasks.base import AugmentSettings, DataSpec, ModelContractError, Task, move_to_device, unwrap_model
from zoo_core.tasks.class_table import ValidationMetrics, detection_class_table
from zoo_core.tasks.predictions import DetectionResult

if TYPE_CHECKING:
    from zoo_core.data.images import SourceImage
    from zoo_core.reports.validation_report import ValidationReport

__all__ = ["DetectTask", "DetectionDataset", "detection_fitness"]


def detection_fitness(map50: float, map50_95: float) -> float:
    """YOLO's model-selection score: ``0.1 * mAP50 + 0.9 * mAP50-95``."""
    return 0.1 * map50 + 0.9 * map50_95


class DetectionDataset(CachedImages, Dataset):
    """Images fitted to the input by ``pipeline`` with their boxes; random mosaic/MixUp/affine/flip/HSV when
    ``augment`` is on (a mosaic's pieces are scaled by their longer side, as YOLO's mosaic does).

    ``update_augmentation(settings)`` changes the augmentation for the remaining epochs (the
    no-augmentation phase: YOLO's ``close_mosaic``, the DETR line's stop epoch); it reaches loader
    workers started afterwards (not persistent ones started before).
    """

    def __init__(self, records: list[DetectionRecord], names: Mapping[int, str], image_size: int, augment: AugmentSettings | None,
                 pipeline: InputPipeline | None = None) -> None:
        if image_size < 16:
            raise ValueError(f"image_size must be at least 16 pixels, got {image_size}")
        self.records = records
        self.names = dict(names)
        self.image_size = image_size
        self.augment = augment if augment is not None and augment.enabled else None
        self.pipeline = pipeline or DetectTask.default_input_pipeline

    def __len__(self) -> int:
        return len(self.records)

    def update_augmentation(self, settings: AugmentSettings) -> None:
        """Augment as ``settings`` say from now on (nothing changes when augmentation was off)."""
        if self.augment is not None:
            self.augment = settings if settings.enabled else None

    def load(self, index: int) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """Image ``index`` (uint8 3×H×W) with its boxes in pixels and classes (int64)."""
        record = self.records[index]
        image = self.read_image(record.image)
        height, width = image.shape[-2:]
        labels = torch.from_numpy(record.labels)
        scale = torch.tensor([width, height, width, height], dtype=torch.float32)
        boxes = make_boxes(labels[:, 1:] * scale, (height, width))
        return image, boxes, labels[:, 0].long()

    def _mosaic(self, index: int, settings: AugmentSettings) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """Image ``index`` and three random others in a 2×2 mosaic, randomly warped and cropped to the input size."""
        size = self.image_size
        pieces = []
        for piece_index in [index] + [random.randrange(len(self.records)) for _ in range(3)]:
            piece_image, piece_boxes, piece_classes = self.load(piece_index)
            piece_image, piece_boxes, _, _ = resize_long_side(piece_image, size, boxes=piece_boxes)
            pieces.append((piece_image, piece_boxes, piece_classes))
        image, boxes, classes = mosaic4(pieces, size)
        affine = random_affine(settings, output_size=(size, size))
        if affine is not None:  # one warp of the canvas straight onto its centred input-size crop
            image, boxes = apply_v2(affine, image, boxes)
            return image, boxes, classes
        return F.center_crop(image, [size, size]), F.center_crop(boxes, [size, size]), classes

    def _mixup(self, first: tuple[torch.Tensor, Any, torch.Tensor],
               second: tuple[torch.Tensor, Any, torch.Tensor]) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """MixUp (Zhang et al., 2018, as YOLOv5/YOLOv7 apply it to mosaics): the two images blended with a
        ratio drawn from Beta(32, 32), both sets of boxes kept."""
        ratio = random.betavariate(32.0, 32.0)
        image = (first[0].float() * ratio + second[0].float() * (1.0 - ratio)).round_().to(torch.uint8)
        size = (self.image_size, self.image_size)
        first_boxes, first_classes = keep_visible_boxes(first[1], first[2], size)
        second_boxes, second_classes = keep_visible_boxes(second[1], second[2], size)
        return image, make_boxes(torch.cat([first_boxes, second_boxes]), size), torch.cat([first_classes, second_classes])

    def fitted(self, index: int) -> tuple[torch.Tensor, Any, torch.Tensor, tuple[int, int], Any]:
        """Image ``index`` fitted to the input by the pipeline, its boxes with it, its classes, original shape and geometry."""
        image, boxes, classes = self.load(index)
        original_shape = (int(image.shape[-2]), int(image.shape[-1]))
        # Augmentation works on uint8 levels: a pipeline that resizes in floats does so for validation only.
        pipeline = self.pipeline if self.augment is None else self.pipeline.merged({"resize_in_float": False})
        image, _, ratio_pad = fit_to_input(image, self.image_size, pipeline)
        boxes = make_boxes(boxes_to_input(boxes.as_subclass(torch.Tensor), ratio_pad), (self.image_size, self.image_size))
        return image, boxes, classes, original_shape, ratio_pad

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self.records[index]
        size = self.image_size
        settings = self.augment
        if settings is None:
            image, boxes, classes, original_shape, ratio_pad = self.fitted(index)
        elif settings.mosaic > 0 and random.random() < settings.mosaic:
            image, boxes, classes = self._mosaic(index, settings)
            if settings.mixup > 0 and random.random() < settings.mixup:
                image, boxes, classes = self._mixup((image, boxes, classes), self._mosaic(random.randrange(len(self)), settings))
            original_shape, ratio_pad = (size, size), ((1.0, 1.0), (0.0, 0.0))
        else:
            image, boxes, classes, original_shape, ratio_pad = self.fitted(index)
            affine = random_affine(settings)
            if affine is not None:
                image, boxes = apply_v2(affine, image, boxes)
        if settings is None:  # validation scores every labelled box, however small
            boxes = boxes.as_subclass(torch.Tensor).reshape(-1, 4)
        else:
            boxes, classes = keep_visible_boxes(boxes, classes, (size, size))
            if settings.fliplr > 0 and random.random() < settings.fliplr:
                image = image.flip(-1)
                boxes = torch.stack([size - boxes[:, 2], boxes[:, 1], size - boxes[:, 0], boxes[:, 3]], dim=1)
            if settings.flipud > 0 and random.random() < settings.flipud:  # no draw at the default 0: runs stay as they were
                image = image.flip(-2)
                boxes = torch.stack([boxes[:, 0], size - boxes[:, 3], boxes[:, 2], size - boxes[:, 1]], dim=1)
            jitter = color_jitter(settings)
            if jitter is not None:
                (image,) = apply_v2(jitter, image)
        return {
            "image": image.contiguous(),
            "boxes": boxes.reshape(-1, 4),
            "classes": classes,
            "orig_shape": (int(original_shape[0]), int(original_shape[1])),
            "ratio_pad": ratio_pad,
            "path": str(record.image),
            "index": index,
        }


def _collate_detection(samples: list[dict[str, Any]]) -> dict[str, Any]:
    targets = []
    for position, sample in enumerate(samples):
        count = len(sample["classes"])
        if count:
            column = torch.full((count, 1), float(position))
            targets.append(torch.cat([column, sample["classes"].float()[:, None], sample["boxes"].float()], dim=1))
    return {
        "images": torch.stack([sample["image"] for sample in samples]),
        "targets": torch.cat(targets) if targets else torch.zeros((0, 6)),
        "orig_shapes": [sample["orig_shape"] for sample in samples],
        "ratio_pads": [sample["ratio_pad"] for sample in samples],
        "paths": [sample["path"] for sample in samples],
        "indices": torch.tensor([sample["index"] for sample in samples], dtype=torch.long),
    }


def _resolve_yaml(data: str | Path) -> Path:
    path = Path(data).expanduser()
    if path.is_dir():
        for name in ("data.yaml", "dataset.yaml", "data.yml", "dataset.yml"):
            if (path / name).is_file():
                return path / name
        raise DatasetError(f"{path} is a folder without data.yaml (or COCO's annotations/instances_*.json); "
                           "give the dataset YAML (path/train/val/names)")
    if path.suffix.lower() not in YAML_SUFFIXES:
        raise DatasetError(f"detection data {str(data)!r} must be a dataset YAML (.yaml), a folder holding data.yaml, "
                           "a COCO annotations .json, or 'shapes'")
    if not path.is_file():
        raise DatasetError(f"detection dataset YAML {path} does not exist; check the path")
    return path


class DetectTask(Task):
    """Object detection; fitness is ``0.1 mAP50 + 0.9 mAP50-95``.

    ``conf``, ``iou`` and ``max_det`` are the thresholds ``validate`` hands to the family's
    ``postprocess`` (low confidence, as for a precision-recall curve).
    """

    name = "detect"
    fitness_metric = "fitness"
    size_multiple = 32
    export_outputs = ("boxes", "scores")
    thresholds = ("conf", "iou", "max_det")
    result_type = "zoo_core.tasks.predictions:DetectionResult"
    supports_multi_scale = True
    # Boxes have classes to keep, YOLO label lines to write, regions to crop and lines to draw.
    predict_options = frozenset({"classes", "save_txt", "save_conf", "save_crop", "line_width"})
    trackable = True
    supports_single_class = True
    default_input_pipeline = InputPipeline(resize="letterbox")  # LibreYOLO's YOLO letterbox: top-left, OpenCV bilinear
    #: Which YAML of the built-in shapes dataset ``prepare`` reads for ``data="shapes"`` (the segment task: its polygons).
    shapes_yaml = "detect.yaml"

    def __init__(self, conf: float = 0.001, iou: float = 0.7, max_det: int = 300, **declared: Any) -> None:
        super().__init__(**declared)
        self.conf = conf
        self.iou = iou
        self.max_det = max_det

    def _layout(self, data: str | Path) -> DetectionYaml:
        """What ``data`` names, resolved: shapes, a COCO JSON or COCO-layout folder, or a dataset YAML (YOLO or COCO splits)."""
        from zoo_core.data import coco_format
        from zoo_core.data.dataset_yaml import read_dataset_yaml

        shapes_config = parse_shapes(data)
        if shapes_config:
            yaml_path = materialize_shapes(shapes_config) / self.shapes_yaml
        else:
            path = Path(data).expanduser()
            if path.suffix.lower() == coco_format.COCO_JSON_SUFFIX:
                return coco_format.coco_json_layout(path)
            if path.is_dir() and not any((path / name).is_file() for name in ("data.yaml", "dataset.yaml", "data.yml", "dataset.yml")):
                folder = coco_format.coco_folder_layout(path)
                if folder is not None:
                    return folder
            yaml_path = _resolve_yaml(data)
        content = read_dataset_yaml(yaml_path)
        if coco_format.names_coco_json(content):
            return coco_format.read_coco_yaml(yaml_path, content)
        return read_detection_yaml(yaml_path)

    def prepare(self, data: str | Path) -> DataSpec:
        layout = self._layout(data)
        yaml_path = layout.yaml_path
        for split, entries in layout.splits.items():
            for entry in entries:
                if not entry.exists():
                    raise DatasetError(f"{yaml_path}: {split} entry {entry} does not exist; check 'path' and '{split}'")
        return DataSpec(
            task=self.name,
            root=layout.root,
            names=layout.names,
            train=layout.splits["train"],
            val=layout.splits["val"],
            test=layout.splits.get("test"),
            extra={"yaml": str(yaml_path)},
        )

    def dataset(self, spec: DataSpec, split: str, image_size: int, augment: AugmentSettings | None) -> DetectionDataset:
        report = ProblemReport(f"{spec.root} ({split})")
        entries = list(spec.split(split))
        coco_entries = [entry for entry in entries if Path(entry).suffix.lower() == ".json"]
        yolo_entries = [entry for entry in entries if Path(entry).suffix.lower() != ".json"]
        records: list[DetectionRecord] = []
        if yolo_entries:
            records.extend(index_detection_split(yolo_entries, spec.label_names, what=report.what, report=report))
        if coco_entries:
            from zoo_core.data.coco_format import read_coco_instances

            for entry in coco_entries:
                for instance in read_coco_instances(Path(entry), spec.label_names, report, need_shapes=False).records:
                    # crowd regions are no boxes to learn or to score (see the module docstring)
                    records.append(DetectionRecord(instance.image, instance.height, instance.width, instance.labels[~instance.crowd]))
            if not yolo_entries:  # index_detection_split has finished the report otherwise
                report.finish()
            if not records:
                raise DatasetError(f"{report.what}: no usable image in {', '.join(map(str, coco_entries))}; see the warnings above")
        if split == "train" and not any(len(record.labels) for record in records):
            if coco_entries and not yolo_entries:
                raise DatasetError(
                    f"{', '.join(map(str, coco_entries))}: none of the {len(records)} training images has a box (crowd "
                    f"regions are left out); {report.count} problems were skipped (see the warnings above). A COCO file "
                    "needs 'annotations' with image_id, category_id and bbox [x, y, width, height] in pixels"
                )
            if report.skipped_lines:
                # The labels were found and read; every line of them was refused. Say so, and why.
                reasons = "; ".join(report.first_skipped_lines)
                raise DatasetError(
                    f"{spec.root}: none of the {len(records)} training images has a box because all "
                    f"{report.skipped_lines} label lines were skipped (first: {reasons}). Fix those lines: "
                    "YOLO labels are 'class cx cy w h' with class ids within names and coordinates normalised to [0, 1]"
                )
            example = label_path_for(records[0].image)
            raise DatasetError(
                f"{spec.root}: none of the {len(records)} training images has a box, so a detector would learn nothing. "
                f"YOLO-format labels are .txt files in a labels/ folder beside images/ (for {records[0].image} zoo "
                f"looked for {example}): check that folder's name and that its files are not empty"
            )
        return DetectionDataset(spec.relabelled(records), spec.names, image_size, augment if split == "train" else None,
                                self.input_pipeline)

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        return _collate_detection(samples)

    def preprocess(self, batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
        batch = move_to_device(batch, device)
        images = batch["images"]  # uint8 levels, or floats in [0, 1] from a pipeline that resizes in floats
        batch["images"] = images.float().div_(255) if images.dtype == torch.uint8 else images.float()
        return batch


    def resize_batch(self, batch: Mapping[str, Any], size: tuple[int, int]) -> dict[str, Any]:
        """The float images resized bilinearly to ``size`` (height, width), the pixel boxes of ``targets`` scaled with them."""
        images = batch["images"]
        height, width = images.shape[-2:]
        if (height, width) == tuple(size):
            return dict(batch)
        resized = torch.nn.functional.interpolate(images, size=tuple(size), mode="bilinear", align_corners=False)
        targets = batch["targets"].clone()
        scale = targets.new_tensor([size[1] / width, size[0] / height, size[1] / width, size[0] / height])
        targets[:, 2:6] *= scale
        return {**batch, "images": resized, "targets": targets}

    def default_loss(self, outputs: Any, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise ModelContractError(
            "detection has no task-level loss: the family's model must define loss(outputs, batch) -> (loss, items), "
            "with its own assigner (see zoo_core/tasks/base.py)"
        )

    #: What a model without ``postprocess`` is told its task needs (``_postprocess``).
    postprocess_contract = ("has no postprocess(outputs, conf, iou, max_det); a detection family's model must define it "
                            "(zoo_core/tasks/detect.py)")

    @classmethod
    def _postprocess(cls, model: torch.nn.Module) -> Any:
        postprocess = getattr(unwrap_model(model), "postprocess", None)
        if not callable(postprocess):
            raise ModelContractError(f"{type(unwrap_model(model)).__name__} {cls.postprocess_contract}")
        return postprocess

    def validate(
        self, model: torch.nn.Module, loader: Any, device: torch.device, names: Mapping[int, str], report: "ValidationReport | None" = None
    ) -> dict[str, float]:
        from zoo_core.tasks.metrics import OrderedMeanAveragePrecision

        postprocess = self._postprocess(model)
        # The per-class table and the report's curves need COCO's full precision table (extended_summary); the
        # confusion matrix is summed over ranks.
        metric = OrderedMeanAveragePrecision(extended_summary=True)
        confusion = None
        if report is not None:
            from zoo_core.reports.confusion import DetectionConfusionMatrix

            confusion = DetectionConfusionMatrix(len(names)).to(device)
        with torch.inference_mode():
            for batch_index, batch in enumerate(loader):
                batch = self.preprocess(batch, device)
                placements = [ImagePlacement(ratio_pad, shape) for ratio_pad, shape in zip(batch["ratio_pads"], batch["orig_shapes"])]
                outputs = model(batch["images"])
                detections = postprocess(outputs, conf=self.conf, iou=self.iou, max_det=self.max_det, placements=placements)
                targets = batch["targets"].float().cpu()
                predictions, truths = [], []
                for position, detection in enumerate(detections):
                    shape, ratio_pad = batch["orig_shapes"][position], batch["ratio_pads"][position]
                    predictions.append(
                        {
                            "boxes": detection["boxes"].detach().float().cpu().reshape(-1, 4),
                            "scores": detection["scores"].detach().float().cpu().reshape(-1),
                            "labels": detection["labels"].detach().long().cpu().reshape(-1),
                        }
                    )
                    rows = targets[targets[:, 0] == position]
                    truths.append({"boxes": boxes_to_original(rows[:, 2:6], ratio_pad, shape), "labels": rows[:, 1].long()})
                metric.update(predictions, truths, batch["indices"].cpu())
                if confusion is not None:
                    confusion.update(predictions, truths)
                if report is not None and report.draws_batch(batch_index):  # drawn on the input: boxes in its pixels
                    drawn = postprocess(outputs, conf=self.conf, iou=self.iou, max_det=self.max_det)
                    self._draw_validation_batch(report, batch_index, batch["images"], targets, drawn, names)
        values = metric.compute()
        map50_95, map50 = max(float(values["map"]), 0.0), max(float(values["map_50"]), 0.0)
        if report is not None and confusion is not None:
            from zoo_core.reports.confusion import plot_confusion_matrix
            from zoo_core.reports.detection_curves import plot_detection_curves

            matrix = confusion.compute()
            report.charts(lambda folder: plot_confusion_matrix(matrix, names, folder, background=True), confusion_matrix=matrix)
            report.charts(lambda folder: plot_detection_curves(values, names, folder))
        metrics = {
            "mAP50-95": map50_95,
            "mAP50": map50,
            "mAP75": max(float(values["map_75"]), 0.0),
            "mAR100": max(float(values["mar_100"]), 0.0),
            "fitness": detection_fitness(map50, map50_95),
        }
        return ValidationMetrics(metrics, detection_class_table(values, names))

    @staticmethod
    def _draw_validation_batch(
        report: "ValidationReport", index: int, images: torch.Tensor, targets: torch.Tensor, detections: list[dict[str, torch.Tensor]],
        names: Mapping[int, str],
    ) -> None:
        """``val_batch<index>_labels.jpg`` (the true boxes) and ``_pred.jpg`` (detections scoring at least 0.25)."""
        from zoo_core.reports.drawing import draw_box_batch

        report.image(f"val_batch{index}_labels.jpg", draw_box_batch(images, targets, names))
        rows = []
        for position, detection in enumerate(detections):
            keep = detection["scores"].detach().float().cpu() >= 0.25
            boxes = detection["boxes"].detach().float().cpu().reshape(-1, 4)[keep]
            rows.append(torch.cat([
                torch.full((len(boxes), 1), float(position)), detection["labels"].detach().float().cpu().reshape(-1, 1)[keep],
                boxes, detection["scores"].detach().float().cpu().reshape(-1, 1)[keep],
            ], dim=1))
        report.image(f"val_batch{index}_pred.jpg", draw_box_batch(images, torch.cat(rows) if rows else torch.zeros(0, 7), names))

    def draw_batch(self, batch: Mapping[str, Any], names: Mapping[int, str]) -> torch.Tensor:
        from zoo_core.reports.drawing import draw_box_batch

        return draw_box_batch(batch["images"], batch["targets"], names)

    def plot_training_set(self, dataset: Any, folder: Path) -> list[Path]:
        from zoo_core.reports.dataset_labels import plot_detection_labels

        records = getattr(dataset, "records", None)
        if records is None:
            return []
        return [plot_detection_labels([record.labels for record in records], dataset.names, folder / "labels.jpg")]

    def example_batch(self, batch_size: int, image_size: int, num_classes: int) -> dict[str, Any]:
        boxes_per_image = 4
        count = batch_size * boxes_per_image
        centres = torch.rand(count, 2) * image_size * 0.6 + image_size * 0.2
        sizes = torch.rand(count, 2) * image_size * 0.3 + 4
        boxes = torch.cat([centres - sizes / 2, centres + sizes / 2], dim=1).clamp(0, image_size)
        targets = torch.cat(
            [
                torch.arange(batch_size).repeat_interleave(boxes_per_image).float()[:, None],
                torch.randint(0, max(num_classes, 1), (count, 1)).float(),
                boxes,
            ],
            dim=1,
        )
        return {
            "images": torch.randint(0, 256, (batch_size, 3, image_size, image_size), dtype=torch.uint8),
            "targets": targets,
            "orig_shapes": [(image_size, image_size)] * batch_size,
            "ratio_pads": [((1.0, 1.0), (0.0, 0.0))] * batch_size,
            "paths": [f"example{index}" for index in range(batch_size)],
            "indices": torch.arange(batch_size),
        }

    def predict(
        self,
        model: torch.nn.Module,
        sources: "list[SourceImage]",
        device: torch.device,
        image_size: int,
        names: Mapping[int, str],
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
    ) -> list[DetectionResult]:
        postprocess = self._postprocess(model)
        results = []
        with torch.inference_mode():
            for source in sources:
                image, _, ratio_pad = fit_to_input(source.image, image_size, self.input_pipeline)
                outputs = model(self.preprocess({"images": image[None]}, device)["images"])
                shape = (int(source.image.shape[-2]), int(source.image.shape[-1]))
                (detection,) = postprocess(outputs, conf=conf, iou=iou, max_det=max_det, placements=[ImagePlacement(ratio_pad, shape)])
                results.append(self._result(source, names, detection, shape))
        return results

    def _result(self, source: "SourceImage", names: Mapping[int, str], detection: Mapping[str, torch.Tensor],
                shape: tuple[int, int]) -> DetectionResult:
        """The result ``predict`` returns for ``source`` from its postprocess dict (in original pixels, of ``shape``)."""
        return DetectionResult(
            orig_image=source.image,
            path=source.path,
            name=source.name,
            names=dict(names),
            boxes=detection["boxes"].detach().float().cpu().reshape(-1, 4),
            scores=detection["scores"].detach().float().cpu().reshape(-1),
            labels=detection["labels"].detach().long().cpu().reshape(-1),
        )
