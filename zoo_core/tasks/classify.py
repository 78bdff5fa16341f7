"""Classification: one folder per class, top-1/top-5 accuracy.

Dataset format (what torchvision's ImageFolder reads), or ``"shapes"`` (object crops)::

    root/train/<class name>/*.jpg|png...
    root/val/<class name>/*.jpg|png...
    root/test/<class name>/...          (optional)

Class indices follow the sorted class folder names of ``train/``. Unreadable images are skipped
with a ``DatasetWarning``. Batches: ``{"images": N×3×H×W, "labels": N (int64), "paths",
"indices"}``. Training: random resized crop, horizontal flip, colour jitter; validation and
prediction: the family's input pipeline (``zoo_core/data/input_pipeline.py``; by default timm's
evaluation: the shorter side to ``image_size / 0.875``, then the centre crop). Default loss: cross-entropy. Metrics: top-1 and top-5 accuracy
(torchmetrics ``MulticlassAccuracy``, micro: the share of images).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo_core.data.errors import DatasetError, ProblemReport
from zoo_core.data.image_cache import CachedImages
from zoo_core.data.images import IMAGE_SUFFIXES, images_in_directory, usable_images
from zoo_core.data.input_pipeline import fit_to_input
from zoo_core.data.shapes import materialize_shapes, parse_shapes
from zoo_core.registry import InputPipeline
from zoo_core.tasks.base import AugmentSettings, DataSpec, Task, move_to_device

if TYPE_CHECKING:
    import torch

    from zoo_core.data.images import SourceImage
    from zoo_core.reports.validation_report import ValidationReport
    from zoo_core.tasks.predictions import ClassificationResult

__all__ = ["ClassifyTask", "IMAGE_SUFFIXES", "IMAGENET_MEAN", "IMAGENET_STD", "ClassFolderDataset"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _class_folders(split_dir: Path) -> list[str]:
    return sorted(entry.name for entry in split_dir.iterdir() if entry.is_dir() and not entry.name.startswith("."))


def imagenet_normalise(images: "torch.Tensor", device: "torch.device") -> "torch.Tensor":
    """uint8 (or [0, 1] float) images -> float images normalised with the ImageNet mean and std."""
    import torch

    images = images.float().div_(255) if images.dtype == torch.uint8 else images.float()
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
    return (images - mean) / std


class ClassFolderDataset(CachedImages):
    """Images under ``split_dir/<class>/`` with labels from ``names`` (a torch ``Dataset``)."""

    def __init__(self, split_dir: Path, names: Mapping[int, str], transform: Any) -> None:
        index_of = {name: index for index, name in names.items()}
        report = ProblemReport(str(split_dir))
        candidates: list[tuple[Path, int]] = []
        for class_name in _class_folders(split_dir):
            if class_name not in index_of:
                raise DatasetError(f"{split_dir / class_name}: class folder not in train/ ({', '.join(index_of)}); rename or remove it")
            candidates.extend((path, index_of[class_name]) for path in images_in_directory(split_dir / class_name))
        label_of = dict(candidates)
        self.samples: list[tuple[Path, int]] = [(path, label_of[path]) for path, _ in usable_images(label_of, report)]
        report.finish()
        if not self.samples:
            raise DatasetError(f"{split_dir}: no usable images ({', '.join(IMAGE_SUFFIXES)}) in any class folder")
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        path, label = self.samples[index]
        return {"image": self.transform(self.read_image(path)), "label": label, "path": str(path), "index": index}

    def cached_paths(self) -> list[Path]:
        """Every sample's image (what ``cache=`` decodes once)."""
        return [path for path, _ in self.samples]


class FittedToInput:
    """A dataset transform: a uint8 image fitted to ``image_size`` by ``pipeline`` (picklable, for loader workers)."""

    def __init__(self, image_size: int, pipeline: InputPipeline) -> None:
        self.image_size, self.pipeline = image_size, pipeline.merged({"resize_in_float": False})

    def __call__(self, image: Any) -> Any:
        return fit_to_input(image, self.image_size, self.pipeline)[0]


