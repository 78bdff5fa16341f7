"""``LibreYOLO``: one object per model, whatever its family or task.

``LibreYOLO("yolo9-s")`` builds a fresh model, ``LibreYOLO("run/weights/best.pt")`` or
``LibreYOLO("model.safetensors")`` loads weights with their metadata, and a missing file named
like a size's published weights (``LibreYOLO9s.pt``, ``YOLO9s.pt``; or ``LibreYOLO("yolo9-s",
pretrained=True)``, or ``hf://owner/repo/file.pt``) is fetched from where registry.yaml says it
lives and checked (``zoo_core.published_weights``). Training, validation and prediction are delegated
to the engine (``zoo_core.engine.fit``: the facade hands it a ``ModelSpec`` and applies the
``FitOutcome`` it returns) and to the task modules, which import torch on first use.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from zoo_core import __version__
from zoo_core.errors import (
    ArgumentError,
    CorruptWeightsError,
    ModelNameError,
    TrainConfigError,
    WeightsError,
    WeightsMismatchError,
    WeightsNotFoundError,
)
from zoo_core.export import graph_format
from zoo_core.naming import WEIGHT_SUFFIXES, canonical_name, resolve_model_name
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.published_weights import HubReference, fetch, not_published, parse_hub_reference, source_of_reference
from zoo_core.registry import FamilyDeclaration, ImageSize, image_size_hw, load_registry, normalise_image_size
from zoo_core.weights import ModelMeta, save_safetensors

if TYPE_CHECKING:
    import torch

    from zoo_core.engine import FitOutcome, ModelSpec, TrainingRecipe, TrainResult
    from zoo_core.registry import InputPipeline

__all__ = ["LibreYOLO"]

log = logging.getLogger("zoo.weights")


def default_names(num_classes: int) -> dict[int, str]:
    """Placeholder class names ``{0: "class0", ...}`` for a model built without a dataset."""
    return {index: f"class{index}" for index in range(num_classes)}


class LibreYOLO:
    """A model of any registered family, with ``train``, ``val``, ``predict`` and ``save``.

    Args:
        model: a registry name (``"yolo9-s"``, ``"YOLO9s"``, ``"resnet18"``) for a fresh model; a path to
            ``.safetensors``/``.pt``/``.pth`` weights; the file name of a size's published weights
            (``"LibreYOLO9s.pt"``, ``"YOLO9s.pt"``), fetched into the cache when it is not on disk; or
            ``"hf://owner/repo[@revision][/file]"``, a file of any Hugging Face Hub repository. The
            order, the cache and offline use: docs/weights.md ("Published weights").
        num_classes: classes of a fresh model (default: the family's published count); ignored
            when loading weights, whose metadata decides.
        names: class names of a fresh model, a list or ``{index: name}``.
        options: extra keyword arguments for the family's builder.
        seed: seeds the initialisation of a fresh model, so two identical scripts start from
            identical weights (None: torch's global random state decides). The caller's random
            state is left as it was.
        architecture: for a weights file without metadata whose file name names no model
            (``NAFNet-GoPro-width32.pth``): the name of the model it holds (``"nafnet-s"``).
        pretrained: with a registry name, start from the size's published weights instead of a
            random initialisation (as ``LibreYOLO("LibreYOLO9s.pt")``); a ``WeightsNotPublishedError``
            where none are published.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        num_classes: int | None = None,
        names: list[str] | Mapping[int, str] | None = None,
        options: Mapping[str, Any] | None = None,
        seed: int | None = 0,
        architecture: str | None = None,
        pretrained: bool = False,
    ) -> None:
        self._manager = get_plugin_manager()
        self.seed = seed
        self.options: dict[str, Any] = dict(options or {})
        self.weights_path: Path | None = None
        self.data = ""  # the dataset the weights were trained on, when known (val() uses it by default)
        self.last_val_dir: Path | None = None  # where the last val() wrote its report
        self.pipeline_changes: dict[str, Any] = {}  # input-pipeline fields the loaded weights record (ModelMeta)
        self._inference_cache: tuple[Any, Any] | None = None  # (weights key, fused copy): see inference_model
        self._callbacks: list[Any] = []  # add_callback's, passed to every train() before callbacks=[...]
        #: The tracker of the last ``track()`` call, which ``track(persist=True)`` continues.
        self.tracking_session: Any = None
        #: An exported graph this object was loaded from (``LibreYOLO("best.onnx")``): its path and stored facts.
        self.graph: tuple[Path, dict[str, Any]] | None = None
        # The resolution order (docs/weights.md): an hf:// reference; a file on disk; the file name of a
        # size's published weights (LibreYOLO's names and their short forms, from registry.yaml); a
        # registry name, built fresh or, with pretrained=True, from its published weights.
        reference = parse_hub_reference(os.fspath(model))
        if reference is not None:
            self._load_hub_reference(reference)
            return
        path = Path(model)
        if path.is_dir():
            raise WeightsNotFoundError(f"{path} is a directory, not a weights file; give the path of a .pt, .pth or .safetensors file")
        if path.is_file() and graph_format(path) is not None:
            self._load_graph(path)
        elif path.is_file():
            self._load_file(path, architecture)
        elif path.suffix.lower() in WEIGHT_SUFFIXES:
            try:
                family, size = resolve_model_name(path.name, self._manager.families)
            except ModelNameError:
                raise WeightsNotFoundError(f"weights file {path} does not exist") from None
            requested = f"{path}:" if path.name == os.fspath(model) else f"weights file {path} does not exist, and"
            self._load_published(family, size, requested=requested)
        else:
            family, size = self._resolve_name(str(model))
            if pretrained:
                self._load_published(family, size, requested=f"LibreYOLO({str(model)!r}, pretrained=True):")
                return
            if names is not None and num_classes is None:
                num_classes = len(names)
            self._build(family, size, num_classes, _as_names(names))

    # ------------------------------------------------------------------ construction
    def _build(self, family: str, size: str, num_classes: int | None, names: dict[int, str] | None) -> None:
        self.declaration: FamilyDeclaration = self._manager.family(family)
        self.family, self.size, self.task = family, size, self.declaration.task
        if num_classes is None:
            num_classes = self.declaration.published_num_classes or 0
        if names is not None and len(names) != num_classes:
            raise ValueError(f"names has {len(names)} entries but num_classes={num_classes}; give as many names as classes")
        self.num_classes = num_classes
        self.names = names if names is not None else default_names(num_classes)
        self.input_size = self.declaration.size(size).input_size
        self.model: "torch.nn.Module" = self._seeded_build(num_classes)

    def _seeded_build(self, num_classes: int) -> "torch.nn.Module":
        """A fresh model of this family and size, initialised from ``self.seed`` when one is set."""
        if self.seed is None:
            return self._manager.build_model(self.family, self.size, num_classes, self.options)
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self._manager.build_model(self.family, self.size, num_classes, self.options)

    def _load_file(self, path: Path, architecture: str | None = None, *, origin: str = "") -> None:
        """Build the model a weights file describes and load its tensors (converted to zoo's keys).

        ``origin`` says where a fetched file was published (``hf://LibreYOLO/LibreYOLO9s/LibreYOLO9s.pt``), for the log.
        """
        from zoo_core.loading import load_weights_file

        loaded = load_weights_file(path, self._manager, architecture=architecture)
        self.options = {**loaded.options, **self.options}
        try:
            self._build(loaded.family, loaded.size, loaded.num_classes, loaded.names or None)
        except (ValueError, TypeError) as error:
            if isinstance(error, WeightsError):
                raise
            raise CorruptWeightsError(
                f"{path} ({loaded.description}) describes a model zoo cannot build: {error}. Its metadata may be "
                "damaged or written by another zoo version; load it with options= that fix it, or re-save it"
            ) from None
        if loaded.input_size:
            self.input_size = loaded.input_size
        self.load_state_dict(loaded.state_dict, source=f"{path} ({loaded.description})")
        self.weights_path, self.data, self.pipeline_changes = path, loaded.data, dict(loaded.input_pipeline)
        published = f"; published as {origin}" if origin else ""
        log.info("%s: weights loaded from %s (%s%s)", self.name, path, loaded.description, published)

    def _load_graph(self, path: Path) -> None:
        """Stand for the exported graph at ``path`` (``zoo_core.export.read_graph_facts``): ``predict``, ``val`` and
        ``track`` run it through its runtime; the family's model supplies only its ``postprocess``."""
        from zoo_core.export import read_graph_facts

        facts = read_graph_facts(path)
        self.options = {**dict(facts.get("options") or {}), **self.options}
        self._build(str(facts["family"]), str(facts["size"]), len(facts["names"]), facts["names"])
        height, width = (int(side) for side in facts["input_size"])
        self.input_size = height if height == width else (height, width)
        self.pipeline_changes = dict(facts.get("input_pipeline") or {})
        self.weights_path, self.graph = path, (path, facts)
        log.info("%s: exported graph loaded from %s (%s)", self.name, path, graph_format(path))

    def _refuse_graph(self, call: str) -> None:
        if self.graph is not None:
            raise ArgumentError(f"{call}: {self.graph[0]} is an exported graph, which holds no trainable weights; "
                                f"{call.split('(')[0]} the .pt or .safetensors it was exported from")

    def _load_published(self, family: str, size: str, *, requested: str) -> None:
        """Load ``family``-``size``'s published weights, fetched once into the cache (``zoo_core.published_weights``).

        ``requested`` opens the error when none are published (what the caller asked for).
        """
        name = canonical_name(family, size)
        source = self._manager.family(family).size(size).weights
        if source is None:
            raise not_published(requested, family, size)
        fresh = f"build a freshly initialised model with LibreYOLO({name!r})"
        path = fetch(source, label=source.file_name, fresh_hint=fresh)
        self._load_file(path, architecture=name, origin=source.describe())
        if (self.family, self.size) != (family, size):
            raise WeightsMismatchError(
                f"{path}, the published weights of {name} ({source.describe()}), holds {self.name}; the publisher may "
                f"have replaced the file. Remove it from the cache and retry, or {fresh}"
            )

    def _load_hub_reference(self, reference: HubReference) -> None:
        """Load the file an ``hf://`` reference names (a registry repository keeps its declared checks)."""
        source, model = source_of_reference(reference, self._manager.families)
        if model is not None:
            self._load_published(*model, requested=f"{reference}:")
            return
        hint = "pass the path of a local weights file, or a registry name for a fresh model"
        self._load_file(fetch(source, label=str(reference), fresh_hint=hint), origin=source.describe())

    def _resolve_name(self, name: str) -> tuple[str, str]:
        """``(family, size)`` of a model name; a blocked plugin's model says it is blocked."""
        try:
            return resolve_model_name(name, self._manager.families)
        except ModelNameError:
            registry = load_registry()
            # A family is out when its own name, its package, or a sibling family served by its package is blocked.
            blocks = {family: (family if family in self._manager.blocked_names else self._manager.block_on_module(declaration.plugin))
                      for family, declaration in registry.items()}
            blocked = {family: registry[family] for family, block in blocks.items() if block}
            try:
                family, size = resolve_model_name(name, blocked) if blocked else ("", "")
            except ModelNameError:
                family = ""
            if family:
                raise ModelNameError(
                    f"{name!r} is {canonical_name(family, size)}, whose plugin {blocks[family]!r} is blocked "
                    f"({', '.join(sorted(self._manager.blocked_names))} in ZOO_BLOCK_PLUGINS or block=); unblock it to "
                    "use this model"
                ) from None
            raise

    def load_state_dict(self, state_dict: Mapping[str, "torch.Tensor"], *, source: str | Path = "state dict") -> None:
        """Load weights strictly; ``WeightsMismatchError`` naming the source and the first keys that do not fit."""
        from zoo_core.loading import mismatch_report

        expected = {key: tuple(tensor.shape) for key, tensor in self.model.state_dict().items()}
        report = mismatch_report(expected, state_dict)
        if report:
            raise WeightsMismatchError(
                f"{source} does not fit {canonical_name(self.family, self.size)} with {self.num_classes} classes: "
                f"{report}. It was saved from another family, size or class count; load it under the name it "
                "was saved with."
            )
        self.model.load_state_dict(state_dict, strict=True)

    # ------------------------------------------------------------------ public API
    @property
    def meta(self) -> ModelMeta:
        """The metadata written next to the weights."""
        return ModelMeta(
            family=self.family,
            size=self.size,
            task=self.task,
            num_classes=self.num_classes,
            names=dict(self.names),
            input_size=self.input_size,
            zoo_version=__version__,
            options=dict(self.options),
            data=self.data,
            input_pipeline=dict(self.pipeline_changes),
        )

    @property
    def input_pipeline(self) -> "InputPipeline":
        """How an image becomes this model's input (``zoo_core/data/input_pipeline.py``): its family's declaration
        for its size (docs/registry.md), with the fields its weights file records (``pipeline_changes``)."""
        return self._recipe().task.input_pipeline.merged(self.pipeline_changes)

    @property
    def name(self) -> str:
        """The canonical model name, e.g. ``yolo9-t``."""
        return canonical_name(self.family, self.size)

    def save(self, path: str | os.PathLike[str], *, format: str | None = None) -> Path:
        """Write the weights and metadata to ``path`` (atomically).

        ``format="zoo"`` (the default for ``.safetensors``) writes safetensors with zoo's metadata;
        ``format="libreyolo"`` (the default for ``.pt``) writes a LibreYOLO 1.6 checkpoint in
        LibreYOLO's keys, through the family's converter (docs/weights.md).
        """
        self._refuse_graph(f"save({str(path)!r})")
        path = Path(path)
        suffix = path.suffix.lower()
        format = format or {".safetensors": "zoo", ".pt": "libreyolo"}.get(suffix)
        if format == "zoo" and suffix == ".safetensors":
            return save_safetensors(path, self.model.state_dict(), self.meta)
        if format == "libreyolo" and suffix == ".pt":
            return self._save_libreyolo(path)
        raise ValueError(
            f"save({str(path)!r}, format={format!r}): write zoo's format to a .safetensors path, or "
            "format='libreyolo' to a .pt path"
        )

    def _save_libreyolo(self, path: Path) -> Path:
        from zoo_core.building import ConvertedWeights
        from zoo_core.weight_formats import libreyolo_checkpoint
        from zoo_core.weights import atomic_torch_save

        # Without a converter the family's keys are LibreYOLO's (the timm-named classifiers).
        converted = self._manager.convert_weights(self.family, self.size, self.model.state_dict(), "zoo", "libreyolo")
        if converted is None:
            converted = ConvertedWeights(self.model.state_dict())
        height, width = image_size_hw(self.input_size)
        checkpoint = libreyolo_checkpoint(
            converted.state_dict, family=self.declaration.libreyolo_family or self.family, size=converted.size or self.size,
            task=self.task,
            names=self.names, input_size=max(height, width),
            letterbox_placement=self.input_pipeline.placement if self.input_pipeline.resize == "letterbox" else None,
        )
        if height != width:  # LibreYOLO's rectangle: the longer side in imgsz, both sides beside it
            checkpoint.update(imgsz_h=height, imgsz_w=width)
        return atomic_torch_save(checkpoint, path)

    def export(self, format: str = "libreyolo", path: str | os.PathLike[str] | None = None, *, batch: int = 1,
               imgsz: ImageSize | None = None, half: bool = False, dynamic: bool = False, simplify: bool = False,
               opset: int | None = None, **unknown: Any) -> Path:
        """Write the model in ``format`` and return the file.

        ``"libreyolo"`` is a LibreYOLO 1.6 checkpoint; ``"onnx"`` and ``"torchscript"`` are the
        eval-mode graph with a dynamic batch (``zoo_core.export``), traced at ``imgsz`` (default: the
        model's input size; rounded up to the task's size multiple). Ultralytics' options: ``half`` (a
        float16 graph), ``dynamic`` (height and width dynamic too, checked at a second size), ``simplify``
        (onnxslim), ``opset``, ``batch`` (the traced example's batch). The default path sits beside the
        weights the model was loaded from (``best.onnx``), or in the current folder for a fresh model
        (``yolo9-t.onnx``, ``yolo9-t.libreyolo.pt``). Another keyword is an ``ArgumentError`` naming the
        closest of these.
        """
        from zoo_core.export import GRAPH_FORMATS, ONNX_OPSET, export_graph
        from zoo_core.tasks.runner import check_arguments

        check_arguments("export", unknown, ("format", "path", "batch", "imgsz", "half", "dynamic", "simplify", "opset"))

        suffixes = {"libreyolo": ".libreyolo.pt", **GRAPH_FORMATS}
        if format not in suffixes:
            raise ArgumentError(f"export(format={format!r}): the formats are {', '.join(map(repr, suffixes))}")
        if path is None:
            stem = self.weights_path.with_suffix("") if self.weights_path is not None else Path(self.name)
            path = stem.with_name(f"{stem.name}{suffixes[format]}")
        if format == "libreyolo":
            graph_only = {key: value for key, value in (("imgsz", imgsz), ("half", half), ("dynamic", dynamic),
                                                         ("simplify", simplify), ("opset", opset)) if value}
            if graph_only:
                raise ArgumentError(f"export(format='libreyolo') writes the weights, not a graph: {', '.join(graph_only)} "
                                    "apply to format='onnx' or 'torchscript'")
            return self.save(path, format="libreyolo")
        task = self._recipe().task
        input_size = self.input_size if imgsz is None else self._export_size(imgsz, task.size_multiple)
        self._refuse_graph(f"export(format={format!r})")
        facts = {"family": self.family, "size": self.size, "names": self.names, "zoo_version": __version__,
                 "options": dict(self.options), "input_pipeline": dict(self.pipeline_changes)}
        return export_graph(self.model, format, path, name=self.name, task=self.task, outputs=task.export_outputs,
                            input_size=input_size, metadata=facts, batch=batch, opset=ONNX_OPSET if opset is None else opset,
                            half=half, dynamic=dynamic, simplify=simplify, size_multiple=task.size_multiple)

    def _export_size(self, imgsz: Any, multiple: int) -> tuple[int, int]:
        """``imgsz`` of an export as ``(height, width)``, each rounded up to ``multiple`` (said when it changes)."""
        try:
            height, width = image_size_hw(normalise_image_size(imgsz, "export imgsz", minimum=16))
        except ValueError as error:
            raise ArgumentError(f"{error}: give a size in pixels (640) or (height, width)") from None
        rounded = (-(-height // multiple) * multiple, -(-width // multiple) * multiple)
        if rounded != (height, width):
            log.info("export imgsz=%s rounded up to %sx%s, a multiple of %d as %s models need", imgsz, *rounded, multiple, self.task)
        return rounded

    def info(self, verbose: bool = True) -> dict[str, Any]:
        """Family, size, task, classes, input size, layers, parameters, GFLOPs and DDP defaults.

        With ``verbose`` (the default, as in Ultralytics) a one-line summary is printed too;
        the dict is returned either way.
        """
        from zoo_core.export import model_summary

        summary = model_summary(self.model, self.input_size)
        facts = {
            "name": self.name,
            "family": self.family,
            "size": self.size,
            "task": self.task,
            "num_classes": self.num_classes,
            "input_size": self.input_size,
            "layers": summary["layers"],
            "parameters": summary["parameters"],
            "gflops": summary["gflops"],
            "sync_bn_default": self._manager.default_sync_bn(self.family),
            "spawn": self._manager.supports_spawn(self.family),
            "weights": str(self.weights_path) if self.weights_path else None,
        }
        if verbose:
            height, width = image_size_hw(self.input_size)
            cost = f"{summary['gflops']:.2f} GFLOPs at {height}x{width}" if summary["gflops"] is not None else "GFLOPs unknown"
            print(f"{self.name} summary: {summary['layers']} layers, {summary['parameters']:,} parameters, {cost}")
        return facts

    def add_callback(self, event: str, function: Any) -> None:
        """Run ``function`` at ``event`` of every later ``train()`` (on rank 0 only, E9).

        Events are Ultralytics' names that zoo has (``on_train_start``, ``optimizer_step``,
        ``on_train_epoch_end``, ``on_fit_epoch_end``, ``on_train_end``; zoo's ``on_epoch_end``,
        ``on_optimizer_step`` too; ``zoo_core.engine.callbacks.EVENTS``). The function receives the
        event's plain data, not a trainer: ``(run_dir, config)``, ``(step)``, an ``EpochReport`` after
        each epoch's validation and checkpoint, or the ``TrainResult``. Training on several devices
        pickles it to the workers, so define it at module level; a lambda is refused there, named (E4).
        """
        from zoo_core.engine.callbacks import function_callback

        self._callbacks.append(function_callback(event, function))

    def train(self, **kwargs: Any) -> "TrainResult":
        """Train on ``data``; see ``zoo_core.engine.config.TrainConfig`` for every argument.

        ``device=[0, 1]`` (or ``"cpu,cpu"``) trains one process per device; ``batch`` is the global
        batch. ``pretrained=True`` (as Ultralytics users write it) starts a fresh model from its
        size's published weights, fetched here, in the calling process, before any worker exists; a
        model that already holds weights keeps them. On success this object holds rank 0's best
        weights, the dataset's classes and the training input size; on failure it is unchanged.
        """
        from zoo_core.engine import fit

        self._refuse_graph("train()")
        if self._callbacks:
            given = kwargs.get("callbacks") or []
            kwargs = {**kwargs, "callbacks": [*self._callbacks, *(given if isinstance(given, (list, tuple)) else [given])]}
        pretrained = kwargs.pop("pretrained", False)
        if not isinstance(pretrained, bool):
            raise TrainConfigError(f"pretrained={pretrained!r}: give True (start from the published weights) or False")
        before = dict(self.__dict__)
        try:
            if pretrained and self.weights_path is None:
                self._load_published(self.family, self.size, requested=f"train(pretrained=True) of {self.name}:")
            with self._spec_with_weights() as spec:
                outcome = fit(spec, kwargs, manager=self._manager)
        except BaseException:
            self.__dict__.update(before)  # the published weights were only this call's starting point
            raise
        self._apply(outcome)
        self.data = str(kwargs.get("data") or self.data)
        return outcome.result

    def val(self, **kwargs: Any) -> dict[str, float]:
        """Validate on ``data`` and return the task's metrics (``zoo_core.tasks.runner.validate`` lists every argument;
        another is an ``ArgumentError`` naming the closest).

        For detection and segmentation the dict also carries the per-class table (images, instances, P, R, mAP50,
        mAP50-95; ``zoo_core.tasks.class_table``) as ``metrics.class_table``, printed unless ``verbose=False``."""
        from zoo_core.tasks.runner import arguments_of, check_arguments, validate

        check_arguments("val", kwargs, arguments_of(validate, internal=("libre", "size_multiple")))
        validation = validate(self, size_multiple=self._recipe().input_size_multiple(), **kwargs)
        if validation.report_dir is not None:
            self.last_val_dir = validation.report_dir
        return validation.metrics

    def predict(self, source: Any, **kwargs: Any) -> Any:
        """Predict on an image, a video, a folder, a glob, a PIL image, an array, or a list of them.

        Returns the list of results, or with ``stream=True`` a generator yielding them one at a
        time (``zoo_core.tasks.runner.predict`` lists every argument: Ultralytics' ``classes``, ``save_txt``,
        ``save_conf``, ``save_crop``, ``line_width`` and ``verbose`` among them; another is an ``ArgumentError``
        naming the closest).
        """
        from zoo_core.tasks.runner import arguments_of, check_arguments, predict

        check_arguments("predict", kwargs, arguments_of(predict, internal=("libre", "source", "size_multiple", "follow")))
        return predict(self, source, size_multiple=self._recipe().input_size_multiple(), **kwargs)

    def track(self, source: Any, **kwargs: Any) -> Any:
        """Track objects through a video, a folder or list of frames in order, or one frame per call with
        ``persist=True``: each frame's result has ``boxes.id`` (masks and keypoints follow their box).

        ``tracker="bytetrack"`` (default), ``"botsort"`` or a tracker YAML; ``persist``, ``stream``, ``conf`` (default: the
        tracker's low threshold) and every ``predict`` argument (``zoo_core.tracking.video_tracking.track``). With
        ``save=True`` a video comes back as one annotated ``.mp4`` with IDs and trails, under ``runs/<task>/track``.
        """
        from zoo_core.tasks.runner import arguments_of, check_arguments, predict
        from zoo_core.tracking.video_tracking import track

        accepted = [*arguments_of(track, internal=("libre", "source", "predict_options")),
                    *arguments_of(predict, internal=("libre", "source", "size_multiple", "follow", "stream", "conf"))]
        check_arguments("track", kwargs, accepted)
        return track(self, source, size_multiple=self._recipe().input_size_multiple(), **kwargs)

    def inference_model(self, device: Any) -> Any:
        """The model as ``predict`` and ``val`` run it: a fused copy on ``device`` (``zoo_core.export.inference_form``:
        BatchNorms folded, re-parameterised branches merged, training-only branches dropped), kept until the
        weights change (a parameter or buffer replaced or modified in place, or another model assigned). A model loaded
        from an exported graph runs that graph (``zoo_core.export.graph_model``)."""
        import torch

        from zoo_core.export import inference_form

        if self.graph is not None:
            from zoo_core.export import graph_model

            key = ("graph", str(device))
            if self._inference_cache is None or self._inference_cache[0] != key:
                self._inference_cache = (key, graph_model(self.graph[0], self.graph[1], self.model, torch.device(device)))
            return self._inference_cache[1]
        tensors = [*self.model.parameters(), *self.model.buffers()]
        key = (id(self.model), str(device), tuple((id(tensor), tensor._version) for tensor in tensors))
        if self._inference_cache is None or self._inference_cache[0] != key:
            self._inference_cache = None  # free the old copy before making the new one
            inference = inference_form(self.model).to(device)
            if self._recipe().uses_channels_last(torch.device(device)):  # the trainer's rule
                inference = inference.to(memory_format=torch.channels_last)
            self._inference_cache = (key, inference)
        return self._inference_cache[1]

    # ------------------------------------------------------------------ the engine boundary
    def spec(self, weights: Path | None = None) -> "ModelSpec":
        """This model as a ``ModelSpec`` (what the engine trains), with ``weights`` as its initial weights file."""
        from zoo_core.engine import ModelSpec

        return ModelSpec(
            family=self.family, size=self.size, task=self.task, num_classes=self.num_classes, names=dict(self.names),
            input_size=self.input_size, options=dict(self.options), weights=weights, source=self.weights_path,
            input_pipeline=dict(self.pipeline_changes),
        )

    @contextlib.contextmanager
    def _spec_with_weights(self) -> Iterator["ModelSpec"]:
        """The spec of this model, its current weights in a private temp file for the duration of the block.

        The folder is ``zoo-weights-<pid>-…``, so a later run sweeps it if this process is killed first.
        """
        from zoo_core.paths import WEIGHTS_PREFIX, owned_temp_dir

        with owned_temp_dir(WEIGHTS_PREFIX) as directory:
            weights = Path(directory) / "initial.safetensors"
            save_safetensors(weights, self.model.state_dict(), self.meta)
            yield self.spec(weights)

    def _apply(self, outcome: "FitOutcome") -> None:
        """Take the trained model from ``outcome``: its classes, names, build options, input size and weights."""
        trained = outcome.spec
        if trained.num_classes != self.num_classes or dict(trained.options) != dict(self.options):
            # The run changed the head (its dataset's classes) or a build option (dropout, a pose dataset's keypoints).
            self.model = self._manager.build_model(self.family, self.size, trained.num_classes, dict(trained.options))
            self.options = dict(trained.options)
        self.model.load_state_dict(outcome.state_dict, strict=True)
        self.model.eval()
        self.num_classes, self.names = trained.num_classes, dict(trained.names)
        self.input_size, self.weights_path = trained.input_size, outcome.result.best

    def _recipe(self) -> "TrainingRecipe":
        return self._manager.training_recipe(self.family, self.size)

    def __call__(self, source: Any, **kwargs: Any) -> list[Any]:
        """Same as ``predict``."""
        return self.predict(source, **kwargs)

    def __repr__(self) -> str:
        return f"LibreYOLO({self.name!r}, task={self.task!r}, num_classes={self.num_classes})"


def _as_names(names: list[str] | Mapping[int, str] | None) -> dict[int, str] | None:
    if names is None:
        return None
    if isinstance(names, Mapping):
        return {int(key): str(value) for key, value in names.items()}
    return {index: str(name) for index, name in enumerate(names)}
