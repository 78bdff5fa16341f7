"""``validate`` and ``predict`` for any model: what ``LibreYOLO.val``/``predict`` and ``zoo val``/``zoo predict`` run.

Both work on the facade object (``libre``: its ``model``, ``task``, ``names``, ``num_classes``,
``input_size``) in one process on one device, and leave the caller's model in eval mode.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo_core.data.errors import DatasetError
from zoo_core.tasks import get_task

if TYPE_CHECKING:
    import torch

    from zoo_core.tasks.predictions import Result

__all__ = ["validate", "predict", "resolve_device", "check_image_size"]

LOGGER = logging.getLogger(__name__)


def resolve_device(device: Any = None) -> "torch.device":
    """One ``torch.device`` from the engine's device grammar (``None``/``"auto"``: CUDA, else MPS, else CPU).

    A multi-device request (``"0,1"``, ``"cpu,cpu"``) uses its first device: validation and
    prediction run in one process.
    """
    import torch

    if isinstance(device, torch.device):
        return device
    from zoo_core.devices import resolve_device_plan

    plan = resolve_device_plan(device)
    if plan.multi_device:
        chosen = plan.torch_device(0)
        warnings.warn(f"device={device!r} names {plan.world_size} devices; validation and prediction run on one: {chosen}", stacklevel=3)
        return chosen
    return plan.torch_device(0)


def check_image_size(image_size: int, multiple: int = 1) -> int:
    """``image_size`` rounded up to a multiple of ``multiple`` (with a warning when it changes).

    ``multiple`` is what the model's family accepts (its recipe's ``input_size_multiple``: the
    largest stride of a CNN, the patch size of a ViT).
    """
    if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 16:
        raise ValueError(f"imgsz must be an integer of at least 16 pixels, got {image_size!r}")
    if multiple > 1 and image_size % multiple:
        rounded = -(-image_size // multiple) * multiple
        warnings.warn(f"imgsz={image_size} is not a multiple of {multiple}; using {rounded}", stacklevel=3)
        return rounded
    return image_size


def _task_for(libre: Any, conf: float, iou: float) -> Any:
    """The task of ``libre``; detection gets the validation thresholds ``conf`` and ``iou``."""
    if libre.task == "detect":
        from zoo_core.tasks.detect import DetectTask

        return DetectTask(conf=conf, iou=iou)
    return get_task(libre.task)


def validate(
    libre: Any,
    data: str | os.PathLike[str] | None = None,
    batch: int = 16,
    imgsz: int | None = None,
    device: Any = None,
    split: str = "val",
    workers: int = 2,
    conf: float = 0.001,
    iou: float = 0.7,
    size_multiple: int = 1,
) -> dict[str, float]:
    """The task's metrics of ``libre``'s model on split ``split`` of ``data``.

    Args:
        data: a built-in dataset name (``"shapes"``), a dataset YAML or a folder.
        batch: images per forward pass.
        imgsz: input size (default: the model's); rounded up to a multiple of ``size_multiple``
            (the family's: 32 for YOLO detectors and segmentation CNNs).
        device: ``"cpu"``, ``0``, ``"cuda:0"``, ``"mps"``, ``"auto"``/``None``.
        split: ``"val"``, ``"test"`` (when the dataset has one) or ``"train"``.
        workers: DataLoader worker processes.
        conf, iou: detection thresholds handed to the family's ``postprocess``.
    """
    from torch.utils.data import DataLoader

    from zoo_core.data.sampling import InferenceShardSampler

    if data is None:
        raise ValueError("val() needs data=...: a built-in dataset ('shapes'), a dataset YAML or a folder")
    if batch < 1:
        raise ValueError(f"batch must be a positive number of images, got {batch}")
    task = _task_for(libre, conf, iou)
    spec = task.prepare(data if isinstance(data, str) else Path(data))
    if libre.task != "restore" and spec.num_classes != libre.num_classes:
        raise DatasetError(
            f"{data}: the dataset has {spec.num_classes} classes ({', '.join(spec.names.values())}) but the model has "
            f"{libre.num_classes}; validate a model trained on this dataset (its best.pt), or build one with "
            f"LibreYOLO(name, names=[...]) for these classes"
        )
    image_size = check_image_size(imgsz or libre.input_size, size_multiple)
    torch_device = resolve_device(device)
    dataset = task.dataset(spec, split, image_size, None)
    loader = DataLoader(
        dataset,
        batch_size=batch,
        sampler=InferenceShardSampler(len(dataset)),
        collate_fn=task.collate,
        num_workers=workers,
        pin_memory=torch_device.type == "cuda",
    )
    model = libre.model.to(torch_device).eval()
    metrics = task.validate(model, loader, torch_device, spec.names if libre.task != "restore" else libre.names)
    LOGGER.info("%s %s: %s", getattr(libre, "name", libre.task), split, ", ".join(f"{key} {value:.4f}" for key, value in metrics.items()))
    return metrics


def predict(
    libre: Any,
    source: Any,
    save: bool = False,
    conf: float = 0.25,
    iou: float = 0.7,
    imgsz: int | None = None,
    device: Any = None,
    project: str | os.PathLike[str] = "runs",
    name: str = "predict",
    max_det: int = 300,
    size_multiple: int = 1,
) -> "list[Result]":
    """Predict on ``source``; one result per image, in original-image coordinates.

    Args:
        source: an image path, a folder, a glob, a PIL image, an RGB uint8 numpy array
            (H×W×3), a uint8 3×H×W tensor, or a list of them.
        save: write each drawn result to the run folder ``project/<task>/name{,2,...}``
            (restoration: the restored image), and set ``result.save_path``.
        conf, iou, max_det: detection thresholds (score, NMS IoU, detections per image).
        imgsz: input size (default: the model's; restoration always runs at full size).
        device: ``"cpu"``, ``0``, ``"cuda:0"``, ``"mps"``, ``"auto"``/``None``.
        size_multiple: input sizes are rounded up to a multiple of this (the family's).
    """
    from zoo_core.data.images import load_sources
    from zoo_core.run_dirs import next_run_dir

    sources = load_sources(source)
    task = _task_for(libre, conf, iou)
    image_size = check_image_size(imgsz or libre.input_size, size_multiple)
    torch_device = resolve_device(device)
    model = libre.model.to(torch_device).eval()
    results = task.predict(model, sources, torch_device, image_size, libre.names, conf=conf, iou=iou, max_det=max_det)
    if save:
        run_dir = next_run_dir(libre.task, name, project)
        used: set[str] = set()
        for result in results:
            stem = Path(result.name).stem if result.path is not None else result.name
            candidate, counter = stem, 2
            while candidate in used:  # two sources with one file name (from different folders)
                candidate, counter = f"{stem}_{counter}", counter + 1
            used.add(candidate)
            result.save_path = result.save(run_dir / f"{candidate}.png")
        LOGGER.info("saved %d result(s) to %s", len(results), run_dir)
    return results
