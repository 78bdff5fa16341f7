"""The contract between the engine, a task and a family.

The trainer (zoo_core/engine) knows no task: it asks the ``Task`` for datasets, batches, the
loss and validation metrics. A task knows no family: it relies on the model contract below.
A family plugin supplies the model (and its loss where the task's default does not fit).

Batches are dicts. Every task puts the network input under ``"images"`` (float, N×3×H×W, on
the device after ``Task.preprocess``). After ``preprocess`` the keys are:

- segment: every detect key, plus ``masks`` (M×S×S uint8 in {0, 1}: row i the mask of ``targets`` row i,
  in input pixels, aligned with the augmented image; crowd regions never appear). A family downsamples
  ``masks`` itself when its loss wants a lower resolution. Validation batches also carry
  ``instance_truths`` (per image the objects at the original size, crowd regions included, as COCO RLEs).
- classify: ``images`` (ImageNet-normalised), ``labels`` (N, int64).
- detect: ``images`` (letterboxed, in [0, 1]), ``targets`` (M×6 float: image index in the batch,
  class, x1, y1, x2, y2 in input pixels), plus per-image ``orig_shapes`` (list of ``(h, w)``),
  ``ratio_pads`` (list of ``((ratio_x, ratio_y), (pad_left, pad_top))``: original pixel ``x``
  lands at ``x * ratio_x + pad_left``) and ``paths`` (list of str).
- semantic: ``images`` (ImageNet-normalised), ``masks`` (N×H×W int64, class index per pixel),
  ``ignore_index`` (int; pixels with that value are excluded from loss and metric).
- restore: ``images`` (degraded, in [0, 1]), ``targets`` (the clean images, same size, in [0, 1]).

Every task's batch also carries ``indices`` (N, int64): each sample's index in its dataset.
Validation uses it to put per-sample metric states from all ranks back in dataset order, so a
sharded validation computes exactly what one process computes.

Model contract (what ``build_model`` must return, per task):

- every task: ``model(images)`` returns the raw outputs; ``model.train()``/``model.eval()``
  may change what is returned (auxiliary heads in training only).
- ``model.loss(outputs, batch) -> (loss, items)``, optional except for detection: ``loss`` is
  the scalar to back-propagate and ``items`` maps names to detached scalars for logging. The
  loss is normalised per sample (a mean over the local batch, never scaled by the local batch
  size or the world size): DDP averages gradients, so two ranks at batch B/2 then equal one
  process at batch B (E6, docs/architecture.md). A constant gain is allowed. Without ``model.loss`` the
  task's default loss is used.
- detection also needs ``model.postprocess(outputs, conf, iou, max_det)`` on eval outputs,
  returning one dict per image with ``boxes`` (n×4 xyxy in input pixels), ``scores`` (n) and
  ``labels`` (n, int64).
- segment: in eval mode ``model(images)`` returns a dict with at least ``boxes`` (N×A×4 xyxy, input pixels),
  ``scores`` (N×A×C probabilities), ``mask_coefficients`` (N×A×K: each candidate's mask parameters — YOLO's
  prototype coefficients, RTMDet-Ins's dynamic-kernel parameters) and ``mask_features`` (N×K'×h×w: the
  per-image map they act on), the exported graph's outputs in that order. ``model.postprocess(outputs, conf,
  iou, max_det, placements=None)`` returns detection's dicts plus ``masks`` (n×H×W bool): with ``placements``
  boxes and masks are in original-image pixels (H, W the placement's shape; the letterbox padding cropped,
  resized, thresholded, in the family's reference order), without them in input pixels. ``model.loss``
  reads ``targets`` and ``masks``.
- semantic: in eval mode ``model(images)`` returns logits N×C×H×W at the input resolution.
- restore: ``model(images)`` returns the restored images N×3×H×W (same size as the input).

Optional, for every task: ``published_parameter_count()`` when the published figure counts
another form than the trainable graph (re-parameterised branches merged, training-only auxiliary
heads left out; it must work on the meta device), and ``minimum_input_size`` (an int) when the
model needs more than 64 pixels (a DETR with 300 queries needs 300 encoder positions).
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from zoo_core.errors import ArgumentError, ZooError
from zoo_core.registry import InputPipeline

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from zoo_core.data.images import SourceImage
    from zoo_core.registry import TaskDeclaration
    from zoo_core.reports.validation_report import ValidationReport
    from zoo_core.tasks.predictions import Result

__all__ = ["DataSpec", "AugmentSettings", "Task", "ModelContractError", "move_to_device", "unwrap_model"]


class ModelContractError(ZooError, TypeError):
    """A model that does not fulfil its task's contract (a missing ``loss``/``postprocess``, wrong output)."""


