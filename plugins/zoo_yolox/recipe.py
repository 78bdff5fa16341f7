"""YOLOX's published training recipe (Megvii-BaseDetection/YOLOX ``yolox/exp/yolox_base.py``).

What registry.yaml's ``train_defaults`` cannot say, this class does:

- **learning rate per image**: YOLOX sets ``lr = basic_lr_per_img × batch`` with
  ``basic_lr_per_img = 0.01 / 64`` and accumulates no gradients. ``lr0`` is therefore read as the
  rate for 64 images and multiplied by the images of an optimizer step / 64 (``nbs`` is null in
  the defaults, so that is the global batch, and the weight decay is not rescaled);
- **"yoloxwarmcos"**: during the warm-up the rate rises *quadratically* from 0,
  ``lr · (iteration / warm-up)²`` (biases alike, momentum constant), then follows a cosine from
  ``lr`` to ``lrf · lr`` that ends where the no-augmentation epochs begin and stays flat there.
  zoo's ``flat_cosine`` shape with the flat part equal to the warm-up is that cosine; this
  recipe makes the warm-up quadratic and ties the flat part to it;
- **sizes**: YOLOX-Nano trains with mosaic probability 0.5, Nano and Tiny with the mosaic scale
  range (0.5, 1.5) (zoo's ``scale`` 0.5) instead of (0.1, 2) (``scale`` 0.9) and without MixUp;
- **the L1 loss**: on for the last ``close_mosaic`` (15) epochs, when mosaic stops
  (``on_augmentation_closed``), off before.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zoo_core.engine.recipe import RunInfo, TrainingRecipe
from zoo_core.engine.schedule import LRSchedule

if TYPE_CHECKING:
    from zoo_core.engine.config import TrainConfig

__all__ = ["YOLOXRecipe", "QuadraticWarmupSchedule", "LR_REFERENCE_BATCH"]

LR_REFERENCE_BATCH = 64  # basic_lr_per_img = 0.01 / 64
_SIZE_DEFAULTS: dict[str, dict[str, Any]] = {
    # exps/default/yolox_nano.py: mosaic_prob 0.5, mosaic_scale (0.5, 1.5), enable_mixup False
    "n": {"mosaic": 0.5, "scale": 0.5, "mixup": 0.0},
    "t": {"scale": 0.5, "mixup": 0.0},  # exps/default/yolox_tiny.py: mosaic_scale (0.5, 1.5), enable_mixup False
}


@dataclasses.dataclass(frozen=True)
class QuadraticWarmupSchedule(LRSchedule):
    """``LRSchedule`` whose warm-up rises as the square of its progress (YOLOX's ``warmup_lr_start`` 0).

    Every group, biases included, starts from 0; the momentum is not warmed up when
    ``warmup_momentum`` equals ``momentum`` (YOLOX keeps 0.9 throughout).
    """

    def apply(self, optimizer: torch.optim.Optimizer, iteration: int) -> None:
        """Set each group's ``lr`` for ``iteration`` (and the warm-up momentum, as the base schedule)."""
        super().apply(optimizer, iteration)
        if iteration < self.warmup_iterations:
            progress = iteration / self.warmup_iterations
            factor = self.factor(iteration)
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * factor * progress**2


class YOLOXRecipe(TrainingRecipe):
    """The published YOLOX recipe; see the module docstring."""

    @property
    def config_defaults(self) -> dict[str, Any]:
        """``train_defaults`` with the size's own mosaic settings (Nano, Tiny)."""
        return {**super().config_defaults, **_SIZE_DEFAULTS.get(self.size, {})}

    def build_optimizer(
        self, model: nn.Module, config: "TrainConfig", *, iterations: int, images_per_step: int
    ) -> torch.optim.Optimizer:
        """SGD (nesterov) over zoo's parameter groups at ``lr0 × images per step / 64``."""
        scaled = config.model_copy(update={"lr0": config.lr0 * images_per_step / LR_REFERENCE_BATCH})
        return super().build_optimizer(model, scaled, iterations=iterations, images_per_step=images_per_step)

    def lr_schedule(self, config: "TrainConfig", iterations_per_epoch: int, optimizer: torch.optim.Optimizer) -> LRSchedule:
        """"yoloxwarmcos": quadratic warm-up; with ``flat_cosine`` the cosine starts where the warm-up ends."""
        schedule = super().lr_schedule(config, iterations_per_epoch, optimizer)
        if schedule.name == "flat_cosine":
            schedule = dataclasses.replace(schedule, flat_epochs=schedule.warmup_iterations / iterations_per_epoch)
        fields = {field.name: getattr(schedule, field.name) for field in dataclasses.fields(schedule)}
        return QuadraticWarmupSchedule(**fields)

    def on_train_start(self, model: nn.Module, run: RunInfo) -> None:
        """The L1 term starts off (a model trained before in this process may have it on)."""
        model.use_l1_loss(False)

    def on_augmentation_closed(self, model: nn.Module, run: RunInfo) -> None:
        """Mosaic stops: YOLOX adds the L1 loss on the raw box offsets for the remaining epochs."""
        model.use_l1_loss(True)
