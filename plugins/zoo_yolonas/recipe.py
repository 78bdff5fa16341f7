"""YOLO-NAS's published training recipe (Deci-AI/super-gradients).

Sources: ``src/super_gradients/recipes/coco2017_yolo_nas_s.yaml`` (and ``_m``, ``_l``) with
``training_hyperparams/coco2017_yolo_nas_train_params.yaml``. That recipe's header says it is "for
demonstration purposes only. Pretrained models were trained using a different recipe" (not public),
so it is the only published one. Its values live in registry.yaml ``train_defaults``:
AdamW (``optimizer_params: weight_decay 0.00001``), ``initial_lr: 1e-4``, ``lr_mode:
CosineLRScheduler`` with ``cosine_final_lr_ratio: 0.1``, ``max_epochs: 300``,
``zero_weight_decay_on_bias_and_bn: True`` (zoo's parameter groups already decay only conv and
linear weights), ``batch_accumulate: 1`` (``nbs`` null), ``ema: True``, ``sync_bn: True``.

What ``train_defaults`` cannot say, this class does:

- **LinearBatchLRWarmup** (``warmup_mode``, ``lr_warmup_steps: 2000``, ``warmup_initial_lr: 1e-5``):
  every parameter group, weights as well as biases, rises linearly *per iteration* from
  ``warmup_initial_lr`` to the scheduled rate. zoo's schedule warms weights up from 0 and only the
  bias groups from ``warmup_bias_lr``; the recipe makes every group a "bias group", so all start at
  ``warmup_bias_lr`` (the registry sets it to 1e-5, super-gradients' ``warmup_initial_lr``).
- **the EMA's "threshold" decay** (``ema_params: decay 0.9997, decay_type: threshold``):
  super-gradients' ``ThresholdDecay`` uses ``min(decay, (1 + n) / (10 + n))`` after ``n`` updates,
  not zoo's ``decay * (1 - exp(-n / tau))`` (``ThresholdEMA``).
- **the assigner switch**: ``PPYoloELoss`` can assign with ATSS (``use_static_assigner``) instead of
  the task-aligned assigner. YOLO-NAS's recipe sets ``criterion_params: use_static_assigner: False``,
  so ``static_assigner_epochs`` is 0 and the model's own setting (build option ``static_assigner``)
  stands. PP-YOLOE (PaddleDetection ``ppyoloe_head``: ``static_assigner_epoch: 100`` in the
  original configs, 30 in PP-YOLOE+) trains its first epochs with ATSS: a subclass setting
  ``static_assigner_epochs`` gets that switch from ``on_epoch_start``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from zoo_core.engine.ema import ModelEMA
from zoo_core.engine.recipe import RunInfo, TrainingRecipe
from zoo_core.engine.schedule import LRSchedule

if TYPE_CHECKING:
    from zoo_core.engine.config import TrainConfig

__all__ = ["YoloNasRecipe", "ThresholdEMA"]


class ThresholdEMA(ModelEMA):
    """zoo's weight average with super-gradients' "threshold" ramp: ``d = min(decay, (1 + n) / (10 + n))``."""

    def decay_after(self, updates: int) -> float:
        """The averaging weight ``d`` of the ``updates``-th update."""
        return min(self.decay, (1 + updates) / (10 + updates))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Fold the current weights of ``model`` (unwrapped) into the average."""
        self.updates += 1
        kept = self.decay_after(self.updates)
        averaged, current, copied_to, copied_from = self._pairs(model)
        if averaged:
            torch._foreach_lerp_(averaged, current, 1.0 - kept)
        for target, source in zip(copied_to, copied_from):
            target.copy_(source)


class YoloNasRecipe(TrainingRecipe):
    """The published YOLO-NAS recipe; see the module docstring."""

    #: Epochs at the start of a run that assign with ATSS (0: YOLO-NAS's ``use_static_assigner: False``).
    static_assigner_epochs: ClassVar[int] = 0

    def lr_schedule(self, config: "TrainConfig", iterations_per_epoch: int, optimizer: torch.optim.Optimizer) -> LRSchedule:
        """The default schedule, every group warming up linearly from ``warmup_bias_lr`` (LinearBatchLRWarmup)."""
        schedule = super().lr_schedule(config, iterations_per_epoch, optimizer)
        return dataclasses.replace(schedule, bias_groups=frozenset(range(len(optimizer.param_groups))))

    def build_ema(self, model: nn.Module, config: "TrainConfig") -> ModelEMA | None:
        """The "threshold" EMA (``ema_decay``; ``ema_tau`` is not used), or None without ``ema``."""
        return ThresholdEMA(model, config.ema_decay) if config.ema else None

    def on_epoch_start(self, model: nn.Module, run: RunInfo) -> None:
        """ATSS for the first ``static_assigner_epochs`` epochs, then the task-aligned assigner."""
        if self.static_assigner_epochs > 0 and hasattr(model, "use_static_assigner"):
            model.use_static_assigner = run.epoch < self.static_assigner_epochs

