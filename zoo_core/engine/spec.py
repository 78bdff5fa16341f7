"""What the engine trains and what it gives back: ``ModelSpec`` in, ``FitOutcome`` out, and the
``PreparedRun`` every rank of a run agrees on.

A ``ModelSpec`` is the serialisable description of a model that zoo's weights files already
carry (family, size, task, classes and names, input size, builder options) plus the file that
holds its initial weights. It is all a spawned worker or a torchrun rank needs to rebuild the
model through its plugin manager, so the engine never holds a reference to the caller's objects.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo_core.weights import ModelMeta, read_weights

if TYPE_CHECKING:
    import torch

    from zoo_core.engine.train_result import TrainResult
    from zoo_core.plugin_manager import ZooPluginManager
    from zoo_core.registry import ImageSize
    from zoo_core.tasks.base import DataSpec

__all__ = ["ModelSpec", "FitOutcome", "PreparedRun", "build_from_spec"]


@dataclass(frozen=True)
class PreparedRun:
    """What every rank of a run agrees on before training: data, input size, batch, accumulation."""

    data: "DataSpec"
    image_size: "ImageSize"  # an int (square) or (height, width)
    batch: int  # global, over all ranks
    accumulate: int


@dataclass(frozen=True)
class ModelSpec:
    """A model as data: rebuilt anywhere with ``build_from_spec``.

    ``weights`` is a zoo weights file (safetensors or a training checkpoint) holding the
    initial weights, or None for a freshly initialised model. ``source`` is the file the caller's
    model was loaded from, if any (``resume=True`` continues that checkpoint).
    """

    family: str
    size: str
    task: str
    num_classes: int
    names: dict[int, str] = field(default_factory=dict)
    input_size: "ImageSize" = 0
    options: dict[str, Any] = field(default_factory=dict)
    weights: Path | None = None
    source: Path | None = None
    input_pipeline: dict[str, Any] = field(default_factory=dict)  # input-pipeline fields of these weights (ModelMeta)

    @classmethod
    def from_meta(cls, meta: ModelMeta, *, weights: Path | None = None, source: Path | None = None) -> "ModelSpec":
        """The spec of a model described by weights-file metadata."""
        return cls(meta.family, meta.size, meta.task, meta.num_classes, dict(meta.names), meta.input_size,
                   dict(meta.options), weights, source, dict(meta.input_pipeline))

    def meta(self, zoo_version: str = "") -> ModelMeta:
        """The metadata written next to this model's weights."""
        return ModelMeta(self.family, self.size, self.task, self.num_classes, dict(self.names), self.input_size,
                         zoo_version, dict(self.options), input_pipeline=dict(self.input_pipeline))

    def replace(self, **changes: Any) -> "ModelSpec":
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    @property
    def name(self) -> str:
        """``family-size``, as users write it."""
        return f"{self.family}-{self.size}"


@dataclass
class FitOutcome:
    """What ``fit`` returns on every rank: the run's result, the trained model's spec and weights.

    ``spec`` describes the trained model (the dataset's classes and names, the training input
    size; ``weights`` is rank 0's ``best.pt``); ``state_dict`` holds those weights on the CPU.
    """

    result: "TrainResult"
    spec: ModelSpec
    state_dict: dict[str, "torch.Tensor"]


def build_from_spec(spec: ModelSpec, manager: "ZooPluginManager") -> "torch.nn.Module":
    """Build ``spec``'s model through ``manager`` and load its initial weights (strictly)."""
    model = manager.build_model(spec.family, spec.size, spec.num_classes, spec.options)
    if spec.weights is not None:
        state_dict, _ = read_weights(spec.weights)
        model.load_state_dict(state_dict, strict=True)
    return model
