"""Exponential moving average of the weights, the weights validated and deployed."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

__all__ = ["ModelEMA"]


class ModelEMA:
    """``ema = d * ema + (1 - d) * model`` after every optimizer step, with a warm-up of ``d``.

    ``d = decay * (1 - exp(-updates / tau))`` keeps early averages close to the fresh weights.
    Buffers (BatchNorm statistics) are averaged too; integer buffers are copied. Every rank keeps
    the same EMA (its parameters are identical after each DDP step), so validation can be sharded.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0, updates: int = 0) -> None:
        self.module = copy.deepcopy(model).eval()
        for parameter in self.module.parameters():
            parameter.requires_grad_(False)
        self.decay = decay
        self.tau = tau
        self.updates = updates

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Fold the current weights of ``model`` (unwrapped) into the average."""
        self.updates += 1
        weight = self.decay * (1 - math.exp(-self.updates / self.tau))
        averaged, current, copied_to, copied_from = self._pairs(model)
        if averaged:
            # One fused kernel over all tensors: ema += (1 - d) * (model - ema).
            torch._foreach_lerp_(averaged, current, 1 - weight)
        for target, source in zip(copied_to, copied_from):
            target.copy_(source)

    def _pairs(self, model: nn.Module) -> tuple[list[torch.Tensor], ...]:
        # Parameters and buffers keep their identity during training (updates are in place),
        # so the tensor lists are built once per model.
        if getattr(self, "_paired_with", None) is not model:
            averaged, current, copied_to, copied_from = [], [], [], []
            model_state = model.state_dict(keep_vars=True)
            for key, value in self.module.state_dict(keep_vars=True).items():
                source = model_state[key].detach()
                if value.dtype.is_floating_point:
                    averaged.append(value.detach())
                    current.append(source)
                else:
                    copied_to.append(value.detach())
                    copied_from.append(source)
            self._cached_pairs = (averaged, current, copied_to, copied_from)
            self._paired_with = model
        return self._cached_pairs

    def state_dict(self) -> dict[str, Any]:
        """Weights and update count, for checkpoints."""
        return {"weights": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from ``state_dict()``."""
        self.module.load_state_dict(state["weights"])
        self.updates = int(state["updates"])
