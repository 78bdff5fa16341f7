"""A family's training recipe: everything family-specific the trainer asks.

The trainer knows no family. For each family it asks the ``training_recipe`` hook for a
``TrainingRecipe`` and consults it for:

- ``config_defaults``: the family's published training arguments (registry ``train_defaults``),
  under the user's arguments;
- ``forward_train(model, batch)``: one training forward pass to ``(loss, items)``; the default
  calls ``model(images)`` and the task's loss, a DETR passes the targets to ``forward``;
- ``parameter_groups`` and ``build_optimizer``: which parameters decay, learning-rate multipliers
  by name prefix (``lr_multipliers``), SGD / Adam / AdamW;
- ``lr_schedule``: the per-iteration schedule (warm-up, then linear, cosine, flat-cosine,
  multi-step or poly; ``zoo_core/engine/schedule.py``);
- ``build_ema``: the weight average (decay and warm-up ramp), or none;
- ``size_multiple`` and ``augment_settings``: input sizes the network accepts and the train-time
  augmentation; ``multi_scale_sizes``: the sizes a ``multi_scale`` run draws a batch's size from;
- ``closed_augmentation``: what the no-augmentation phase of the last ``close_mosaic`` epochs
  turns off (YOLO: mosaic and MixUp; the DETR line: everything but the flip, multi-scale too);
- events: ``on_train_start``, ``on_epoch_start`` and ``on_augmentation_closed`` (that phase
  begins; YOLOX turns its L1 loss on).

The core answers the hook last with the class a family declares in registry.yaml (``recipe:
"module:Class"``), or with ``TrainingRecipe`` itself: today's defaults plus ``train_defaults``.
A family changes only what it needs by subclassing (docs/plugins.md has a worked example).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import torch
from torch import nn

from zoo_core.engine.ema import ModelEMA
from zoo_core.engine.multi_scale import ranged_sizes
from zoo_core.engine.optim import ParameterGroup, auto_optimizer, build_optimizer, split_parameter_groups
from zoo_core.engine.schedule import LRSchedule
from zoo_core.tasks import task_of_family
from zoo_core.tasks.base import AugmentSettings, unwrap_model

if TYPE_CHECKING:
    from zoo_core.engine.config import TrainConfig
    from zoo_core.registry import FamilyDeclaration
    from zoo_core.tasks.base import Task

__all__ = ["TrainingRecipe", "RunInfo", "only_flips"]


@dataclass(frozen=True)
class RunInfo:
    """Where a run is, as recipe events see it."""

    epoch: int  # 0-based epoch about to run (or running)
    epochs: int
    iterations_per_epoch: int
    rank: int
    world_size: int


def only_flips(settings: AugmentSettings) -> AugmentSettings:
    """``settings`` with every augmentation off but the horizontal flip: the DETR line's stop epoch
    (D-FINE's ``stop_epoch`` policy ends photometric distortion, zoom-out, IoU crop and mosaic, and
    its collate's multi-scale)."""
    return dataclasses.replace(settings, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, degrees=0.0, translate=0.0, scale=0.0,
                               mosaic=0.0, mixup=0.0, multi_scale=False)


class TrainingRecipe:
    """The default recipe of every family; subclass it to change what your family's recipe changes.

    Args:
        declaration: the family's registry declaration (``train_defaults``, ``task``...).
        size: the size being trained.
    """

    #: Learning-rate multipliers by parameter-name prefix, e.g. ``{"backbone.": 0.1}``.
    lr_multipliers: ClassVar[Mapping[str, float]] = {}
    #: Input sizes must be multiples of this; None: the task's ``size_multiple`` (32 for detection and segmentation).
    size_multiple: ClassVar[int | None] = None

    def __init__(self, declaration: "FamilyDeclaration", size: str) -> None:
        self.declaration = declaration
        self.size = size
        #: The family's task, running the family's input pipeline at this size.
        self.task: "Task" = task_of_family(declaration, size)

    # ----------------------------------------------------------------- arguments
    @property
    def config_defaults(self) -> dict[str, Any]:
        """Training arguments of the published recipe, applied under the user's (``train_defaults``)."""
        return dict(self.declaration.train_defaults)

    def uses_channels_last(self, device: torch.device) -> bool:
        """Whether the model trains in channels-last memory on ``device`` (the registry's ``channels_last``, on a CPU)."""
        return self.declaration.channels_last and device.type == "cpu"

    def input_size_multiple(self) -> int:
        """The multiple every input size is rounded up to."""
        return self.size_multiple or self.task.size_multiple

    def augment_settings(self, config: "TrainConfig") -> AugmentSettings:
        """Train-time augmentation from the arguments (the task applies those that fit it)."""
        return AugmentSettings(
            enabled=config.augment, hsv_h=config.hsv_h, hsv_s=config.hsv_s, hsv_v=config.hsv_v, degrees=config.degrees,
            translate=config.translate, scale=config.scale, fliplr=config.fliplr, flipud=config.flipud, mosaic=config.mosaic,
            mixup=config.mixup, multi_scale=config.multi_scale,
        )

    def multi_scale_sizes(self, image_size: int) -> tuple[int, ...]:
        """The sizes (of the longer side) a ``multi_scale`` run draws each batch's size from.

        Default: Ultralytics' rule, every size multiple from 0.5× to 1.5× ``image_size``.
        """
        return ranged_sizes(image_size, self.input_size_multiple())

    def closed_augmentation(self, settings: AugmentSettings) -> AugmentSettings:
        """The augmentation of the no-augmentation phase (the last ``close_mosaic`` epochs).

        Default: YOLO's ``close_mosaic``, mosaic and MixUp off, the per-image transforms and
        multi-scale on.
        """
        return dataclasses.replace(settings, mosaic=0.0, mixup=0.0)

    # ----------------------------------------------------------------- the step
    def forward_train(self, model: nn.Module, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One training forward pass: ``(loss, items)`` for a preprocessed batch.

        ``model`` may be wrapped in DistributedDataParallel: call it (not its ``module``) so that
        gradients are synchronised, and reach family methods through ``unwrap_model(model)``.
        The loss is a per-sample mean (never scaled by batch or world size).
        """
        outputs = model(batch["images"])
        return self.task.loss(unwrap_model(model), outputs, batch)

    # ----------------------------------------------------------------- optimisation
    def parameter_groups(self, model: nn.Module, config: "TrainConfig") -> list[ParameterGroup]:
        """Parameters by decay kind and ``lr_multipliers`` (see ``split_parameter_groups``)."""
        return split_parameter_groups(model, self.lr_multipliers)

    def build_optimizer(
        self, model: nn.Module, config: "TrainConfig", *, iterations: int, images_per_step: int
    ) -> torch.optim.Optimizer:
        """The optimizer over ``parameter_groups``; ``optimizer="auto"`` picks by run length.

        Weight decay scales with the images per optimizer step relative to ``nbs`` (Ultralytics'
        rule, so published YOLO values carry over at any batch).
        """
        name, lr = config.optimizer, config.lr0
        if name == "auto":
            name, lr = auto_optimizer(iterations)
        weight_decay = config.weight_decay * (images_per_step / config.nbs if config.nbs else 1.0)
        return build_optimizer(
            self.parameter_groups(model, config), name, lr, momentum=config.momentum, weight_decay=weight_decay,
            beta2=config.beta2,
        )

    def lr_schedule(self, config: "TrainConfig", iterations_per_epoch: int, optimizer: torch.optim.Optimizer) -> LRSchedule:
        """The per-iteration schedule: warm-up, then ``lr_schedule`` (default: ``cosine`` if ``cos_lr`` else ``linear``)."""
        name = config.lr_schedule or ("cosine" if config.cos_lr else "linear")
        warmup = config.warmup_iters if config.warmup_iters is not None else round(config.warmup_epochs * iterations_per_epoch)
        bias_groups = frozenset(index for index, group in enumerate(optimizer.param_groups) if group.get("name", "").startswith("bias"))
        return LRSchedule(
            name=name, epochs=config.epochs, iterations_per_epoch=iterations_per_epoch, lrf=config.lrf,
            warmup_iterations=warmup, warmup_bias_lr=config.warmup_bias_lr, warmup_momentum=config.warmup_momentum,
            momentum=config.momentum, flat_epochs=config.flat_epochs, no_augmentation_epochs=config.close_mosaic,
            milestones=tuple(config.lr_milestones), gamma=config.lr_gamma, power=config.lr_power, bias_groups=bias_groups,
        )

    def build_ema(self, model: nn.Module, config: "TrainConfig") -> ModelEMA | None:
        """The exponential moving average of the weights (``ema_decay``, ramp ``ema_tau``), or None."""
        return ModelEMA(model, config.ema_decay, config.ema_tau) if config.ema else None

    # ----------------------------------------------------------------- events
    def on_train_start(self, model: nn.Module, run: RunInfo) -> None:
        """Called once on every rank before the first epoch (``model`` unwrapped)."""

    def on_epoch_start(self, model: nn.Module, run: RunInfo) -> None:
        """Called on every rank at the start of each epoch (``model`` unwrapped)."""

    def on_augmentation_closed(self, model: nn.Module, run: RunInfo) -> None:
        """Called once on every rank when the no-augmentation phase begins (also when resuming past it)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.declaration.name!r}, {self.size!r})"

