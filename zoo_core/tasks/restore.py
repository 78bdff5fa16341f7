"""Image restoration: clean images degraded on the fly (or paired folders), PSNR and SSIM.

Data: a folder or YAML (``zoo_core.data.restore_format``), or ``"shapes"`` (the scenes as clean
targets). Training takes random ``image_size×image_size`` crops with horizontal flips; validation
takes the centre crop. Images smaller than the crop are padded by reflection. Clean-only data is
degraded after cropping (bicubic down/up by ``scale``, Gaussian noise ``noise``, 8-bit rounding),
with noise from torch's global RNG in training and a per-image seed in validation.

Batch (after ``preprocess``): ``images`` (degraded) and ``targets`` (clean), both N×3×S×S in
[0, 1], plus ``paths`` and ``indices``. Model contract: ``model(images)`` returns the restored
images at the input size. Default loss: L1.

Metrics (per image, then averaged over images, as restoration papers report them): ``psnr`` and
``ssim`` of the model output rounded to 8 bits, and ``psnr_input`` (the degraded input against
the target) so the gain is visible. PSNR of an exact match is capped at 100 dB.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from zoo_core.data.errors import DatasetError
from zoo_core.data.images import read_image
from zoo_core.data.restore_format import RestoreRecord, degrade, index_restore_split, read_restore_layout
from zoo_core.data.shapes import materialize_shapes, parse_shapes
from zoo_core.registry import InputPipeline
from zoo_core.tasks.base import AugmentSettings, DataSpec, ModelContractError, Task, move_to_device
from zoo_core.tasks.predictions import RestorationResult

if TYPE_CHECKING:
    from zoo_core.data.images import SourceImage
    from zoo_core.reports.validation_report import ValidationReport

__all__ = ["RestoreTask", "RestoreDataset", "PSNR_CAP_DB", "SIZE_MULTIPLE", "pad_by_reflection", "restoration_strips"]

PSNR_CAP_DB = 100.0
# Prediction pads full images to a multiple of this, which every built-in restoration network's
# down-sampling depth divides; the padding is cropped off the output.
SIZE_MULTIPLE = 32
_VALIDATION_NOISE_SEED = 20_240_521


def pad_by_reflection(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Pad ``C×h×w`` on the bottom/right to at least ``height×width`` by mirroring (repeatedly if needed)."""
    while image.shape[-2] < height or image.shape[-1] < width:
        extra_height = min(height - image.shape[-2], image.shape[-2] - 1) if image.shape[-2] < height else 0
        extra_width = min(width - image.shape[-1], image.shape[-1] - 1) if image.shape[-1] < width else 0
        if extra_height <= 0 and extra_width <= 0:  # a 1-pixel side cannot be mirrored: repeat it
            return F.pad(image[None].float(), (0, max(width - image.shape[-1], 0), 0, max(height - image.shape[-2], 0)), mode="replicate")[0].to(image.dtype)
        image = F.pad(image[None].float(), (0, max(extra_width, 0), 0, max(extra_height, 0)), mode="reflect")[0].to(image.dtype)
    return image


