"""Learning-rate schedules, evaluated per training iteration (micro-batch) so they resume exactly.

A schedule is a pure function of the global iteration: the trainer sets every parameter group's
learning rate (and, during warm-up, its momentum) from it before each micro-batch, and a resumed
run needs only the iteration count to continue where the interrupted run was.

Shapes (``lr_schedule``), each a multiplier of a group's initial learning rate:

- ``linear`` / ``cosine``: Ultralytics' per-epoch decay from 1 to ``lrf`` (the value changes at
  epoch boundaries only), the default of the YOLO families;
- ``flat_cosine``: D-FINE/DEIM's: 1 until ``flat_epochs``, then a cosine to ``lrf`` that ends when
  the no-augmentation phase starts (``close_mosaic`` epochs before the end), then constant;
- ``multistep``: multiplied by ``lr_gamma`` at each epoch in ``lr_milestones`` (RT-DETR);
- ``poly``: ``lrf + (1 - lrf) * (1 - t / T) ** lr_power`` per iteration (SegFormer, PP-LiteSeg);
- ``constant``.

Warm-up comes first, linear over ``warmup_iterations``: each group's learning rate rises from 0
(bias groups from ``warmup_bias_lr``) to the scheduled value, and the momentum (Adam's beta1) from
``warmup_momentum`` to ``momentum``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

import torch

__all__ = ["ScheduleName", "SCHEDULES", "LRSchedule"]

ScheduleName = Literal["linear", "cosine", "flat_cosine", "multistep", "poly", "constant"]
SCHEDULES: tuple[str, ...] = ("linear", "cosine", "flat_cosine", "multistep", "poly", "constant")


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate (and warm-up momentum) of every iteration of a run.

    ``iterations_per_epoch`` counts micro-batches; ``warmup_iterations`` may end mid-epoch.
    ``bias_groups`` are the indices of the optimizer's groups that warm up from ``warmup_bias_lr``.
    """

    name: ScheduleName
    epochs: int
    iterations_per_epoch: int
    lrf: float = 0.01
    warmup_iterations: int = 0
    warmup_bias_lr: float = 0.0
    warmup_momentum: float | None = None
    momentum: float | None = None
    flat_epochs: float = 0.0
    no_augmentation_epochs: int = 0
    milestones: Sequence[float] = field(default_factory=tuple)
    gamma: float = 0.1
    power: float = 0.9
    bias_groups: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ValueError(f"unknown lr_schedule {self.name!r}; choose one of {', '.join(SCHEDULES)}")
        if self.iterations_per_epoch < 1 or self.epochs < 1:
            raise ValueError("a schedule needs at least one epoch of at least one iteration")

    @property
    def total_iterations(self) -> int:
        """Micro-batches in the whole run."""
        return self.epochs * self.iterations_per_epoch

    def factor(self, iteration: int) -> float:
        """The multiplier of the initial learning rate at ``iteration`` (warm-up not included)."""
        epoch = iteration // self.iterations_per_epoch
        if self.name == "linear":
            return max(1 - epoch / self.epochs, 0.0) * (1.0 - self.lrf) + self.lrf
        if self.name == "cosine":
            return ((1 - math.cos(epoch * math.pi / self.epochs)) / 2) * (self.lrf - 1) + 1
        if self.name == "multistep":
            return self.gamma ** sum(1 for milestone in self.milestones if epoch >= milestone)
        if self.name == "poly":
            progress = min(iteration / self.total_iterations, 1.0)
            return self.lrf + (1 - self.lrf) * (1 - progress) ** self.power
        if self.name == "flat_cosine":
            flat_end = self.flat_epochs * self.iterations_per_epoch
            decay_end = max(self.epochs - self.no_augmentation_epochs, 0) * self.iterations_per_epoch
            if iteration <= flat_end:
                return 1.0
            if iteration >= decay_end or decay_end <= flat_end:
                return self.lrf
            progress = (iteration - flat_end) / (decay_end - flat_end)
            return self.lrf + (1 - self.lrf) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    def apply(self, optimizer: torch.optim.Optimizer, iteration: int) -> None:
        """Set each group's ``lr`` (from its ``initial_lr``) and, in warm-up, its momentum for ``iteration``."""
        factor = self.factor(iteration)
        warming = iteration < self.warmup_iterations
        for index, group in enumerate(optimizer.param_groups):
            scheduled = group["initial_lr"] * factor
            if warming:
                start = self.warmup_bias_lr * group.get("lr_scale", 1.0) if index in self.bias_groups else 0.0
                scheduled = start + (scheduled - start) * iteration / self.warmup_iterations
            group["lr"] = scheduled
            if self.momentum is not None and self.warmup_momentum is not None:
                momentum = self.momentum
                if warming:
                    momentum = self.warmup_momentum + (self.momentum - self.warmup_momentum) * iteration / self.warmup_iterations
                if "momentum" in group:
                    group["momentum"] = momentum
                elif "betas" in group:
                    group["betas"] = (momentum, group["betas"][1])
