"""Parameter groups and optimizers.

Weights of convolutions and linear layers decay; normalisation weights, other 1-D scales and
biases do not (decaying them only shrinks scales the next layer undoes). A family's recipe may
also give parts of the model their own learning-rate multiplier (``lr_multipliers``: a DETR's
backbone learns at a tenth of the rate of its head), which splits each kind further.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

import torch
from torch import nn

__all__ = ["ParameterGroup", "OptimizerName", "split_parameter_groups", "fused_update", "build_optimizer", "auto_optimizer"]

OptimizerName = Literal["SGD", "Adam", "AdamW"]
_NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm1d, nn.InstanceNorm2d)


@dataclass
class ParameterGroup:
    """Parameters trained alike: one optimizer param group.

    ``kind`` is ``"decay"`` (conv/linear weights), ``"no_decay"`` (norm weights, 1-D scales) or
    ``"bias"``; biases warm up from ``warmup_bias_lr``. ``lr_scale`` multiplies the base rate.
    """

    name: str
    kind: Literal["decay", "no_decay", "bias"]
    params: list[nn.Parameter] = field(default_factory=list)
    lr_scale: float = 1.0


def _kind_of(module: nn.Module, name: str, parameter: nn.Parameter) -> Literal["decay", "no_decay", "bias"]:
    if name == "bias":
        return "bias"
    if isinstance(module, _NORM_TYPES) or parameter.ndim <= 1 or "norm" in type(module).__name__.lower():
        return "no_decay"
    return "decay"


def split_parameter_groups(model: nn.Module, lr_multipliers: Mapping[str, float] | None = None) -> list[ParameterGroup]:
    """Trainable parameters by kind and learning-rate multiplier, in a fixed order.

    ``lr_multipliers`` maps a parameter-name prefix (``"backbone."``) to a multiplier; the first
    matching prefix wins, unmatched parameters get 1. Groups come out as decay, no_decay, bias for
    multiplier 1, then the same three for each multiplier in the mapping's order; empty groups
    are kept (the order stays the same whatever the model), so checkpoints restore by position.
    """
    multipliers = dict(lr_multipliers or {})
    scales = [1.0, *[scale for scale in multipliers.values() if scale != 1.0]]
    scales = list(dict.fromkeys(scales))
    groups = {
        (scale, kind): ParameterGroup(name=f"{kind}" if scale == 1.0 else f"{kind}@x{scale:g}", kind=kind, lr_scale=scale)
        for scale in scales
        for kind in ("decay", "no_decay", "bias")
    }
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad or id(parameter) in seen:
                continue
            seen.add(id(parameter))
            full_name = f"{module_name}.{name}" if module_name else name
            scale = next((value for prefix, value in multipliers.items() if full_name.startswith(prefix)), 1.0)
            groups[(scale, _kind_of(module, name, parameter))].params.append(parameter)
    return list(groups.values())


def auto_optimizer(iterations: int) -> tuple[OptimizerName, float]:
    """The ``optimizer="auto"`` choice: AdamW (lr 1e-3) for short runs, SGD (lr 0.01) for long ones."""
    return ("AdamW", 0.001) if iterations < 10_000 else ("SGD", 0.01)


def fused_update(groups: list[ParameterGroup]) -> bool:
    """Whether the optimizer step can run as torch's fused kernels: every parameter on a CPU or CUDA device.

    A fused kernel reads and writes each tensor once per step, where ``foreach`` makes one pass
    per arithmetic operation: the step is memory-bound, so one pass is several times faster
    (docs/performance.md). On CUDA the fused step also skips an AMP step with infinite gradients
    without waiting for the device.
    """
    devices = {parameter.device.type for group in groups for parameter in group.params}
    return bool(devices) and devices <= {"cpu", "cuda"}


def build_optimizer(
    groups: list[ParameterGroup],
    name: OptimizerName,
    lr: float,
    *,
    momentum: float,
    weight_decay: float,
    beta2: float = 0.999,
) -> torch.optim.Optimizer:
    """SGD (Nesterov when there is momentum), Adam or AdamW over ``groups``.

    Only ``decay`` groups get ``weight_decay``. Each param group records ``initial_lr`` (its
    scheduled peak) and ``lr_scale`` for the schedule. The update runs as torch's fused kernels
    where the parameters live on a CPU or CUDA device (``fused_update``), else as ``foreach``
    kernels over all tensors of a group at once.
    """
    param_groups = [
        {
            "params": group.params,
            "weight_decay": weight_decay if group.kind == "decay" else 0.0,
            "lr": lr * group.lr_scale,
            "initial_lr": lr * group.lr_scale,
            "lr_scale": group.lr_scale,
            "name": group.name,
        }
        for group in groups
    ]
    kernels = {"fused": True} if fused_update(groups) else {"foreach": True}
    if name == "SGD":
        return torch.optim.SGD(param_groups, lr=lr, momentum=momentum, nesterov=momentum > 0, **kernels)
    if name == "Adam":
        return torch.optim.Adam(param_groups, lr=lr, betas=(momentum, beta2), **kernels)
    if name == "AdamW":
        return torch.optim.AdamW(param_groups, lr=lr, betas=(momentum, beta2), **kernels)
    raise ValueError(f"optimizer {name!r} is not one of SGD, Adam, AdamW")
