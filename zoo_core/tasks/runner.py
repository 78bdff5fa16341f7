"""``validate`` and ``predict`` for any model: what ``LibreYOLO.val``/``predict`` and ``zoo val``/``zoo predict`` run.

Both work on the facade object (``libre``: its ``model``, ``task``, ``names``, ``num_classes``,
``input_size``, ``input_pipeline``) in one process on one device, and leave the caller's model in eval mode. Neither
writes into that object: ``validate`` returns its metrics with the folder of its report.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from zoo_core.data.errors import DatasetError
from zoo_core.data.images import VIDEO_SUFFIXES
from zoo_core.errors import ArgumentError, warn
from zoo_core.tasks import get_task

if TYPE_CHECKING:
    import torch

    from zoo_core.data.images import SourceImage
    from zoo_core.data.video import VideoWriter
    from zoo_core.registry import ImageSize
    from zoo_core.tasks.base import DataSpec
    from zoo_core.tasks.predictions import Result

__all__ = ["Validation", "validate", "predict", "resolve_device", "check_image_size", "check_arguments", "one_class_data",
           "PREDICT_OPTIONS"]

LOGGER = logging.getLogger(__name__)
#: The per-image line of ``predict(verbose=True)`` (``zoo predict`` prints it; the Python API logs it at INFO).
PREDICT_LOGGER = logging.getLogger("zoo.predict")

#: The predict options a task states support for (``Task.predict_options``), with what each needs of a result.
PREDICT_OPTIONS = {
    "classes": "keeps only the found items of these class indices",
    "save_txt": "writes a YOLO label line (class cx cy w h) per box",
    "save_conf": "adds the score to save_txt's label lines",
    "save_crop": "saves the region of each box",
    "line_width": "sets the line width of the drawn boxes",
}


def one_class_data(spec: "DataSpec", task: Any) -> "DataSpec":
    """``spec`` with every class as one (``single_cls=True``), or an ``ArgumentError`` for a task it does not apply to."""
    if not task.supports_single_class:
        raise ArgumentError(f"single_cls=True trains every class of the boxes as one, and {task.name!r} models have no boxes "
                            "with classes; remove single_cls")
    return spec.as_one_class()


def check_arguments(call: str, given: Any, accepted: Any) -> None:
    """``ArgumentError`` for the first key of ``given`` not in ``accepted``, with the closest accepted names.

    ``call`` names the method in the message (``"predict"``): a typo gets the same "did you mean"
    as a training argument (``TrainConfig.build``) instead of Python's bare ``TypeError``.
    """
    import difflib

    accepted = list(accepted)
    unknown = [key for key in given if key not in accepted]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), accepted, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ArgumentError(f"unknown {call} argument {key!r} in {call}().{hint} Accepted arguments: {', '.join(accepted)}")


def arguments_of(function: Any, internal: tuple[str, ...] = ()) -> list[str]:
    """The keyword names ``function`` accepts, less ``internal`` ones (what the facade passes itself)."""
    import inspect

    return [name for name, parameter in inspect.signature(function).parameters.items()
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY) and name not in internal]


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
        warn(f"device={device!r} names {plan.world_size} devices; validation and prediction run on one: {chosen}")
        return chosen
    return plan.torch_device(0)


def check_image_size(image_size: "ImageSize | list[int]", multiple: int = 1, task: str | None = None) -> "ImageSize":
    """``image_size`` with each side rounded up to a multiple of ``multiple`` (with a warning when it changes).

    ``image_size`` is an int (a square) or ``(height, width)``; a pair of equal sides comes back
    as the square's int. ``multiple`` is what the model's family accepts (its recipe's
    ``input_size_multiple``: the largest stride of a CNN, the patch size of a ViT). When ``task``
    (a task's name) is given, a rectangle is accepted only if that task's declaration says its
    inputs may be rectangular (semantic segmentation); the others get an ``ArgumentError``.
    """
    from zoo_core.plugin_manager import get_plugin_manager
    from zoo_core.registry import image_size_hw, normalise_image_size

    try:
        size = normalise_image_size(image_size, "imgsz", minimum=16)
    except ValueError as error:
        raise ArgumentError(str(error)) from None
    tasks = get_plugin_manager().tasks if task is not None else {}
    if not isinstance(size, int) and task is not None and not tasks[task].rectangular:
        rectangular = [name for name, declared in tasks.items() if declared.rectangular]
        raise ArgumentError(
            f"imgsz={image_size!r}: {task!r} models take a square input; give one integer (e.g. imgsz={max(size)}). "
            f"(height, width) sizes are for {', '.join(rectangular)} models"
        )
    if multiple > 1 and any(side % multiple for side in image_size_hw(size)):
        rounded = normalise_image_size(tuple(-(-side // multiple) * multiple for side in image_size_hw(size)))
        warn(f"imgsz={image_size!r} is not a multiple of {multiple}; using {rounded!r}")
        return rounded
    return size


@dataclass(frozen=True)
class Validation:
    """What ``validate`` found: the task's metrics, and the folder its report was written to (None without plots)."""

    metrics: dict[str, float]
    report_dir: Path | None


def validate(
    libre: Any,
    data: str | os.PathLike[str] | None = None,
    batch: int = 16,
    imgsz: int | None = None,
    device: Any = None,
    split: str = "val",
    workers: int = 2,
    conf: float | None = None,
    iou: float | None = None,
    size_multiple: int = 1,
    plots: bool = True,
    project: str | os.PathLike[str] | None = None,
    name: str = "val",
    verbose: bool = True,
    single_cls: bool = False,
) -> Validation:
    """The task's metrics of ``libre``'s model on split ``split`` of ``data``.

    With ``plots`` the task's report (drawn batches, confusion matrix, curves...) is written to
    the run folder ``project/<task>/name{,2,...}``, returned as ``report_dir``.

    Args:
        data: a built-in dataset name (``"shapes"``), a dataset YAML or a folder; default: the dataset
            the model was trained on (recorded in its weights).
        batch: images per forward pass.
        imgsz: input size (default: the model's); rounded up to a multiple of ``size_multiple``
            (the family's: 32 for YOLO detectors and segmentation CNNs).
        device: ``"cpu"``, ``0``, ``"cuda:0"``, ``"mps"``, ``"auto"``/``None``.
        split: ``"val"``, ``"test"`` (when the dataset has one) or ``"train"``.
        workers: DataLoader worker processes.
        conf, iou: thresholds handed to the family's ``postprocess``, for the tasks that take them (their
            ``thresholds``); None: the task's validation defaults (detection: conf 0.001, iou 0.7).
        plots, project, name: write the report, and where.
        verbose: print the per-class table of the tasks that have one (detection, segmentation: images, instances,
            P, R, mAP50, mAP50-95 per class, as Ultralytics prints it); it is returned either way, as the metrics'
            ``class_table`` (``zoo_core.tasks.class_table``).
        single_cls: score every object as one class, ``item`` (a model trained with ``single_cls=True``).
    """
    from torch.utils.data import DataLoader

    from zoo_core.data.loader_workers import loader_start_method
    from zoo_core.data.sampling import InferenceShardSampler

    if data is None:
        data = getattr(libre, "data", "") or None  # the dataset the model was trained on
    if data is None:
        raise ArgumentError(
            "val() needs data=...: a built-in dataset ('shapes'), a dataset YAML or a folder (this model's weights do "
            "not record the dataset they were trained on)"
        )
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ArgumentError(f"batch must be a positive number of images, got {batch!r}")
    image_size = check_image_size(imgsz if imgsz is not None else libre.input_size, size_multiple, libre.task)
    task = get_task(libre.task, input_pipeline=libre.input_pipeline, conf=conf, iou=iou)
    spec = task.prepare(data if isinstance(data, str) else Path(data))
    if single_cls:
        spec = one_class_data(spec, task)
    if task.has_classes and spec.num_classes != libre.num_classes:
        raise DatasetError(
            f"{data}: the dataset has {spec.num_classes} classes ({', '.join(spec.names.values())}) but the model has "
            f"{libre.num_classes}; validate a model trained on this dataset (its best.pt), or build one with "
            f"LibreYOLO(name, names=[...]) for these classes"
        )
    torch_device = resolve_device(device)
    dataset = task.dataset(spec, split, image_size, None)
    loader = DataLoader(
        dataset,
        batch_size=batch,
        sampler=InferenceShardSampler(len(dataset)),
        collate_fn=task.collate,
        num_workers=workers,
        pin_memory=torch_device.type == "cuda",
        multiprocessing_context=loader_start_method(workers),
    )
    model = libre.inference_model(torch_device)
    report = None
    if plots:
        from zoo_core.reports.validation_report import ValidationReport
        from zoo_core.run_dirs import next_run_dir

        report = ValidationReport(next_run_dir(libre.task, name, project))
    metrics = task.validate(model, loader, torch_device, spec.names if task.has_classes else libre.names, report=report)
    LOGGER.info("%s %s: %s", getattr(libre, "name", libre.task), split, ", ".join(f"{key} {value:.4f}" for key, value in metrics.items()))
    table = getattr(metrics, "class_table", None)
    if verbose and table is not None:
        print(table.format(), flush=True)
    return Validation(metrics, report.folder if report is not None else None)


def predict(
    libre: Any,
    source: Any,
    save: bool = False,
    conf: float = 0.25,
    iou: float = 0.7,
    imgsz: int | None = None,
    device: Any = None,
    project: str | os.PathLike[str] | None = None,
    name: str = "predict",
    max_det: int = 300,
    size_multiple: int = 1,
    tile: bool = False,
    stream: bool = False,
    classes: int | list[int] | None = None,
    save_txt: bool = False,
    save_conf: bool = False,
    save_crop: bool = False,
    line_width: int | None = None,
    verbose: bool = True,
    follow: "Callable[[Result, SourceImage], Result] | None" = None,
) -> "list[Result] | Iterator[Result]":
    """Predict on ``source``; one result per image, in original-image coordinates.

    Args:
        source: an image path, a video file (frame by frame, with PyAV), a folder, a glob, a PIL
            image, an RGB uint8 numpy array (H×W×3), a uint8 3×H×W tensor, or a list of them.
        save: write each drawn result to the run folder ``project/<task>/name{,2,...}``
            (restoration: the restored image), and set ``result.save_path``; a video's frames are
            drawn into one annotated video, ``<video stem>.mp4`` at the video's frame rate.
        conf, iou, max_det: detection thresholds (score, NMS IoU, detections per image).
        imgsz: input size (default: the model's; restoration always runs at full size).
        device: ``"cpu"``, ``0``, ``"cuda:0"``, ``"mps"``, ``"auto"``/``None``.
        size_multiple: input sizes are rounded up to a multiple of this (the family's).
        tile: semantic segmentation: predict each image at its own resolution, window by window
            (windows of ``imgsz`` overlapping by a third, logits averaged where they overlap;
            ``zoo_core.ops.sliding_window``), instead of resizing it to ``imgsz``. For images
            larger than the size the model was trained at.
        stream: return a generator that reads, predicts and yields one image at a time (a long
            video or a large folder is never held in memory), instead of the list of results.
        classes: keep only the found items of these class indices (an int or a list), of the ``max_det``
            the model returned (detection, points).
        save_txt: write ``labels/<image stem>.txt`` in the run folder, one YOLO label line per box
            (``class cx cy w h``, normalised to the image; no file for an image without boxes), as Ultralytics.
        save_conf: with ``save_txt``, add each box's score to its line.
        save_crop: save each box's region as ``crops/<class name>/<image stem>.jpg`` in the run folder.
        line_width: the line width (pixels) of the boxes ``save`` draws (default: sized to the image).
        verbose: one line per image (``result.summary()``) on the ``zoo.predict`` logger at INFO, which
            ``zoo predict`` prints; False: none.
        follow: what ``track()`` adds: called on each image's result (after ``classes``) with its source
            image, it returns the result to keep, draw and yield (the tracked one).

    ``classes``, ``save_txt``, ``save_conf``, ``save_crop`` and ``line_width`` apply to the tasks whose
    ``predict_options`` name them (detection: all; points: ``classes``); another task's model refuses
    them with an ``ArgumentError`` naming the option and the task.
    """
    task = get_task(libre.task, input_pipeline=libre.input_pipeline)
    given = {"classes": classes, "save_txt": save_txt, "save_conf": save_conf, "save_crop": save_crop, "line_width": line_width}
    for option, value in given.items():
        # Identity, not equality: classes=0 is a class index, and 0 == False.
        if value is not None and value is not False and option not in task.predict_options:
            supported = ", ".join(sorted(task.predict_options)) or "none of them"
            raise ArgumentError(
                f"predict({option}={value!r}) does not apply to {libre.task!r} models (it {PREDICT_OPTIONS[option]}); "
                f"of {', '.join(PREDICT_OPTIONS)}, their predict takes {supported}"
            )
    if save_conf and not save_txt:
        raise ArgumentError("predict(save_conf=True) adds the score to save_txt's label lines; add save_txt=True")
    if line_width is not None and (not isinstance(line_width, int) or isinstance(line_width, bool) or line_width < 1):
        raise ArgumentError(f"predict(line_width={line_width!r}): give a positive number of pixels, or None (sized to the image)")
    wanted = _class_indices(classes, libre.names) if classes is not None else None
    image_size = check_image_size(imgsz if imgsz is not None else libre.input_size, size_multiple, libre.task)
    if tile and not task.supports_tiling:
        raise ArgumentError(f"predict(tile=True) is sliding-window inference at each image's own resolution, which {libre.task!r} "
                            "models do not do; they predict whole images")
    torch_device = resolve_device(device)
    options = {"conf": conf, "iou": iou, "max_det": max_det, **({"tile": True} if tile else {})}
    outputs = _Outputs(save=save, save_txt=save_txt, save_conf=save_conf, save_crop=save_crop, line_width=line_width)
    results = _predictions(libre, task, source, torch_device, image_size, options, project=project, name=name,
                           outputs=outputs, classes=wanted, verbose=verbose, follow=follow)
    return results if stream else list(results)


def _class_indices(classes: Any, names: dict[int, str]) -> list[int]:
    """``predict(classes=...)`` as a list of the model's class indices; ``ArgumentError`` naming a stranger."""
    listed = [classes] if isinstance(classes, int) and not isinstance(classes, bool) else classes
    if not isinstance(listed, (list, tuple)) or not all(isinstance(index, int) and not isinstance(index, bool) for index in listed):
        raise ArgumentError(f"predict(classes={classes!r}): give a class index or a list of them, e.g. classes=[0, 2]")
    strangers = [index for index in listed if index not in names]
    if strangers:
        known = ", ".join(f"{index} {name}" for index, name in list(names.items())[:10])
        raise ArgumentError(f"predict(classes={classes!r}): the model has no class {strangers[0]}; its classes are {known}"
                            f"{' ...' if len(names) > 10 else ''}")
    return list(listed)


@dataclass(frozen=True)
class _Outputs:
    """What ``predict`` writes into its run folder for each image."""

    save: bool
    save_txt: bool
    save_conf: bool
    save_crop: bool
    line_width: int | None

    @property
    def any(self) -> bool:
        return self.save or self.save_txt or self.save_crop


def _predictions(libre: Any, task: Any, source: Any, device: Any, image_size: Any, options: dict[str, Any], *,
                 project: str | os.PathLike[str], name: str, outputs: _Outputs, classes: list[int] | None,
                 verbose: bool, follow: "Callable[[Result, SourceImage], Result] | None") -> "Iterator[Result]":
    """Read, predict, keep ``classes``, ``follow`` (track), write what ``outputs`` asks for and report one image at a time."""
    from zoo_core.data.images import iter_sources
    from zoo_core.run_dirs import next_run_dir

    model = libre.inference_model(device)
    run_dir: Path | None = None
    used: set[str] = set()
    videos = _AnnotatedVideos(used)
    saved = 0
    try:
        for index, source_image in enumerate(iter_sources(source), start=1):
            (result,) = task.predict(model, [source_image], device, image_size, libre.names, **options)
            if classes is not None:
                result = result.keep_classes(classes)
            if follow is not None:
                result = follow(result, source_image)
            if outputs.any:
                if run_dir is None:
                    run_dir = next_run_dir(libre.task, name, project)
                result.save_dir = run_dir
                file_name = _saved_file_name(result, used)
                drawing = {"line_width": outputs.line_width} if outputs.line_width is not None else {}
                if outputs.save and _is_video(result.path):
                    result.save_path = videos.add(run_dir, result.path, result.plot(**drawing))
                elif outputs.save:
                    result.save_path = result.save(run_dir / file_name, **drawing)
                stem = Path(file_name).stem
                if outputs.save_txt and len(result.labels):  # as Ultralytics: no label file for an image without boxes
                    result.save_txt(run_dir / "labels" / f"{stem}.txt", save_conf=outputs.save_conf)
                if outputs.save_crop:
                    result.save_crops(run_dir / "crops", stem)
                saved += 1
            if verbose:
                PREDICT_LOGGER.info("image %d: %s", index, result.summary())
            yield result
    except GeneratorExit:
        videos.finish()  # the caller stopped reading a stream: the frames drawn so far are a whole video
        raise
    except BaseException as error:
        videos.finish(error)
        raise
    videos.finish()
    if run_dir is not None:
        LOGGER.info("saved %d result(s) to %s", saved, run_dir)


def _is_video(path: Path | None) -> bool:
    return path is not None and path.suffix.lower() in VIDEO_SUFFIXES


class _AnnotatedVideos:
    """The annotated videos ``predict(save=True)`` writes, one per video source: its frames are drawn into
    ``<video stem>.mp4`` (``zoo_core.data.video.VideoWriter``: complete, or not there) as they arrive. A source's
    frames arrive together, so one file is open at a time, finished when the next source starts or the run ends."""

    def __init__(self, used: set[str]) -> None:
        self._used = used
        self._writer: "VideoWriter | None" = None
        self._source: Path | None = None

    def add(self, run_dir: Path, source: Path, frame: Any) -> Path:
        """Append ``frame`` (``H×W×3`` uint8) to the video of ``source`` and return that video's path."""
        from zoo_core.data.video import VideoWriter, video_rate

        if self._writer is None or source != self._source:
            self.finish()
            stem, counter = f"{source.stem}.mp4", 2
            while stem in self._used:  # two videos with one stem, from different folders
                stem, counter = f"{source.stem}_{counter}.mp4", counter + 1
            self._used.add(stem)
            self._writer = VideoWriter(run_dir / stem, video_rate(source)).__enter__()
            self._source = source
        self._writer.write(frame)
        return self._writer.path

    def finish(self, error: BaseException | None = None) -> None:
        """Close the open video: renamed into place, or (after ``error``) removed."""
        writer, self._writer, self._source = self._writer, None, None
        if writer is not None:
            writer.__exit__(type(error) if error is not None else None, error, None)


def _saved_file_name(result: Any, used: set[str]) -> str:
    """A file name for a drawn result: the input's stem and file type, made unique within the run."""
    stem = Path(result.name).stem if result.path is not None else result.name
    candidate, counter = stem, 2
    while candidate in used:  # two sources with one file name (from different folders)
        candidate, counter = f"{stem}_{counter}", counter + 1
    used.add(candidate)
    # Keep the input's file type (a JPEG stays a small JPEG); video frames are JPEGs, in-memory images PNGs.
    suffix = Path(result.path).suffix.lower() if result.path is not None else ".png"
    if suffix in VIDEO_SUFFIXES:
        suffix = ".jpg"
    return f"{candidate}{suffix if suffix in ('.jpg', '.jpeg', '.png', '.bmp', '.webp') else '.png'}"