class ClassifyTask(Task):
    """Image classification over class folders; fitness is top-1 accuracy."""

    name = "classify"
    fitness_metric = "top1"
    export_outputs = ("logits",)
    result_type = "zoo_core.tasks.predictions:ClassificationResult"
    # timm's dropout before the classifier, which zoo's classifier builder forwards (Ultralytics' classify ``dropout``).
    dropout_option = "drop_rate"
    # timm's evaluation of ImageNet classifiers: the shorter side to size / 0.875, the centre crop, PIL bicubic.
    default_input_pipeline = InputPipeline(resize="crop", crop_pct=0.875, interpolation="bicubic_antialiased")

    def prepare(self, data: str | Path) -> DataSpec:
        shapes_config = parse_shapes(data)
        root = materialize_shapes(shapes_config) / "classify" if shapes_config else Path(data).expanduser()
        if not root.is_dir():
            raise DatasetError(f"classification data {str(data)!r} is not a directory; give a folder with train/ and val/ class folders, or 'shapes'")
        for split in ("train", "val"):
            if not (root / split).is_dir():
                raise DatasetError(f"{root}: missing {split}/ (one sub-folder per class inside)")
        classes = _class_folders(root / "train")
        if not classes:
            raise DatasetError(f"{root / 'train'}: no class folders; put each class's images in train/<class name>/")
        if len(classes) < 2:
            raise DatasetError(
                f"{root / 'train'}: only one class folder ({classes[0]!r}); a classifier needs at least two classes to "
                "learn anything. Add a folder per class (train/<class name>/), e.g. a 'background' class"
            )
        test = root / "test" if (root / "test").is_dir() else None
        return DataSpec(task=self.name, root=root, names=dict(enumerate(classes)), train=root / "train", val=root / "val", test=test)

    def dataset(self, spec: DataSpec, split: str, image_size: int, augment: AugmentSettings | None) -> ClassFolderDataset:
        return ClassFolderDataset(Path(spec.split(split)), spec.names, self.transform(image_size, augment if split == "train" else None))

    def transform(self, image_size: int, augment: AugmentSettings | None) -> Any:
        """uint8 image -> uint8 image of ``image_size``²: the family's input pipeline (a timm-style centre crop by
        default), or random transforms when ``augment`` is on."""
        from torchvision.transforms import v2

        from zoo_core.data.augment import color_jitter

        if augment is None or not augment.enabled:
            return FittedToInput(image_size, self.input_pipeline)
        steps: list[Any] = [v2.RandomResizedCrop(image_size, scale=(max(1.0 - augment.scale, 0.08), 1.0), antialias=True)]
        if augment.fliplr > 0:
            steps.append(v2.RandomHorizontalFlip(augment.fliplr))
        if augment.flipud > 0:
            steps.append(v2.RandomVerticalFlip(augment.flipud))
        jitter = color_jitter(augment)
        if jitter is not None:
            steps.append(jitter)
        return v2.Compose(steps)

    def collate(self, samples: list[Any]) -> dict[str, Any]:
        import torch

        return {
            "images": torch.stack([sample["image"] for sample in samples]),
            "labels": torch.tensor([sample["label"] for sample in samples], dtype=torch.long),
            "paths": [sample["path"] for sample in samples],
            "indices": torch.tensor([sample["index"] for sample in samples], dtype=torch.long),
        }

    def preprocess(self, batch: Mapping[str, Any], device: "torch.device") -> dict[str, Any]:
        batch = move_to_device(batch, device)
        batch["images"] = imagenet_normalise(batch["images"], device)
        return batch

    def default_loss(self, outputs: Any, batch: Mapping[str, Any]) -> tuple["torch.Tensor", dict[str, "torch.Tensor"]]:
        import torch.nn.functional as F

        loss = F.cross_entropy(outputs, batch["labels"])
        return loss, {"cls": loss.detach()}

    def validate(
        self, model: "torch.nn.Module", loader: Any, device: "torch.device", names: Mapping[int, str],
        report: "ValidationReport | None" = None,
    ) -> dict[str, float]:
        import torch
        from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

        num_classes = len(names)
        top1 = MulticlassAccuracy(num_classes=num_classes, top_k=1, average="micro").to(device)
        top5 = MulticlassAccuracy(num_classes=num_classes, top_k=min(5, num_classes), average="micro").to(device)
        confusion = MulticlassConfusionMatrix(num_classes=num_classes).to(device) if report is not None else None
        with torch.inference_mode():
            for batch_index, batch in enumerate(loader):
                images = batch["images"]
                batch = self.preprocess(batch, device)
                logits = model(batch["images"])
                top1.update(logits, batch["labels"])
                top5.update(logits, batch["labels"])
                if confusion is not None:
                    confusion.update(logits, batch["labels"])
                if report is not None and report.draws_batch(batch_index):
                    self._draw_validation_batch(report, batch_index, images, batch["labels"], logits, names)
        if report is not None and confusion is not None:
            from zoo_core.reports.confusion import plot_confusion_matrix

            matrix = confusion.compute().T  # torchmetrics counts [true, predicted]; the drawing takes [predicted, true]
            report.charts(lambda folder: plot_confusion_matrix(matrix, names, folder), confusion_matrix=matrix)
        return {"top1": float(top1.compute()), "top5": float(top5.compute())}

    @staticmethod
    def _draw_validation_batch(
        report: "ValidationReport", index: int, images: "torch.Tensor", labels: "torch.Tensor", logits: "torch.Tensor",
        names: Mapping[int, str],
    ) -> None:
        """``val_batch<index>_labels.jpg`` (true class) and ``_pred.jpg`` (top-5 classes with probabilities)."""
        from zoo_core.reports.drawing import draw_captioned_batch

        report.image(f"val_batch{index}_labels.jpg", draw_captioned_batch(images, [[str(names.get(int(label), label))] for label in labels.tolist()]))
        probabilities = logits.float().softmax(dim=1).cpu()
        top = probabilities.topk(min(5, probabilities.shape[1]), dim=1)
        captions = [[f"{names.get(int(label), label)} {float(value):.2f}" for value, label in zip(values, classes)]
                    for values, classes in zip(top.values, top.indices)]
        report.image(f"val_batch{index}_pred.jpg", draw_captioned_batch(images, captions))

    def draw_batch(self, batch: Mapping[str, Any], names: Mapping[int, str]) -> "torch.Tensor":
        from zoo_core.reports.drawing import draw_captioned_batch

        return draw_captioned_batch(batch["images"], [[str(names.get(int(label), label))] for label in batch["labels"].tolist()])

    def example_batch(self, batch_size: int, image_size: int, num_classes: int) -> dict[str, Any]:
        import torch

        return {
            "images": torch.randint(0, 256, (batch_size, 3, image_size, image_size), dtype=torch.uint8),
            "labels": torch.randint(0, max(num_classes, 1), (batch_size,)),
            "paths": [f"example{index}" for index in range(batch_size)],
            "indices": torch.arange(batch_size),
        }

    def predict(
        self,
        model: "torch.nn.Module",
        sources: "list[SourceImage]",
        device: "torch.device",
        image_size: int,
        names: Mapping[int, str],
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
    ) -> "list[ClassificationResult]":
        import torch

        from zoo_core.tasks.predictions import ClassificationResult

        resize = self.transform(image_size, None)
        results = []
        with torch.inference_mode():
            for source in sources:
                images = imagenet_normalise(resize(source.image)[None].to(device), device)
                probabilities = model(images).float().softmax(dim=1)[0].cpu()
                results.append(ClassificationResult(orig_image=source.image, path=source.path, name=source.name, names=dict(names), probs=probabilities))
        return results
