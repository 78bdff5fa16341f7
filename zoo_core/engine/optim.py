"""Optimizer, parameter groups and the learning-rate schedule.

Norm weights and biases get no weight decay (decaying them only shrinks scales the next layer
undoes). The schedule is warm-up (per iteration) then cosine or linear decay to ``lr0 * lrf``
(per epoch), Ultralytics' recipe, so published YOLO hyperparameters carry over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

__all__ = ["ParameterGroups", "split_parameter_groups", "build_optimizer", "lr_factor", "WarmupPlan", "auto_optimizer"]

_NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm1d, nn.InstanceNorm2d)


@dataclass
class ParameterGroups:
    """Trainable parameters split by how they are regularised."""

    decay: list[nn.Parameter]
    no_decay_weights: list[nn.Parameter]  # normalisation weights and other 1-D scales
    biases: list[nn.Parameter]


def split_parameter_groups(model: nn.Module) -> ParameterGroups:
    """Weights of convolutions/linears decay; norm weights, 1-D scales and biases do not."""
    groups = ParameterGroups([], [], [])
    seen: set[int] = set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            if name == "bias":
                groups.biases.append(parameter)
            elif isinstance(module, _NORM_TYPES) or parameter.ndim <= 1 or "norm" in type(module).__name__.lower():
                groups.no_decay_weights.append(parameter)
            else:
                groups.decay.append(parameter)
    return groups


def auto_optimizer(iterations: int) -> tuple[str, float]:
    """The ``optimizer="auto"`` choice: AdamW (lr 1e-3) for short runs, SGD (lr 0.01) for long ones."""
    return ("AdamW", 0.001) if iterations < 10_000 else ("SGD", 0.01)


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    """SGD (Nesterov) or AdamW over three groups; only group 0 (weights) decays.

    Group order is fixed (decay weights, norm weights, biases): warm-up treats group 2 as biases.
    """
    groups = split_parameter_groups(model)
    param_groups = [
        {"params": groups.decay, "weight_decay": weight_decay},
        {"params": groups.no_decay_weights, "weight_decay": 0.0},
        {"params": groups.biases, "weight_decay": 0.0},
    ]
    if name == "SGD":
        return torch.optim.SGD(param_groups, lr=lr, momentum=momentum, nesterov=momentum > 0)
    if name == "AdamW":
        return torch.optim.AdamW(param_groups, lr=lr, betas=(momentum, 0.999))
    raise ValueError(f"optimizer {name!r} is not one of SGD, AdamW")


def lr_factor(epochs: int, lrf: float, cosine: bool) -> Callable[[int], float]:
    """Per-epoch multiplier of ``lr0``: 1 at epoch 0, ``lrf`` at the last epoch."""
    if cosine:
        return lambda epoch: ((1 - math.cos(epoch * math.pi / epochs)) / 2) * (lrf - 1) + 1
    return lambda epoch: max(1 - epoch / epochs, 0) * (1.0 - lrf) + lrf


@dataclass
class WarmupPlan:
    """Per-iteration warm-up of the first ``iterations`` steps: lr from 0 (biases from ``bias_lr``)
    and momentum from ``start_momentum`` towards their scheduled values."""

    iterations: int
    bias_lr: float
    start_momentum: float
    momentum: float

    def apply(self, optimizer: torch.optim.Optimizer, iteration: int, scheduled_lrs: list[float]) -> None:
        """Set each group's lr (and momentum) for ``iteration`` (a no-op once warm-up is over)."""
        if iteration >= self.iterations:
            return
        points = [0, self.iterations]
        for index, group in enumerate(optimizer.param_groups):
            start = self.bias_lr if index == 2 else 0.0
            group["lr"] = float(np.interp(iteration, points, [start, scheduled_lrs[index]]))
            new_momentum = float(np.interp(iteration, points, [self.start_momentum, self.momentum]))
            if "momentum" in group:
                group["momentum"] = new_momentum
            elif "betas" in group:
                group["betas"] = (new_momentum, group["betas"][1])