#: The one class of a dataset trained or validated with ``single_cls=True`` (Ultralytics' name).
SINGLE_CLASS_NAME = "item"


@dataclass
class DataSpec:
    """A dataset resolved to files on disk by ``Task.prepare``.

    ``train``, ``val`` and (when the dataset has one) ``test`` are whatever the task's loader
    reads (directories, list files); ``extra`` holds task-specific settings read from the
    dataset (``ignore_index``, a degradation recipe...). It must pickle: spawned workers
    receive it.
    """

    task: str
    root: Path
    names: dict[int, str]
    train: Any
    val: Any
    extra: dict[str, Any] = field(default_factory=dict)
    test: Any = None

    @property
    def num_classes(self) -> int:
        """Number of classes (0 for restoration)."""
        return len(self.names)

    def as_one_class(self) -> "DataSpec":
        """This dataset with every object of every class as one class, ``item`` (Ultralytics' ``single_cls``).

        The label files keep their class indices: they are read against the dataset's own classes
        (``label_names``) and every box's class becomes 0 (``relabelled``).
        """
        return dataclasses.replace(self, names={0: SINGLE_CLASS_NAME}, extra={**self.extra, "label_names": dict(self.names)})

    @property
    def label_names(self) -> dict[int, str]:
        """The classes the label files are read against: the dataset's own, also after ``as_one_class``."""
        return dict(self.extra.get("label_names", self.names))

    def relabelled(self, records: list[Any]) -> list[Any]:
        """``records`` (with their ``labels``' first column the class) with every class 0 after ``as_one_class``;
        unchanged otherwise."""
        if "label_names" not in self.extra:
            return records
        collapsed = []
        for record in records:
            labels = record.labels.copy()
            labels[:, 0] = 0
            collapsed.append(dataclasses.replace(record, labels=labels))
        return collapsed

    def split(self, name: str) -> Any:
        """The source of split ``name`` (``train``, ``val`` or ``test``); ``DatasetError`` if absent."""
        from zoo_core.data.errors import DatasetError

        if name not in ("train", "val", "test"):
            raise ValueError(f"unknown split {name!r}; use 'train', 'val' or 'test'")
        source = getattr(self, name)
        if source is None:
            raise DatasetError(f"the dataset at {self.root} has no {name!r} split; use split='val' or add one")
        return source


@dataclass
class AugmentSettings:
    """Training augmentation switches and strengths (fractions and probabilities).

    ``enabled=False`` turns every random transform off (validation, and equivalence tests).
    Each task applies the ones that make sense for it; ``multi_scale`` is applied by the trainer
    to whole batches (``Task.resize_batch``).
    """

    enabled: bool = True
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    fliplr: float = 0.5
    flipud: float = 0.0
    mosaic: float = 1.0
    mixup: float = 0.0
    multi_scale: bool = False


def unwrap_model(model: "torch.nn.Module") -> "torch.nn.Module":
    """The model inside a DDP (or DataParallel) wrapper, where family methods such as ``postprocess`` live."""
    return getattr(model, "module", model)


def move_to_device(batch: Mapping[str, Any], device: "torch.device") -> dict[str, Any]:
    """Copy every tensor of ``batch`` to ``device`` (non-blocking from pinned memory)."""
    import torch

    return {
        key: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        for key, value in batch.items()
    }


