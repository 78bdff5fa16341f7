"""Semantic segmentation: images with PNG class-index masks, mIoU.

Data: a YAML naming image and mask folders (``zoo_core.data.mask_format``), a YOLO segmentation
dataset YAML (its polygons rasterised into class masks, ``background`` added as class 0: the rule is in
``zoo_core.data.mask_format``), or ``"shapes"`` (class 0 is ``background``). The input size is an
int (a square) or ``(height, width)`` (PP-LiteSeg trains on 512×1024 Cityscapes crops). Samples are fitted to ``H×W`` by the family's
input pipeline (``zoo_core/data/input_pipeline.py``): letterboxed (aspect kept, images padded grey,
masks padded with ``ignore_index`` so padding counts in neither loss nor metric) or stretched, as
its published weights expect. Training adds random affine, horizontal flip and HSV jitter (masks
move with the pixels, nearest neighbour; uncovered mask pixels become ``ignore_index``).

Batch (after ``preprocess``): ``images`` ImageNet-normalised, ``masks`` N×H×W int64,
``ignore_index`` (int), plus ``orig_shapes``, ``ratio_pads``, ``paths``, ``indices``.
Model contract: in eval mode ``model(images)`` returns logits N×C×H×W.
Prediction fits each image to the input size the same way and maps the logits back to the image
(a letterbox's padding cut off), or with ``tile=True`` keeps its resolution and predicts it window
by window (``zoo_core.ops.sliding_window``).
Metrics: mIoU (torchmetrics ``MulticlassJaccardIndex``, macro over the classes present in the
predictions or the masks, from the confusion matrix of all validation pixels) and pixel accuracy,
measured at the input resolution on the fitted masks (padding ignored).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors

from torchvision.transforms.v2 import functional as TF

from zoo_core.data.augment import PAD_VALUE, apply_v2, color_jitter, random_affine
from zoo_core.data.dataset_yaml import YAML_SUFFIXES
from zoo_core.data.errors import DatasetError
from zoo_core.data.images import read_image
from zoo_core.data.input_pipeline import fit_to_input, logits_to_original
from zoo_core.data.mask_format import (
    PolygonMaskRecord,
    SemanticRecord,
    class_mask_from_instances,
    index_polygon_split,
    index_semantic_split,
    read_semantic_yaml,
)
from zoo_core.data.shapes import materialize_shapes, parse_shapes
from zoo_core.registry import ImageSize, InputPipeline, image_size_hw, normalise_image_size
from zoo_core.tasks.base import AugmentSettings, DataSpec, ModelContractError, Task, move_to_device
from zoo_core.tasks.classify import imagenet_normalise
from zoo_core.tasks.predictions import SegmentationResult

if TYPE_CHECKING:
    from zoo_core.data.images import SourceImage
    from zoo_core.reports.validation_report import ValidationReport

__all__ = ["SemanticTask", "SemanticDataset", "read_mask"]

# Sliding-window prediction (tile=True): windows overlap by a third of their side, as the
# segmentation toolkits' "slide" test mode (512 px crops 341 px apart).
TILE_OVERLAP = 1 / 3


def read_mask(path: Path) -> torch.Tensor:
    """A class-index mask file as an ``H×W`` tensor (uint8 for 8-bit PNGs, int32 for 16-bit)."""
    from PIL import Image

    try:
        with Image.open(path) as mask:
            values = np.array(mask)
    except Exception as error:
        raise DatasetError(f"{path}: cannot decode mask ({type(error).__name__}: {error}); remove or replace the file") from error
    if values.dtype != np.uint8:
        values = values.astype(np.int32)
    return torch.from_numpy(values)


def draw_mask_batch(images: torch.Tensor, masks: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The first images of a batch in a grid, each with the class-index ``masks`` overlaid (``ignore_index`` left bare)."""
    from zoo_core.reports.drawing import IMAGES_PER_GRID, as_uint8_images, draw_mask, image_grid

    images = as_uint8_images(images[:IMAGES_PER_GRID])
    return image_grid([draw_mask(image, mask, ignore_index=ignore_index) for image, mask in zip(images, masks.cpu())])


