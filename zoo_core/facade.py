"""``LibreYOLO``: one object per model, whatever its family or task.

``LibreYOLO("yolo9-s")`` builds a fresh model, ``LibreYOLO("run/weights/best.pt")`` or
``LibreYOLO("model.safetensors")`` loads weights with their metadata, and a missing file named
like a registry entry (``LibreYOLO9s.pt``) is downloaded from the registry's URL into
``ZOO_HOME`` and checked against its sha256. Training, validation and prediction are delegated
to the engine (``zoo_core.engine.fit``: the facade hands it a ``ModelSpec`` and applies the
``FitOutcome`` it returns) and to the task modules, which import torch on first use.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from zoo_core import __version__
from zoo_core.errors import ModelNameError, WeightsMismatchError, WeightsNotFoundError
from zoo_core.naming import WEIGHT_SUFFIXES, canonical_name, resolve_model_name
from zoo_core.paths import zoo_home
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.registry import FamilyDeclaration
from zoo_core.weights import ModelMeta, download_weights, read_weights, save_safetensors, sha256_of

if TYPE_CHECKING:
    import torch

    from zoo_core.engine import FitOutcome, ModelSpec, TrainingRecipe, TrainResult

__all__ = ["LibreYOLO"]


def default_names(num_classes: int) -> dict[int, str]:
    """Placeholder class names ``{0: "class0", ...}`` for a model built without a dataset."""
    return {index: f"class{index}" for index in range(num_classes)}


class LibreYOLO:
    """A model of any registered family, with ``train``, ``val``, ``predict`` and ``save``.

    Args:
        model: a registry name (``"yolo9-s"``, ``"YOLO9s"``, ``"resnet18"``) for a fresh model,
            or a path to ``.safetensors``/``.pt``/``.pth`` weights.
        num_classes: classes of a fresh model (default: the family's published count); ignored
            when loading weights, whose metadata decides.
        names: class names of a fresh model, a list or ``{index: name}``.
        options: extra keyword arguments for the family's builder.
        seed: seeds the initialisation of a fresh model, so two identical scripts start from
            identical weights (None: torch's global random state decides). The caller's random
            state is left as it was.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        num_classes: int | None = None,
        names: list[str] | Mapping[int, str] | None = None,
        options: Mapping[str, Any] | None = None,
        seed: int | None = 0,
    ) -> None:
        self._manager = get_plugin_manager()
        self.seed = seed
        self.options: dict[str, Any] = dict(options or {})
        self.weights_path: Path | None = None
        path = Path(model)
        if path.is_file():
            self._load_file(path)
        elif path.suffix.lower() in WEIGHT_SUFFIXES:
            self._load_file(self._download_for(path))
        else:
            family, size = resolve_model_name(str(model), self._manager.families)
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

    def _load_file(self, path: Path) -> None:
        state_dict, meta = read_weights(path)
        if meta is None:
            try:
                family, size = resolve_model_name(path.name, self._manager.families)
            except ModelNameError:
                raise WeightsMismatchError(
                    f"{path} carries no zoo metadata and its file name names no registry model; "
                    "rename it after its model (e.g. LibreYOLO9s.pt) or save it with LibreYOLO.save()"
                ) from None
            self._build(family, size, None, None)
        else:
            self.options = {**meta.options, **self.options}
            self._build(meta.family, meta.size, meta.num_classes, meta.names or None)
            if meta.input_size:
                self.input_size = meta.input_size
        self.load_state_dict(state_dict, source=path)
        self.weights_path = path

    def _download_for(self, path: Path) -> Path:
        try:
            family, size = resolve_model_name(path.name, self._manager.families)
        except ModelNameError:
            raise WeightsNotFoundError(f"weights file {path} does not exist") from None
        fresh = f"build a freshly initialised model with LibreYOLO({canonical_name(family, size)!r})"
        source = self._manager.family(family).size(size).weights
        if source is None:
            raise WeightsNotFoundError(
                f"weights file {path} does not exist and the registry lists no download for "
                f"{canonical_name(family, size)}; check the path, or {fresh}"
            )
        cached = zoo_home() / "weights" / path.name
        if cached.is_file() and sha256_of(cached) == source.sha256:
            return cached
        return download_weights(source.url, source.sha256, cached, fresh_hint=fresh)

    def load_state_dict(self, state_dict: Mapping[str, "torch.Tensor"], *, source: str | Path = "state dict") -> None:
        """Load weights strictly; ``WeightsMismatchError`` naming the model if they do not fit."""
        expected = self.model.state_dict()
        missing = [key for key in expected if key not in state_dict]
        unexpected = [key for key in state_dict if key not in expected]
        mismatched = [
            f"{key}: file {tuple(state_dict[key].shape)} vs model {tuple(tensor.shape)}"
            for key, tensor in expected.items()
            if key in state_dict and tuple(state_dict[key].shape) != tuple(tensor.shape)
        ]
        if missing or unexpected or mismatched:
            details = []
            if missing:
                details.append(f"{len(missing)} missing (e.g. {missing[0]})")
            if unexpected:
                details.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
            if mismatched:
                details.append(f"{len(mismatched)} of another shape (e.g. {mismatched[0]})")
            raise WeightsMismatchError(
                f"{source} does not fit {canonical_name(self.family, self.size)} with "
                f"{self.num_classes} classes: tensors {'; '.join(details)}. It was saved from another "
                "family, size or class count; load it under the name it was saved with."
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
        )

    @property
    def name(self) -> str:
        """The canonical model name, e.g. ``yolo9-t``."""
        return canonical_name(self.family, self.size)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the weights and metadata to a ``.safetensors`` file (atomically)."""
        path = Path(path)
        if path.suffix.lower() != ".safetensors":
            raise ValueError(f"save() writes safetensors; use a path ending in .safetensors, not {path.name!r}")
        return save_safetensors(path, self.model.state_dict(), self.meta)

    def info(self) -> dict[str, Any]:
        """Family, size, task, classes, input size, parameter count and DDP defaults."""
        from zoo_core.building import count_parameters

        return {
            "name": self.name,
            "family": self.family,
            "size": self.size,
            "task": self.task,
            "num_classes": self.num_classes,
            "input_size": self.input_size,
            "parameters": count_parameters(self.model),
            "sync_bn_default": self._manager.default_sync_bn(self.family),
            "spawn": self._manager.supports_spawn(self.family),
            "weights": str(self.weights_path) if self.weights_path else None,
        }

    def train(self, **kwargs: Any) -> "TrainResult":
        """Train on ``data``; see ``zoo_core.engine.config.TrainConfig`` for every argument.

        ``device=[0, 1]`` (or ``"cpu,cpu"``) trains one process per device; ``batch`` is the global
        batch. On success this object holds rank 0's best weights, the dataset's classes and the
        training input size; on failure it is unchanged.
        """
        from zoo_core.engine import fit

        with self._spec_with_weights() as spec:
            outcome = fit(spec, kwargs, manager=self._manager)
        self._apply(outcome)
        return outcome.result

    def val(self, **kwargs: Any) -> dict[str, float]:
        """Validate on ``data`` and return the task's metrics (``zoo_core.tasks.runner.validate``)."""
        from zoo_core.tasks.runner import validate

        return validate(self, size_multiple=self._recipe().input_size_multiple(), **kwargs)

    def predict(self, source: Any, **kwargs: Any) -> list[Any]:
        """Predict on an image path, folder, PIL image, numpy array, or a list of them."""
        from zoo_core.tasks.runner import predict

        return predict(self, source, size_multiple=self._recipe().input_size_multiple(), **kwargs)

    # ------------------------------------------------------------------ the engine boundary
    def spec(self, weights: Path | None = None) -> "ModelSpec":
        """This model as a ``ModelSpec`` (what the engine trains), with ``weights`` as its initial weights file."""
        from zoo_core.engine import ModelSpec

        return ModelSpec(
            family=self.family, size=self.size, task=self.task, num_classes=self.num_classes, names=dict(self.names),
            input_size=self.input_size, options=dict(self.options), weights=weights, source=self.weights_path,
        )

    @contextlib.contextmanager
    def _spec_with_weights(self) -> Iterator["ModelSpec"]:
        """The spec of this model, its current weights in a private temp file for the duration of the block."""
        with tempfile.TemporaryDirectory(prefix="zoo-weights-") as directory:
            weights = Path(directory) / "initial.safetensors"
            save_safetensors(weights, self.model.state_dict(), self.meta)
            yield self.spec(weights)

    def _apply(self, outcome: "FitOutcome") -> None:
        """Take the trained model from ``outcome``: its classes, names, input size and weights."""
        trained = outcome.spec
        if trained.num_classes != self.num_classes:
            self.model = self._manager.build_model(self.family, self.size, trained.num_classes, self.options)
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
