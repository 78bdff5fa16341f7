"""PP-LiteSeg's training recipe (imported when training starts).

PaddleSeg's recipe (``pp_liteseg_stdc1_cityscapes_1024x512_scale0.5_160k.yml``) is data in the
registry's ``train_defaults`` (SGD lr 0.005, momentum 0.9, weight decay 5e-4, 1000 warm-up
iterations, poly 0.9), except one thing: its SGD is Paddle's ``Momentum`` optimizer, classic
(heavy-ball) momentum, where zoo's SGD defaults to Nesterov.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from zoo_core.engine.recipe import TrainingRecipe

if TYPE_CHECKING:
    from zoo_core.engine.config import TrainConfig

__all__ = ["PPLiteSegRecipe"]


class PPLiteSegRecipe(TrainingRecipe):
    """The default recipe, with classic (not Nesterov) momentum when the optimizer is SGD."""

    def build_optimizer(
        self, model: nn.Module, config: "TrainConfig", *, iterations: int, images_per_step: int
    ) -> torch.optim.Optimizer:
        optimizer = super().build_optimizer(model, config, iterations=iterations, images_per_step=images_per_step)
        if isinstance(optimizer, torch.optim.SGD):
            for group in optimizer.param_groups:
                group["nesterov"] = False
        return optimizer
