"""Instance segmentation: boxes plus one mask per object, COCO box and mask mAP.

Data: what the detection task reads, with every object's region (``zoo_core.data.instances``): a
YOLO segmentation dataset (``class x1 y1 x2 y2 ...`` polygon lines), COCO instance JSON, or
``"shapes"`` (its ``segment.yaml``). ``zoo_core.data.instance_readers.index_instance_split`` reads
them into ``InstanceRecord`` s; each object's polygons or RLE are rasterised at the image's own size
(pycocotools, as COCO rasterises them) into an ``n×H×W`` uint8 stack. Crowd regions (COCO's
``iscrowd``) never enter a training sample; validation keeps them aside for the metric, which
ignores detections on them as COCO does.

Augmentation is the detection task's — mosaic, random affine, MixUp, horizontal flip, HSV, the
family's letterbox — with the mask stack moved by the same transforms (nearest neighbour,
``zoo_core/data/augment.py``); after them each box is re-derived from its mask, so a rotated object
keeps a tight box, and objects whose mask vanished are dropped.

Batch (after ``collate``): the detection keys (``images``, ``targets`` M×6, ``orig_shapes``,
``ratio_pads``, ``paths``, ``indices``) plus ``masks`` (M×S×S uint8 in {0, 1}, row i the mask of
``targets`` row i, in input pixels). Validation samples also carry ``instance_truths``: per image
the objects at the original size (boxes, classes, crowd flags and COCO RLEs, so a batch stays
small whatever the image size).

Model contract: eval outputs are a dict with ``boxes``, ``scores``, ``mask_coefficients`` and
``mask_features`` (``zoo_core/tasks/base.py``); ``model.postprocess(outputs, conf, iou, max_det,
placements=...)`` returns per image the detection keys plus ``masks`` (n×H×W bool, in original
pixels with ``placements``); ``model.loss`` reads ``targets`` and ``masks``.

Metrics: COCO box and mask mAP (torchmetrics ``MeanAveragePrecision``, pycocotools, in original
pixels): ``mAP50-95``, ``mAP50``, ``mAP75``, ``mAR100`` for boxes, ``mask_mAP50-95``,
``mask_mAP50``, ``mask_mAP75``, and ``fitness``, the box fitness plus the mask fitness (each
``0.1 mAP50 + 0.9 mAP50-95``), as Ultralytics' segment fitness sums them.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from zoo_core.data.augment import (
    apply_v2,
    color_jitter,
    keep_visible_instances,
    make_boxes,
    mosaic4,
    random_affine,
    resize_long_side,
)
from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.input_pipeline import boxes_to_input, fit_to_input
from zoo_core.data.instances import mask_to_rle
from zoo_core.ops.boxes import ImagePlacement
from zoo_core.tasks.base import AugmentSettings, DataSpec, ModelContractError
from zoo_core.tasks.class_table import ValidationMetrics, detection_class_table
from zoo_core.tasks.detect import DetectionDataset, DetectTask, _collate_detection, detection_fitness
from zoo_core.tasks.predictions import InstanceSegmentationResult

if TYPE_CHECKING:
    from zoo_core.data.images import SourceImage
    from zoo_core.data.instances import InstanceRecord
    from zoo_core.reports.validation_report import ValidationReport

__all__ = ["SegmentTask", "InstanceSegmentationDataset", "segment_fitness", "rles_to_masks"]

#: Where the objects of an augmented sample were: (image, unclipped boxes, classes, n×H×W uint8 masks).
Instances = tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]


def segment_fitness(box_map50: float, box_map50_95: float, mask_map50: float, mask_map50_95: float) -> float:
    """Ultralytics' segment model-selection score: the box fitness plus the mask fitness (each ``0.1 mAP50 + 0.9 mAP50-95``)."""
    return detection_fitness(box_map50, box_map50_95) + detection_fitness(mask_map50, mask_map50_95)


