"""YOLOv7's published training recipe (WongKinYiu/yolov7 ``train.py``, ``data/hyp.scratch.{p5,tiny}.yaml``).

What registry.yaml's ``train_defaults`` cannot say, this class does:

- **parameter groups**: the official optimizer puts the implicit-knowledge tensors (IDetect's
  ImplicitA / ImplicitM, 1×C×1×1) with the BatchNorm weights, without weight decay; zoo's
  default grouping would decay them (they are 4-D), so they are moved to the no-decay group;
- **warm-up**: ``max(round(warmup_epochs × iterations per epoch), 1000)`` iterations; here the
  longer of ``warmup_epochs`` and ``warmup_iters`` (1000 in the defaults; set both to 0 for none);
- **YOLOv7-tiny** trains with ``hyp.scratch.tiny.yaml``: lrf 0.01, translate 0.1, scale 0.5
  (its loss gains are in the size's registry config).

The objectness gain's input-size rescaling is the model's own (``YOLOv7.loss`` reads the
batch's size). Mosaic never stops in YOLOv7 (``close_mosaic`` 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zoo_core.engine.optim import ParameterGroup
from zoo_core.engine.recipe import TrainingRecipe
from zoo_core.engine.schedule import LRSchedule

if TYPE_CHECKING:
    from zoo_core.engine.config import TrainConfig

__all__ = ["YOLOv7Recipe", "IMPLICIT_PARAMETERS"]

IMPLICIT_PARAMETERS = ("implicit_add", "implicit_mul")  # zoo_yolo7.model.ImplicitDetectLevel
_SIZE_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {"lrf": 0.01, "translate": 0.1, "scale": 0.5, "mixup": 0.05},  # hyp.scratch.tiny.yaml
}


class YOLOv7Recipe(TrainingRecipe):
    """The published YOLOv7 recipe; see the module docstring."""

    @property
    def config_defaults(self) -> dict[str, Any]:
        """``train_defaults`` (hyp.scratch.p5.yaml) with tiny's own hyper-parameters."""
        return {**super().config_defaults, **_SIZE_DEFAULTS.get(self.size, {})}

    def parameter_groups(self, model: nn.Module, config: "TrainConfig") -> list[ParameterGroup]:
        """zoo's groups, with the implicit tensors moved from decay to no-decay (same learning rate)."""
        groups = super().parameter_groups(model, config)
        implicit = {id(parameter) for name, parameter in model.named_parameters() if name.rsplit(".", 1)[-1] in IMPLICIT_PARAMETERS}
        if not implicit:
            return groups
        for group in groups:
            if group.kind != "decay":
                continue
            moved = [parameter for parameter in group.params if id(parameter) in implicit]
            if not moved:
                continue
            group.params = [parameter for parameter in group.params if id(parameter) not in implicit]
            target = next(other for other in groups if other.kind == "no_decay" and other.lr_scale == group.lr_scale)
            target.params.extend(moved)
        return groups

    def lr_schedule(self, config: "TrainConfig", iterations_per_epoch: int, optimizer: torch.optim.Optimizer) -> LRSchedule:
        """The default schedule with YOLOv7's warm-up length: the longer of the epoch and iteration counts."""
        by_epochs = round(config.warmup_epochs * iterations_per_epoch)
        warmup = max(by_epochs, config.warmup_iters or 0)
        return super().lr_schedule(config.model_copy(update={"warmup_iters": warmup}), iterations_per_epoch, optimizer)