class RestoreDataset(Dataset):
    """(degraded, clean) crops of ``image_size``; degraded on the fly unless the data is paired."""

    def __init__(
        self,
        records: list[RestoreRecord],
        image_size: int,
        degradation: Mapping[str, float],
        augment: AugmentSettings | None,
        training: bool,
    ) -> None:
        if image_size < 8:
            raise ValueError(f"image_size must be at least 8 pixels, got {image_size}")
        self.records = records
        self.image_size = image_size
        self.scale = int(degradation.get("scale", 1))
        self.noise = float(degradation.get("noise", 0.0))
        self.training = training
        self.augment = augment if augment is not None and augment.enabled else None

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self.records[index]
        size = self.image_size
        target = read_image(record.target)
        degraded = read_image(record.input) if record.input is not None else None
        if degraded is not None and degraded.shape != target.shape:
            raise DatasetError(f"{record.input}: size {tuple(degraded.shape[-2:])} differs from its target {record.target}")
        target = pad_by_reflection(target, size, size)
        degraded = pad_by_reflection(degraded, size, size) if degraded is not None else None
        height, width = target.shape[-2:]
        if self.training:
            top, left = random.randint(0, height - size), random.randint(0, width - size)
        else:
            top, left = (height - size) // 2, (width - size) // 2
        target = target[:, top : top + size, left : left + size]
        degraded = degraded[:, top : top + size, left : left + size] if degraded is not None else None
        if self.augment is not None and self.augment.fliplr > 0 and random.random() < self.augment.fliplr:
            target = target.flip(-1)
            degraded = degraded.flip(-1) if degraded is not None else None
        if self.augment is not None and self.augment.flipud > 0 and random.random() < self.augment.flipud:
            target = target.flip(-2)
            degraded = degraded.flip(-2) if degraded is not None else None
        if degraded is None:
            generator = None if self.training else torch.Generator().manual_seed(_VALIDATION_NOISE_SEED + index)
            degraded = degrade(target, self.scale, self.noise, generator)
        return {"image": degraded.contiguous(), "target": target.contiguous(), "path": str(record.target), "index": index}