def rles_to_masks(rles: list[dict[str, Any]], shape: tuple[int, int]) -> torch.Tensor:
    """COCO RLEs of one image decoded into an ``n×H×W`` bool tensor (``n`` may be 0)."""
    from pycocotools import mask as mask_utils

    if not rles:
        return torch.zeros((0, *shape), dtype=torch.bool)
    decoded = mask_utils.decode(list(rles))  # H×W×n
    return torch.from_numpy(np.ascontiguousarray(decoded.transpose(2, 0, 1))).bool()


class InstanceSegmentationDataset(DetectionDataset):
    """Images fitted to the input with their boxes and one mask per object; random mosaic/MixUp/affine/flip/HSV
    when ``augment`` is on, the masks moved with the pixels and the boxes re-derived from them.

    A sample is a detection sample plus ``masks`` (n×S×S uint8 in {0, 1}, aligned with ``boxes``) and, when
    not augmented, ``instance_truths`` (the objects at the original size, crowd regions included, for the metric).
    """

    records: list["InstanceRecord"]

    def load_instances(self, index: int) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """Image ``index`` (uint8 3×H×W), its boxes in pixels, classes (int64) and masks (n×H×W uint8), crowd
        regions left out (``instance_truths`` keeps them for the metric)."""
        record = self.records[index]
        image = self.read_image(record.image)
        height, width = int(image.shape[-2]), int(image.shape[-1])
        keep = ~np.asarray(record.crowd, dtype=bool)
        labels = torch.from_numpy(np.asarray(record.labels, dtype=np.float32)[keep]).reshape(-1, 5)
        scale = torch.tensor([width, height, width, height], dtype=torch.float32)
        boxes = make_boxes(labels[:, 1:] * scale, (height, width))
        shapes = [shape for shape, kept in zip(record.shapes, keep) if kept]
        masks = torch.zeros((len(shapes), height, width), dtype=torch.uint8)
        for position, shape in enumerate(shapes):
            masks[position] = torch.from_numpy(shape.rasterise(height, width))
        return image, boxes, labels[:, 0].long(), masks

    def instance_truths(self, index: int) -> dict[str, Any]:
        """The objects of image ``index`` as the metric scores them: original-pixel boxes, classes, crowd flags, RLEs."""
        record = self.records[index]
        height, width = record.height, record.width
        labels = torch.from_numpy(np.asarray(record.labels, dtype=np.float32)).reshape(-1, 5)
        scale = torch.tensor([width, height, width, height], dtype=torch.float32)
        rles = [shape.rle if shape.rle is not None and not isinstance(shape.rle.get("counts"), list)
                else mask_to_rle(shape.rasterise(height, width)) for shape in record.shapes]
        return {
            "boxes": labels[:, 1:] * scale,
            "labels": labels[:, 0].long(),
            "iscrowd": torch.from_numpy(np.asarray(record.crowd, dtype=bool)).long(),
            "rles": rles,
            "shape": (height, width),
        }

    def fitted_instances(self, index: int) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor, tuple[int, int], Any]:
        """Image ``index`` fitted to the input by the pipeline, its boxes and masks with it, classes, original shape, geometry."""
        image, boxes, classes, masks = self.load_instances(index)
        original_shape = (int(image.shape[-2]), int(image.shape[-1]))
        pipeline = self.pipeline if self.augment is None else self.pipeline.merged({"resize_in_float": False})
        image, masks, ratio_pad = fit_to_input(image, self.image_size, pipeline, mask=masks, mask_fill=0)
        canvas = tuple(int(side) for side in image.shape[-2:])
        boxes = make_boxes(boxes_to_input(boxes.as_subclass(torch.Tensor), ratio_pad), canvas)
        return image, boxes, classes, masks, original_shape, ratio_pad

    def _mosaic_instances(self, index: int, settings: AugmentSettings) -> Instances:
        """Image ``index`` and three random others in a 2×2 mosaic with their masks, warped and cropped to the input size."""
        size = self.image_size
        pieces, piece_masks = [], []
        for piece_index in [index] + [random.randrange(len(self.records)) for _ in range(3)]:
            piece_image, piece_boxes, piece_classes, masks = self.load_instances(piece_index)
            piece_image, piece_boxes, masks, _ = resize_long_side(piece_image, size, boxes=piece_boxes, mask=masks)
            pieces.append((piece_image, piece_boxes, piece_classes))
            piece_masks.append(masks)
        image, boxes, classes, placed = mosaic4(pieces, size, masks=piece_masks)
        affine = random_affine(settings, output_size=(size, size), mask_fill=0)
        if affine is not None:  # one warp of the canvas straight onto the centred input-size crop, each piece's masks with it
            params = affine.make_params([tv_tensors.Image(image)])
            warped_image = affine.transform(tv_tensors.Image(image), params).as_subclass(torch.Tensor)
            return warped_image, affine.transform(boxes, params), classes, placed.warp(params["matrix"], (size, size))
        return F.center_crop(image, [size, size]), F.center_crop(boxes, [size, size]), classes, placed.crop((size, size))

    def _mixup_instances(self, first: Instances, second: Instances) -> Instances:
        """MixUp of two mosaics (``DetectionDataset._mixup``'s blend), both sets of objects and masks kept."""
        ratio = random.betavariate(32.0, 32.0)
        image = (first[0].float() * ratio + second[0].float() * (1.0 - ratio)).round_().to(torch.uint8)
        boxes = torch.cat([first[1].as_subclass(torch.Tensor), second[1].as_subclass(torch.Tensor)])
        return (image, make_boxes(boxes, (self.image_size, self.image_size)), torch.cat([first[2], second[2]]),
                torch.cat([first[3], second[3]]))

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self.records[index]
        size = self.image_size
        settings = self.augment
        if settings is None:
            image, boxes, classes, masks, original_shape, ratio_pad = self.fitted_instances(index)
        elif settings.mosaic > 0 and random.random() < settings.mosaic:
            image, boxes, classes, masks = self._mosaic_instances(index, settings)
            if settings.mixup > 0 and random.random() < settings.mixup:
                other = self._mosaic_instances(random.randrange(len(self)), settings)
                image, boxes, classes, masks = self._mixup_instances((image, boxes, classes, masks), other)
            original_shape, ratio_pad = (size, size), ((1.0, 1.0), (0.0, 0.0))
        else:
            image, boxes, classes, masks, original_shape, ratio_pad = self.fitted_instances(index)
            affine = random_affine(settings, mask_fill=0)
            if affine is not None:
                image, boxes, warped = apply_v2(affine, image, boxes, tv_tensors.Mask(masks))
                masks = warped.as_subclass(torch.Tensor)
        if settings is None:  # validation scores every labelled object as its label file gives it
            boxes = boxes.as_subclass(torch.Tensor).reshape(-1, 4)
        else:
            boxes, classes, masks = keep_visible_instances(boxes, classes, masks)
            if settings.fliplr > 0 and random.random() < settings.fliplr:
                image, masks = image.flip(-1), masks.flip(-1)
                boxes = torch.stack([size - boxes[:, 2], boxes[:, 1], size - boxes[:, 0], boxes[:, 3]], dim=1)
            if settings.flipud > 0 and random.random() < settings.flipud:  # no draw at the default 0: runs stay as they were
                image, masks = image.flip(-2), masks.flip(-2)
                boxes = torch.stack([boxes[:, 0], size - boxes[:, 3], boxes[:, 2], size - boxes[:, 1]], dim=1)
            jitter = color_jitter(settings)
            if jitter is not None:
                (image,) = apply_v2(jitter, image)
        sample = {
            "image": image.contiguous(),
            "boxes": boxes.reshape(-1, 4),
            "classes": classes,
            "masks": masks.as_subclass(torch.Tensor).to(torch.uint8).clamp_(max=1).contiguous(),
            "orig_shape": (int(original_shape[0]), int(original_shape[1])),
            "ratio_pad": ratio_pad,
            "path": str(record.image),
            "index": index,
        }
        if settings is None:
            sample["instance_truths"] = self.instance_truths(index)
        return sample


