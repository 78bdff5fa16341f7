"""PP-PicoDet's published training recipe (PaddleDetection ``configs/picodet/legacy_model``).

What registry.yaml's ``train_defaults`` cannot say, this class does:

- **learning rate per size and batch**: ``base_lr`` is 0.4 for S and M and 0.3 for L
  (``picodet_l_640_coco.yml``), each for its own global batch: 128 (S), 80 (M) or 32 (L) images
  per GPU on 4 GPUs (the legacy README: "4 or 8 GPUs"; LibreYOLO reads 4), i.e. 512 / 320 / 128.
  ``lr0`` is read as the rate of that published batch and scaled linearly to the images of an
  optimizer step (``nbs`` is null: no gradient accumulation, weight decay not rescaled);
- **cycle EMA** (``use_ema: true, cycle_epoch: 40``): PaddleDetection restarts its weight average
  every 40 epochs, so the average never lags far behind a model that is still moving fast. The
  recipe restarts zoo's EMA from the current weights at the start of every 40th epoch.

- **PicoDet-L's short run**: L trains 250 epochs of a cosine laid out over 300
  (``epoch: 250`` with ``CosineDecay max_epochs: 300``): its cosine spans 6/5 of the run.

The rest is data (registry ``train_defaults``): SGD momentum 0.9, L2 4e-5, cosine to 0 over 300
epochs, a 300-iteration linear warm-up.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zoo_core.engine.ema import ModelEMA
from zoo_core.engine.recipe import RunInfo, TrainingRecipe
from zoo_core.engine.schedule import LRSchedule

if TYPE_CHECKING:
    from zoo_core.engine.config import TrainConfig

__all__ = ["PicoDetRecipe", "PUBLISHED_BATCH", "EMA_CYCLE_EPOCHS"]

PUBLISHED_BATCH = {"s": 512, "m": 320, "l": 128}  # images per optimizer step of the published configs
EMA_CYCLE_EPOCHS = 40
_SIZE_DEFAULTS: dict[str, dict[str, Any]] = {
    "l": {"lr0": 0.3, "epochs": 250},  # picodet_l_640_coco.yml: base_lr 0.3, epoch 250 (cosine over 300)
}
_COSINE_SPAN = {"l": 300 / 250}  # the cosine's length over the run's


class PicoDetRecipe(TrainingRecipe):
    """The published PP-PicoDet recipe; see the module docstring."""

    def __init__(self, declaration: Any, size: str) -> None:
        super().__init__(declaration, size)
        self._ema: ModelEMA | None = None

    @property
    def config_defaults(self) -> dict[str, Any]:
        """``train_defaults`` with the size's own learning rate and length (L)."""
        return {**super().config_defaults, **_SIZE_DEFAULTS.get(self.size, {})}

    def build_optimizer(
        self, model: nn.Module, config: "TrainConfig", *, iterations: int, images_per_step: int
    ) -> torch.optim.Optimizer:
        """SGD at ``lr0 × images per step / the published batch`` (linear scaling)."""
        reference = PUBLISHED_BATCH.get(self.size, PUBLISHED_BATCH["s"])
        scaled = config.model_copy(update={"lr0": config.lr0 * images_per_step / reference})
        return super().build_optimizer(model, scaled, iterations=iterations, images_per_step=images_per_step)

    def lr_schedule(self, config: "TrainConfig", iterations_per_epoch: int, optimizer: torch.optim.Optimizer) -> LRSchedule:
        """The default schedule; for L the cosine spans 300/250 of the run (it stops at 250 of 300 epochs)."""
        schedule = super().lr_schedule(config, iterations_per_epoch, optimizer)
        span = _COSINE_SPAN.get(self.size)
        if span is not None and schedule.name == "cosine":
            schedule = dataclasses.replace(schedule, epochs=round(schedule.epochs * span))
        return schedule

    def build_ema(self, model: nn.Module, config: "TrainConfig") -> ModelEMA | None:
        """zoo's EMA; kept so that ``on_epoch_start`` can restart it every 40 epochs."""
        self._ema = super().build_ema(model, config)
        return self._ema

    @torch.no_grad()
    def on_epoch_start(self, model: nn.Module, run: RunInfo) -> None:
        """Every ``EMA_CYCLE_EPOCHS`` epochs the average starts again from the current weights."""
        if self._ema is not None and run.epoch > 0 and run.epoch % EMA_CYCLE_EPOCHS == 0:
            self._ema.module.load_state_dict(model.state_dict())
            self._ema.updates = 0