def _per_image_psnr(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    from torchmetrics.functional.image import peak_signal_noise_ratio

    values = peak_signal_noise_ratio(prediction, target, data_range=1.0, reduction="none", dim=(1, 2, 3))
    return values.clamp(max=PSNR_CAP_DB)


def restoration_strips(degraded: torch.Tensor, restored: torch.Tensor, targets: torch.Tensor, psnr: torch.Tensor | None = None) -> torch.Tensor:
    """One row per image (the first few of the batch): input | restored | target, the restored one captioned with its PSNR."""
    from zoo_core.reports.drawing import as_uint8_images, draw_caption, image_grid

    count = min(len(degraded), 8)
    tiles = []
    for position in range(count):
        row = [as_uint8_images(part[position : position + 1])[0] for part in (degraded, restored, targets)]
        captions = (["input"], [f"restored {float(psnr[position]):.2f} dB" if psnr is not None else "restored"], ["target"])
        tiles.extend(draw_caption(image, lines) for image, lines in zip(row, captions))
    return image_grid(tiles, columns=3)


class RestoreTask(Task):
    """Image restoration; fitness is the mean per-image PSNR (dB)."""

    name = "restore"
    fitness_metric = "psnr"
    export_outputs = ("image",)
    result_type = "zoo_core.tasks.predictions:RestorationResult"
    default_input_pipeline = InputPipeline(resize="native")  # restoration networks run at the image's own size

    def prepare(self, data: str | Path) -> DataSpec:
        shapes_config = parse_shapes(data)
        source = materialize_shapes(shapes_config) / "restore.yaml" if shapes_config else Path(data).expanduser()
        layout = read_restore_layout(source)
        return DataSpec(
            task=self.name,
            root=layout.root,
            names={},
            train=layout.splits["train"],
            val=layout.splits["val"],
            test=layout.splits.get("test"),
            extra={"degradation": dict(layout.degradation)},
        )

    def dataset(self, spec: DataSpec, split: str, image_size: int, augment: AugmentSettings | None) -> RestoreDataset:
        records = index_restore_split(spec.split(split), what=f"{spec.root} ({split})")
        degradation = spec.extra.get("degradation") or {}
        training = split == "train" and augment is not None and augment.enabled
        return RestoreDataset(records, image_size, degradation, augment if split == "train" else None, training=training)

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        return {
            "images": torch.stack([sample["image"] for sample in samples]),
            "targets": torch.stack([sample["target"] for sample in samples]),
            "paths": [sample["path"] for sample in samples],
            "indices": torch.tensor([sample["index"] for sample in samples], dtype=torch.long),
        }

    def preprocess(self, batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
        batch = move_to_device(batch, device)
        for key in ("images", "targets"):
            values = batch[key]
            batch[key] = values.float().div_(255) if values.dtype == torch.uint8 else values.float()
        return batch

    def default_loss(self, outputs: Any, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if not isinstance(outputs, torch.Tensor) or outputs.shape != batch["targets"].shape:
            raise ModelContractError(
                f"a restoration model must return images shaped like its input {tuple(batch['targets'].shape)}, "
                f"got {getattr(outputs, 'shape', type(outputs).__name__)}"
            )
        loss = F.l1_loss(outputs, batch["targets"])
        return loss, {"l1": loss.detach()}

    def validate(
        self, model: torch.nn.Module, loader: Any, device: torch.device, names: Mapping[int, str], report: "ValidationReport | None" = None
    ) -> dict[str, float]:
        from torchmetrics.functional.image import structural_similarity_index_measure

        from zoo_core.tasks.metrics import PerSampleMean

        metrics = {name: PerSampleMean().to(device) for name in ("psnr", "ssim", "psnr_input")}
        with torch.inference_mode():
            for batch_index, batch in enumerate(loader):
                batch = self.preprocess(batch, device)
                outputs = model(batch["images"])
                if not isinstance(outputs, torch.Tensor) or outputs.shape != batch["targets"].shape:
                    raise ModelContractError(
                        f"a restoration model must return images shaped like its input {tuple(batch['images'].shape)}, "
                        f"got {getattr(outputs, 'shape', type(outputs).__name__)}"
                    )
                restored = outputs.float().clamp(0, 1).mul(255).round().div(255)
                targets, indices = batch["targets"], batch["indices"]
                psnr = _per_image_psnr(restored, targets)
                metrics["psnr"].update(psnr, indices)
                metrics["psnr_input"].update(_per_image_psnr(batch["images"], targets), indices)
                if report is not None and report.draws_batch(batch_index):
                    report.image(f"val_batch{batch_index}_pred.jpg", restoration_strips(batch["images"], restored, targets, psnr))
                ssim = structural_similarity_index_measure(restored, targets, data_range=1.0, reduction="none")
                metrics["ssim"].update(ssim, indices)
        return {name: float(metric.compute()) for name, metric in metrics.items()}

    def draw_batch(self, batch: Mapping[str, Any], names: Mapping[int, str]) -> torch.Tensor:
        from zoo_core.reports.drawing import as_uint8_images, draw_caption, image_grid

        count = min(len(batch["images"]), 8)
        pairs = zip(as_uint8_images(batch["images"][:count]), as_uint8_images(batch["targets"][:count]))
        return image_grid([draw_caption(image, [caption]) for pair in pairs for image, caption in zip(pair, ("input", "target"))], columns=2)

    def example_batch(self, batch_size: int, image_size: int, num_classes: int) -> dict[str, Any]:
        targets = torch.randint(0, 256, (batch_size, 3, image_size, image_size), dtype=torch.uint8)
        noise = torch.randint(-10, 11, targets.shape)
        return {
            "images": (targets.int() + noise).clamp(0, 255).to(torch.uint8),
            "targets": targets,
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
    ) -> list[RestorationResult]:
        results = []
        with torch.inference_mode():
            for source in sources:
                height, width = source.image.shape[-2:]
                multiple = self.input_pipeline.pad_multiple or SIZE_MULTIPLE
                padded_height = -(-height // multiple) * multiple
                padded_width = -(-width // multiple) * multiple
                padded = pad_by_reflection(source.image, padded_height, padded_width)
                output = model(padded[None].to(device).float().div_(255))
                restored = output[0, :, :height, :width].float().clamp(0, 1).mul(255).round().to(torch.uint8).cpu()
                results.append(RestorationResult(orig_image=source.image, path=source.path, name=source.name, names={}, image=restored))
        return results