def _collate_instances(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The detection batch plus ``masks`` (M×S×S uint8, in ``targets`` order) and, for validation, ``instance_truths``."""
    batch = _collate_detection(samples)
    height, width = batch["images"].shape[-2:]
    masks = [sample["masks"] for sample in samples if len(sample["masks"])]
    batch["masks"] = torch.cat(masks) if masks else torch.zeros((0, height, width), dtype=torch.uint8)
    if all("instance_truths" in sample for sample in samples):
        batch["instance_truths"] = [sample["instance_truths"] for sample in samples]
    return batch


class SegmentTask(DetectTask):
    """Instance segmentation (boxes and a mask per object); fitness is the box plus the mask fitness.

    ``conf``, ``iou`` and ``max_det`` are the thresholds ``validate`` hands to the family's ``postprocess``
    (as detection's). ``prepare``, ``preprocess`` and the loss contract are the detection task's.
    """

    name = "segment"
    fitness_metric = "fitness"
    export_outputs = ("boxes", "scores", "mask_coefficients", "mask_features")
    result_type = "zoo_core.tasks.predictions:InstanceSegmentationResult"
    shapes_yaml = "segment.yaml"
    # Samples rasterise polygons with pycocotools, so a training worker needs it before its first step.
    worker_modules = ("pycocotools.mask",)

    def dataset(self, spec: DataSpec, split: str, image_size: int, augment: AugmentSettings | None) -> InstanceSegmentationDataset:
        from zoo_core.data.instance_readers import index_instance_split

        report = ProblemReport(f"{spec.root} ({split})")
        records = spec.relabelled(index_instance_split(list(spec.split(split)), spec.label_names, what=report.what, report=report))
        if split == "train" and not any(len(record.labels) and not np.all(record.crowd) for record in records):
            skipped = f" ({report.skipped_lines} label lines were skipped, first: {'; '.join(report.first_skipped_lines)})" \
                if report.skipped_lines else ""
            raise DatasetError(
                f"{spec.root}: none of the {len(records)} training images has an object outline{skipped}, so a segmenter "
                "would learn nothing. Instance segmentation reads YOLO segmentation labels ('class x1 y1 x2 y2 ...', "
                "normalised polygon points, in a labels/ folder beside images/) or COCO instance JSON with 'segmentation'"
            )
        return InstanceSegmentationDataset(records, spec.names, image_size, augment if split == "train" else None, self.input_pipeline)

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        return _collate_instances(samples)

    def resize_batch(self, batch: Mapping[str, Any], size: tuple[int, int]) -> dict[str, Any]:
        """Detection's resize (images bilinear, ``targets`` scaled) with the ``masks`` resized by nearest neighbour."""
        resized = super().resize_batch(batch, size)
        masks = batch["masks"]
        if tuple(masks.shape[-2:]) != tuple(size):
            if len(masks):
                masks = torch.nn.functional.interpolate(masks[None].float(), size=tuple(size), mode="nearest")[0].to(masks.dtype)
            else:
                masks = masks.new_zeros((0, *size))
        return {**resized, "masks": masks}

    def default_loss(self, outputs: Any, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise ModelContractError(
            "instance segmentation has no task-level loss: the family's model must define loss(outputs, batch) -> "
            "(loss, items), reading batch['targets'] and batch['masks'] (see zoo_core/tasks/base.py)"
        )

    postprocess_contract = ("has no postprocess(outputs, conf, iou, max_det, placements); an instance segmentation "
                            "family's model must define it and return boxes, scores, labels and masks (zoo_core/tasks/segment.py)")

    @staticmethod
    def _instances(found: Mapping[str, torch.Tensor], shape: tuple[int, int]) -> dict[str, torch.Tensor]:
        """A postprocess dict on the CPU in the metric's types (``masks`` n×H×W bool of ``shape``), its contract checked."""
        if "masks" not in found:
            raise ModelContractError(
                f"postprocess returned {sorted(found)}; an instance segmentation model also returns 'masks' (n×H×W bool) per "
                "image (zoo_core/tasks/segment.py)"
            )
        masks = found["masks"].detach().cpu()
        if masks.ndim != 3 or tuple(masks.shape[-2:]) != tuple(shape) or len(masks) != len(found["boxes"]):
            raise ModelContractError(
                f"postprocess returned masks of shape {tuple(masks.shape)} for {len(found['boxes'])} boxes on an image of "
                f"{tuple(shape)}; give one H×W mask per box, at the size placements ask for (zoo_core/tasks/segment.py)"
            )
        return {
            "boxes": found["boxes"].detach().float().cpu().reshape(-1, 4),
            "scores": found["scores"].detach().float().cpu().reshape(-1),
            "labels": found["labels"].detach().long().cpu().reshape(-1),
            "masks": masks.bool() if masks.dtype == torch.bool else masks > 0.5,
        }

    def validate(
        self, model: torch.nn.Module, loader: Any, device: torch.device, names: Mapping[int, str], report: "ValidationReport | None" = None
    ) -> dict[str, float]:
        from zoo_core.tasks.metrics import OrderedMeanAveragePrecision

        postprocess = self._postprocess(model)
        # Masks are held as COCO RLEs from update on (torchmetrics encodes them), so memory grows with the objects, not the pixels.
        metric = OrderedMeanAveragePrecision(iou_type=("bbox", "segm"), extended_summary=True)  # the class table needs it
        confusion = None
        if report is not None:
            from zoo_core.reports.confusion import DetectionConfusionMatrix

            confusion = DetectionConfusionMatrix(len(names)).to(device)
        with torch.inference_mode():
            for batch_index, batch in enumerate(loader):
                if "instance_truths" not in batch:
                    raise ValueError("segment validation needs the un-augmented dataset's batches (they carry 'instance_truths')")
                batch = self.preprocess(batch, device)
                placements = [ImagePlacement(ratio_pad, shape) for ratio_pad, shape in zip(batch["ratio_pads"], batch["orig_shapes"])]
                outputs = model(batch["images"])
                found = postprocess(outputs, conf=self.conf, iou=self.iou, max_det=self.max_det, placements=placements)
                predictions, truths = [], []
                for position, (detection, truth) in enumerate(zip(found, batch["instance_truths"])):
                    shape = tuple(batch["orig_shapes"][position])
                    predictions.append(self._instances(detection, shape))
                    truths.append({"boxes": truth["boxes"], "labels": truth["labels"], "iscrowd": truth["iscrowd"],
                                   "masks": rles_to_masks(truth["rles"], shape)})
                metric.update(predictions, truths, batch["indices"].cpu())
                if confusion is not None:
                    # The confusion matrix counts boxes of the objects a model should find: crowd regions are left out.
                    confusion.update([{key: item[key] for key in ("boxes", "scores", "labels")} for item in predictions],
                                     [{"boxes": t["boxes"][t["iscrowd"] == 0], "labels": t["labels"][t["iscrowd"] == 0]} for t in truths])
                if report is not None and report.draws_batch(batch_index):  # drawn on the input: boxes and masks in its pixels
                    drawn = postprocess(outputs, conf=self.conf, iou=self.iou, max_det=self.max_det)
                    self._draw_instance_validation_batch(report, batch_index, batch, drawn, names)
        values = metric.compute()

        def value(key: str) -> float:  # torchmetrics reports -1 where there was nothing to score
            return max(float(values[key]), 0.0)

        box_map50_95, box_map50 = value("bbox_map"), value("bbox_map_50")
        mask_map50_95, mask_map50 = value("segm_map"), value("segm_map_50")
        # The curves and the class table are the boxes' (the keys of a box-only metric); the class list and the label
        # counts are shared by both IoU types.
        box_values = {**{key: item for key, item in values.items() if not key.startswith(("bbox_", "segm_"))},
                      **{key[len("bbox_"):]: item for key, item in values.items() if key.startswith("bbox_")}}
        if report is not None and confusion is not None:
            from zoo_core.reports.confusion import plot_confusion_matrix
            from zoo_core.reports.detection_curves import plot_detection_curves

            matrix = confusion.compute()
            report.charts(lambda folder: plot_confusion_matrix(matrix, names, folder, background=True), confusion_matrix=matrix)
            report.charts(lambda folder: plot_detection_curves(box_values, names, folder))
        metrics = {
            "mAP50-95": box_map50_95,
            "mAP50": box_map50,
            "mAP75": value("bbox_map_75"),
            "mAR100": value("bbox_mar_100"),
            "mask_mAP50-95": mask_map50_95,
            "mask_mAP50": mask_map50,
            "mask_mAP75": value("segm_map_75"),
            "fitness": segment_fitness(box_map50, box_map50_95, mask_map50, mask_map50_95),
        }
        return ValidationMetrics(metrics, detection_class_table(box_values, names))

    @staticmethod
    def _draw_instance_validation_batch(
        report: "ValidationReport", index: int, batch: Mapping[str, Any], found: list[dict[str, torch.Tensor]], names: Mapping[int, str],
    ) -> None:
        """``val_batch<index>_labels.jpg`` (the true boxes and masks) and ``_pred.jpg`` (objects scoring at least 0.25)."""
        from zoo_core.reports.drawing import draw_instance_batch

        images = batch["images"]
        report.image(f"val_batch{index}_labels.jpg", draw_instance_batch(images, batch["targets"], batch["masks"], names))
        rows, masks = [], []
        for position, detection in enumerate(found):
            keep = detection["scores"].detach().float().cpu() >= 0.25
            boxes = detection["boxes"].detach().float().cpu().reshape(-1, 4)[keep]
            rows.append(torch.cat([
                torch.full((len(boxes), 1), float(position)), detection["labels"].detach().float().cpu().reshape(-1, 1)[keep],
                boxes, detection["scores"].detach().float().cpu().reshape(-1, 1)[keep],
            ], dim=1))
            masks.append(detection["masks"].detach().cpu()[keep].bool())
        height, width = images.shape[-2:]
        report.image(f"val_batch{index}_pred.jpg", draw_instance_batch(
            images, torch.cat(rows) if rows else torch.zeros(0, 7), torch.cat(masks) if masks else torch.zeros(0, height, width), names))

    def draw_batch(self, batch: Mapping[str, Any], names: Mapping[int, str]) -> torch.Tensor:
        from zoo_core.reports.drawing import draw_instance_batch

        return draw_instance_batch(batch["images"], batch["targets"], batch["masks"], names)

    def example_batch(self, batch_size: int, image_size: int, num_classes: int) -> dict[str, Any]:
        batch = super().example_batch(batch_size, image_size, num_classes)
        # Each synthetic object's mask fills its box, so masks and targets agree as a real batch's do.
        columns = torch.arange(image_size).float() + 0.5
        boxes = batch["targets"][:, 2:6]
        inside_x = (columns[None, :] >= boxes[:, 0:1]) & (columns[None, :] < boxes[:, 2:3])
        inside_y = (columns[None, :] >= boxes[:, 1:2]) & (columns[None, :] < boxes[:, 3:4])
        batch["masks"] = (inside_y[:, :, None] & inside_x[:, None, :]).to(torch.uint8)
        return batch

    def _result(self, source: "SourceImage", names: Mapping[int, str], detection: Mapping[str, torch.Tensor],
                shape: tuple[int, int]) -> InstanceSegmentationResult:
        """Detection's result plus the masks (n×H×W bool at the original size), the postprocess contract checked."""
        found = self._instances(detection, shape)
        return InstanceSegmentationResult(
            orig_image=source.image, path=source.path, name=source.name, names=dict(names),
            boxes=found["boxes"], scores=found["scores"], labels=found["labels"], masks=found["masks"],
        )