class Task(abc.ABC):
    """Everything that is the same for every family of one task, and the task's facts.

    A task is this class plus its declaration (registry.yaml's ``tasks``, or a plugin's
    ``zoo_tasks`` hook): the declaration says what zoo must know before importing the task's code
    (``has_classes``, ``rectangular``); the class attributes below state everything else, and no
    code outside ``zoo_core/tasks`` asks for a task by name.

    Randomness (augmentation) must come only from Python's ``random``, NumPy's global RNG or
    torch's global RNG: the engine seeds those per rank and per epoch (E10, docs/architecture.md), and
    DataLoader workers are seeded from them.
    """

    name: ClassVar[str]
    #: The metric that chooses best.pt (higher is better).
    fitness_metric: ClassVar[str]
    #: Input sizes are rounded up to a multiple of this, unless the family's recipe says otherwise (1: any size).
    size_multiple: ClassVar[int] = 1
    #: The names of an exported graph's outputs, in order (``zoo_core/export.py``).
    export_outputs: ClassVar[tuple[str, ...]]
    #: The prediction thresholds validation takes, as keyword arguments of the constructor (``conf``, ``iou``...).
    thresholds: ClassVar[tuple[str, ...]] = ()
    #: ``"module:Class"`` of the result ``predict`` returns for each image (``zoo_core/tasks/predictions.py``).
    result_type: ClassVar[str]
    #: Whether ``resize_batch`` is implemented (multi-scale training).
    supports_multi_scale: ClassVar[bool] = False
    #: Whether ``predict(tile=True)`` (sliding windows at the image's own resolution) is implemented.
    supports_tiling: ClassVar[bool] = False
    #: The ``predict`` options about which found items a result keeps and what is written beside the drawing
    #: (of ``classes``, ``save_txt``, ``save_conf``, ``save_crop``, ``line_width``) that this task's results
    #: support; ``predict`` refuses the others by name for this task (``zoo_core/tasks/runner.py``).
    predict_options: ClassVar[frozenset[str]] = frozenset()
    #: Whether ``track()`` can follow this task's found items from frame to frame: its results are boxes (with masks
    #: or keypoints riding on them), which the trackers of ``zoo_core/tracking`` associate.
    trackable: ClassVar[bool] = False
    #: Whether ``single_cls=True`` (every class trained as one) applies: the task's records are boxes with classes.
    supports_single_class: ClassVar[bool] = False
    #: The build option ``dropout=p`` sets (the classifier head's dropout), or None where ``dropout`` does not apply.
    dropout_option: ClassVar[str | None] = None
    #: Modules a training worker needs before its first step, beyond the engine and this task's module:
    #: imported once by the workers' forkserver (``zoo_core/engine/launcher.py``).
    worker_modules: ClassVar[tuple[str, ...]] = ()
    #: Modules the first validation imports; the forkserver imports them too when the run validates.
    validation_modules: ClassVar[tuple[str, ...]] = ("zoo_core.tasks.metrics",)
    #: The resize of a family that declares none (``zoo_core/data/input_pipeline.py``): the image stretched
    #: to the input size, unless the task states its own (detection: a letterbox).
    default_input_pipeline: ClassVar[InputPipeline] = InputPipeline(resize="stretch")

    def __init__(self, *, declaration: "TaskDeclaration | None" = None, input_pipeline: InputPipeline | None = None) -> None:
        self._declaration = declaration
        #: How this task's images become the network's input: the family's declaration, else the task's default.
        self.input_pipeline: InputPipeline = input_pipeline or self.default_input_pipeline

    @property
    def declaration(self) -> "TaskDeclaration":
        """This task's declaration (from the plugin manager that resolved it, else the process-wide one)."""
        if self._declaration is None:
            from zoo_core.plugin_manager import get_plugin_manager

            self._declaration = get_plugin_manager().task(self.name)
        return self._declaration

    @property
    def has_classes(self) -> bool:
        """Whether the task's models predict classes (a dataset's class count decides the head)."""
        return self.declaration.classes

    @property
    def rectangular(self) -> bool:
        """Whether the task's inputs may be ``(height, width)`` rectangles, not only squares."""
        return self.declaration.rectangular

    @classmethod
    def preloaded_modules(cls, *, validates: bool) -> tuple[str, ...]:
        """What a training worker of this task imports before its first step (and its first validation)."""
        return (cls.__module__, *cls.worker_modules, *(cls.validation_modules if validates else ()))

    @abc.abstractmethod
    def prepare(self, data: str | Path) -> DataSpec:
        """Resolve ``data`` (a built-in name such as ``"shapes"``, a YAML file, a folder).

        Generates built-in datasets into ``ZOO_HOME`` when missing. The engine calls this on
        rank 0 (or in the parent before spawning) while other ranks wait (E17); it must be
        idempotent and safe against a concurrent second process. Bad input raises a clear
        error naming the path and the fix; nothing under the user's data is modified.
        """

    @abc.abstractmethod
    def dataset(self, spec: DataSpec, split: str, image_size: int, augment: AugmentSettings | None) -> "Dataset":
        """The ``"train"`` or ``"val"`` dataset at ``image_size`` (``augment=None``: deterministic)."""

    @abc.abstractmethod
    def collate(self, samples: list[Any]) -> dict[str, Any]:
        """Stack dataset samples into a batch dict (CPU tensors; ``"images"`` may stay uint8)."""

    @abc.abstractmethod
    def preprocess(self, batch: Mapping[str, Any], device: "torch.device") -> dict[str, Any]:
        """Move a collated batch to ``device`` and normalise ``"images"`` to the model's float input."""

    def resize_batch(self, batch: Mapping[str, Any], size: tuple[int, int]) -> dict[str, Any]:
        """A preprocessed training batch resized to ``size`` (height, width), its targets with it (multi-scale
        training); a task that supports it sets ``supports_multi_scale``."""
        raise ArgumentError(f"multi_scale=True: {self.name!r} models train at one size; remove multi_scale (it is for detection)")

    @abc.abstractmethod
    def default_loss(self, outputs: Any, batch: Mapping[str, Any]) -> tuple["torch.Tensor", dict[str, "torch.Tensor"]]:
        """The task's loss for models that define no ``loss`` method."""

    def loss(self, model: "torch.nn.Module", outputs: Any, batch: Mapping[str, Any]) -> tuple["torch.Tensor", dict[str, "torch.Tensor"]]:
        """``model.loss`` when the (unwrapped) model defines one, else ``default_loss``."""
        model_loss = getattr(model, "loss", None)
        if callable(model_loss):
            return model_loss(outputs, batch)
        return self.default_loss(outputs, batch)

    @abc.abstractmethod
    def validate(
        self,
        model: "torch.nn.Module",
        loader: Any,
        device: "torch.device",
        names: Mapping[int, str],
        report: "ValidationReport | None" = None,
    ) -> dict[str, float]:
        """Run ``model`` (already in eval mode) over ``loader`` and return the task's metrics.

        Under DDP every rank calls this with its own shard of the validation set; the metrics
        are synchronised across ranks, so every rank returns the numbers one process would
        compute over the whole set. The result includes ``fitness_metric``.

        With a ``report``, the task also draws its first batches (``val_batch<i>_labels.jpg``
        and ``val_batch<i>_pred.jpg``) and its charts (``zoo_core/reports``) into it.
        """

    def draw_batch(self, batch: Mapping[str, Any], names: Mapping[int, str]) -> "torch.Tensor | None":
        """A collated training batch (before ``preprocess``) drawn as one uint8 ``3×H×W`` grid with its labels.

        The engine saves the first batches as ``train_batch<i>.jpg``; ``None`` (the default) draws nothing.
        """
        return None

    def plot_training_set(self, dataset: "Dataset", folder: Path) -> list[Path]:
        """Charts of the training set written before training starts (detection: ``labels.jpg``); default none."""
        return []

    @abc.abstractmethod
    def example_batch(self, batch_size: int, image_size: int, num_classes: int) -> dict[str, Any]:
        """A synthetic collated batch (for autobatch memory probes and benchmarks)."""

    @abc.abstractmethod
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
    ) -> "list[Result]":
        """Run ``model`` (in eval mode) on each source image; results are in original-image coordinates.

        ``conf``, ``iou`` and ``max_det`` matter to detection only (the family's ``postprocess``).
        """
