"""RTMDet's published training recipe (mmdetection ``configs/rtmdet/rtmdet_{tiny,s,m,l,x}_8xb32-300e_coco.py``).

What registry.yaml's ``train_defaults`` cannot say, this class does:

- **schedule**: mmdetection keeps the rate flat until epoch 150, then ``CosineAnnealingLR``
  (``begin=150, end=300``, ``eta_min = 0.05 × lr``) runs to the *last* epoch, although mosaic
  stops 20 epochs earlier (``PipelineSwitchHook``). zoo's ``flat_cosine`` would end the cosine
  where the no-augmentation epochs start; this recipe lets it run to the end;
- **sizes**: RTMDet-tiny and -s resize the mosaic by (0.5, 2.0) (zoo's ``scale`` 0.5), m/l/x by
  (0.1, 2.0) (``scale`` 0.9, the default).

The rest is data (registry ``train_defaults``) or already zoo's behaviour: AdamW with weight
decay on conv weights only (``norm_decay_mult=0, bias_decay_mult=0`` are zoo's parameter groups),
no gradient accumulation or rescaled decay (``nbs`` null), a linear warm-up over 1000 iterations,
the EMA of ``ExpMomentumEMA(momentum=0.0002, gamma=2000)`` (zoo's ``ModelEMA(0.9998, tau=2000)``
computes the same decay ramp), no gradient clipping.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from zoo_core.engine.recipe import TrainingRecipe
from zoo_core.engine.schedule import LRSchedule

if TYPE_CHECKING:
    from zoo_core.engine.config import TrainConfig

__all__ = ["RTMDetRecipe"]

_SIZE_DEFAULTS: dict[str, dict[str, Any]] = {
    "t": {"scale": 0.5},  # rtmdet_tiny: RandomResize ratio_range (0.5, 2.0)
    "s": {"scale": 0.5},  # rtmdet_s: RandomResize ratio_range (0.5, 2.0)
}


class RTMDetRecipe(TrainingRecipe):
    """The published RTMDet recipe; see the module docstring."""

    @property
    def config_defaults(self) -> dict[str, Any]:
        """``train_defaults`` with the size's mosaic resize range."""
        return {**super().config_defaults, **_SIZE_DEFAULTS.get(self.size, {})}

    def lr_schedule(self, config: "TrainConfig", iterations_per_epoch: int, optimizer: torch.optim.Optimizer) -> LRSchedule:
        """``flat_cosine`` whose cosine ends at the last epoch, not where mosaic stops."""
        schedule = super().lr_schedule(config, iterations_per_epoch, optimizer)
        if schedule.name == "flat_cosine":
            schedule = dataclasses.replace(schedule, no_augmentation_epochs=0)
        return schedule