class SemanticDataset(Dataset):
    """(image, mask) pairs fitted to the input by ``pipeline``; random affine/flip/HSV when ``augment`` is on."""

    def __init__(self, records: list[SemanticRecord] | list[PolygonMaskRecord], image_size: ImageSize, ignore_index: int,
                 augment: AugmentSettings | None, pipeline: InputPipeline | None = None) -> None:
        self.records = records
        self.image_size = normalise_image_size(image_size, "image_size", minimum=16)
        self.ignore_index = ignore_index
        self.augment = augment if augment is not None and augment.enabled else None
        self.pipeline = (pipeline or SemanticTask.default_input_pipeline).merged({"resize_in_float": False})

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self.records[index]
        image = read_image(record.image)
        if isinstance(record, PolygonMaskRecord):
            mask = torch.from_numpy(class_mask_from_instances(record.instances, self.ignore_index))
        else:
            mask = read_mask(record.mask)
        if tuple(mask.shape) != tuple(image.shape[-2:]):
            raise DatasetError(f"{getattr(record, 'mask', record.image)}: mask size {tuple(mask.shape)} differs from its image {tuple(image.shape[-2:])}")
        if mask.dtype == torch.uint8 and not 0 <= self.ignore_index <= 255:
            mask = mask.to(torch.int32)  # so padding can hold an ignore_index beyond 8 bits
        original_shape = (int(image.shape[-2]), int(image.shape[-1]))
        image, mask, ratio_pad = fit_to_input(image, self.image_size, self.pipeline, mask=mask, mask_fill=self.ignore_index)
        settings = self.augment
        if settings is not None:
            affine = random_affine(settings, mask_fill=self.ignore_index)
            if affine is not None:
                image, mask = apply_v2(affine, image, tv_tensors.Mask(mask))
                mask = mask.as_subclass(torch.Tensor)
            if settings.fliplr > 0 and random.random() < settings.fliplr:
                image, mask = image.flip(-1), mask.flip(-1)
            if settings.flipud > 0 and random.random() < settings.flipud:  # no draw at the default 0
                image, mask = image.flip(-2), mask.flip(-2)
            jitter = color_jitter(settings)
            if jitter is not None:
                (image,) = apply_v2(jitter, image)
        return {
            "image": image.contiguous(),
            "mask": mask.contiguous(),
            "ignore_index": self.ignore_index,
            "orig_shape": original_shape,
            "ratio_pad": ratio_pad,
            "path": str(record.image),
            "index": index,
        }


def _resolve_yaml(data: str | Path) -> Path:
    path = Path(data).expanduser()
    if path.is_dir():
        for name in ("data.yaml", "semantic.yaml", "dataset.yaml"):
            if (path / name).is_file():
                return path / name
        raise DatasetError(f"{path} is a folder without data.yaml; give the semantic dataset YAML (path/train/val/names)")
    if path.suffix.lower() not in YAML_SUFFIXES:
        raise DatasetError(f"semantic data {str(data)!r} must be a dataset YAML (.yaml), a folder holding data.yaml, or 'shapes'")
    if not path.is_file():
        raise DatasetError(f"semantic dataset YAML {path} does not exist; check the path")
    return path


class SemanticTask(Task):
    """Semantic segmentation; fitness is mIoU."""

    name = "semantic"
    fitness_metric = "mIoU"
    size_multiple = 32
    export_outputs = ("logits",)
    result_type = "zoo_core.tasks.predictions:SegmentationResult"
    supports_tiling = True
    default_input_pipeline = InputPipeline(resize="letterbox")  # top-left, OpenCV bilinear

    def prepare(self, data: str | Path) -> DataSpec:
        shapes_config = parse_shapes(data)
        yaml_path = materialize_shapes(shapes_config) / "semantic.yaml" if shapes_config else _resolve_yaml(data)
        layout = read_semantic_yaml(yaml_path)
        for split_name, split in layout.splits.items():
            for entry in split.images:
                if not entry.exists():
                    raise DatasetError(f"{yaml_path}: {split_name} images {entry} does not exist; check 'path' and '{split_name}'")
        return DataSpec(
            task=self.name,
            root=layout.root,
            names=layout.names,
            train=layout.splits["train"],
            val=layout.splits["val"],
            test=layout.splits.get("test"),
            extra={"ignore_index": layout.ignore_index, "yaml": str(yaml_path), "polygon_labels": layout.polygon_labels},
        )

    def dataset(self, spec: DataSpec, split: str, image_size: ImageSize, augment: AugmentSettings | None) -> SemanticDataset:
        ignore_index = int(spec.extra.get("ignore_index", 255))
        what = f"{spec.root} ({split})"
        if spec.extra.get("polygon_labels"):
            records: Any = index_polygon_split(spec.split(split), spec.names, what=what)
        else:
            records = index_semantic_split(spec.split(split), spec.names, ignore_index, what=what)
        return SemanticDataset(records, image_size, ignore_index, augment if split == "train" else None, self.input_pipeline)

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        return {
            "images": torch.stack([sample["image"] for sample in samples]),
            "masks": torch.stack([sample["mask"] for sample in samples]),
            "ignore_index": int(samples[0]["ignore_index"]),
            "orig_shapes": [sample["orig_shape"] for sample in samples],
            "ratio_pads": [sample["ratio_pad"] for sample in samples],
            "paths": [sample["path"] for sample in samples],
            "indices": torch.tensor([sample["index"] for sample in samples], dtype=torch.long),
        }

    def preprocess(self, batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
        batch = move_to_device(batch, device)
        batch["images"] = imagenet_normalise(batch["images"], device)
        batch["masks"] = batch["masks"].long()
        return batch

    def default_loss(self, outputs: Any, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        from zoo_core.losses.segmentation import pixel_cross_entropy

        if not isinstance(outputs, torch.Tensor):
            raise ModelContractError(
                f"the default semantic loss needs logits N×C×H×W, got {type(outputs).__name__}; "
                "a model with auxiliary heads must define its own loss(outputs, batch)"
            )
        loss = pixel_cross_entropy(outputs, batch["masks"], int(batch["ignore_index"]))
        return loss, {"ce": loss.detach()}

    @staticmethod
    def _logits(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        logits = model(images)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 4:
            raise ModelContractError(
                f"a semantic model must return logits N×C×H×W in eval mode, got {getattr(logits, 'shape', type(logits).__name__)}"
            )
        if tuple(logits.shape[-2:]) != tuple(images.shape[-2:]):
            logits = torch.nn.functional.interpolate(logits, size=images.shape[-2:], mode="bilinear", align_corners=False)
        return logits

    def validate(
        self, model: torch.nn.Module, loader: Any, device: torch.device, names: Mapping[int, str], report: "ValidationReport | None" = None
    ) -> dict[str, float]:
        from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

        num_classes = len(names)
        metrics: dict[str, Any] = {}

        def make_metrics(ignore_index: int) -> None:
            metrics["mIoU"] = MulticlassJaccardIndex(num_classes=num_classes, ignore_index=ignore_index, average="macro").to(device)
            metrics["pixel_acc"] = MulticlassAccuracy(num_classes=num_classes, ignore_index=ignore_index, average="micro").to(device)
            if report is not None:  # per-class IoU for the report's bar chart (not a returned metric)
                metrics["per_class_iou"] = MulticlassJaccardIndex(num_classes=num_classes, ignore_index=ignore_index, average="none").to(device)

        # Made before the loop when the dataset tells the ignore index, so that a rank whose
        # shard is empty still holds (empty) states for the cross-rank sync.
        declared = getattr(getattr(loader, "dataset", None), "ignore_index", None)
        if declared is not None:
            make_metrics(int(declared))
        with torch.inference_mode():
            for batch_index, batch in enumerate(loader):
                images = batch["images"]
                batch = self.preprocess(batch, device)
                if not metrics:
                    make_metrics(int(batch["ignore_index"]))
                predictions = self._logits(model, batch["images"]).argmax(dim=1)
                for metric in metrics.values():
                    metric.update(predictions, batch["masks"])
                if report is not None and report.draws_batch(batch_index):
                    ignore_index = int(batch["ignore_index"])
                    report.image(f"val_batch{batch_index}_labels.jpg", draw_mask_batch(images, batch["masks"], ignore_index))
                    report.image(f"val_batch{batch_index}_pred.jpg", draw_mask_batch(images, predictions, ignore_index))
        if not metrics:
            make_metrics(255)
        values = {name: metric.compute() for name, metric in metrics.items()}
        per_class = values.pop("per_class_iou", None)
        if report is not None and per_class is not None:
            from zoo_core.reports.class_scores import plot_class_scores

            report.charts(lambda folder: [plot_class_scores(per_class, names, folder / "per_class_iou.png", "IoU")], per_class_iou=per_class)
        return {name: float(value) for name, value in values.items()}

    def draw_batch(self, batch: Mapping[str, Any], names: Mapping[int, str]) -> torch.Tensor:
        return draw_mask_batch(batch["images"], batch["masks"], int(batch["ignore_index"]))

    def example_batch(self, batch_size: int, image_size: ImageSize, num_classes: int) -> dict[str, Any]:
        height, width = image_size_hw(image_size)
        masks = torch.randint(0, max(num_classes, 1), (batch_size, height, width), dtype=torch.uint8)
        return {
            "images": torch.randint(0, 256, (batch_size, 3, height, width), dtype=torch.uint8),
            "masks": masks,
            "ignore_index": 255,
            "orig_shapes": [(height, width)] * batch_size,
            "ratio_pads": [((1.0, 1.0), (0.0, 0.0))] * batch_size,
            "paths": [f"example{index}" for index in range(batch_size)],
            "indices": torch.arange(batch_size),
        }

    def predict(
        self,
        model: torch.nn.Module,
        sources: "list[SourceImage]",
        device: torch.device,
        image_size: ImageSize,
        names: Mapping[int, str],
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
        tile: bool = False,
    ) -> list[SegmentationResult]:
        """One mask per source at its original size; ``tile=True``: sliding windows of ``image_size``."""
        results = []
        with torch.inference_mode():
            for source in sources:
                shape = (int(source.image.shape[-2]), int(source.image.shape[-1]))
                if tile:
                    logits = self._tiled_logits(model, source.image, image_size, len(names), device)
                else:
                    image, _, ratio_pad = fit_to_input(source.image, image_size, self.input_pipeline)
                    logits = self._logits(model, imagenet_normalise(image[None].to(device), device))[0]
                    logits = logits_to_original(logits.float(), ratio_pad, shape, self.input_pipeline)
                mask = logits.argmax(dim=0).cpu()
                results.append(SegmentationResult(orig_image=source.image, path=source.path, name=source.name, names=dict(names), mask=mask))
        return results

    def _tiled_logits(self, model: torch.nn.Module, image: torch.Tensor, window: ImageSize, num_classes: int, device: torch.device) -> torch.Tensor:
        """C×H×W logits of ``image`` (3×H×W uint8) at its own resolution, from overlapping ``window``-sized crops.

        A side shorter than the window is padded (grey) up to it, so every crop the model sees has
        the window's size (a multiple of the network's stride), and the padding is cut off again.
        """
        from zoo_core.ops.sliding_window import sliding_window_logits

        window_h, window_w = image_size_hw(window)
        height, width = int(image.shape[-2]), int(image.shape[-1])
        padded = TF.pad(image, [0, 0, max(window_w - width, 0), max(window_h - height, 0)], fill=PAD_VALUE)
        stride = (max(round(window_h * (1 - TILE_OVERLAP)), 1), max(round(window_w * (1 - TILE_OVERLAP)), 1))
        logits = sliding_window_logits(
            lambda crop: self._logits(model, crop), imagenet_normalise(padded[None].to(device), device), (window_h, window_w), stride, num_classes
        )
        return logits[0, :, :height, :width].float()
