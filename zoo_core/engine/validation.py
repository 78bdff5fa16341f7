"""Validation inside training, besides the task's metrics: the validation losses.

- ``validation_losses``: each epoch, the family's training loss on the validation set, so
  ``results.csv`` and ``results.png`` show ``val/<loss>`` beside ``train/<loss>`` (over-fitting
  shows as the two parting). The forward pass is the training one (``recipe.forward_train``:
  the outputs the loss expects) with BatchNorm statistics and dropout frozen, so measuring
  changes nothing.

After the last epoch the trainer validates ``best.pt`` once more with a ``ValidationReport``
(``zoo_core/reports``) into the run directory: confusion matrix, curves, drawn batches.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

import torch
from torch import nn

from zoo_core.data.damaged import DAMAGED_KEY

if TYPE_CHECKING:
    from zoo_core.engine.recipe import TrainingRecipe

__all__ = ["shown_losses", "frozen_training_forward", "validation_losses"]


def shown_losses(loss: torch.Tensor, items: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"loss": total, **items}`` as people read it: the total is the sum of the components shown.

    A family's constant gain on the loss it optimises (YOLO's nominal batch of 64) stays out of
    the numbers people read; without components the total is the loss itself.
    """
    total = torch.stack([value.detach().float() for value in items.values()]).sum() if items else loss.detach().float()
    return {"loss": total, **{name: value.detach().float() for name, value in items.items()}}


def _frozen_in_validation(module: nn.Module) -> bool:
    """Modules whose training mode would change state or add noise: normalisation with running statistics, dropout."""
    return (
        hasattr(module, "running_mean")
        or isinstance(module, nn.modules.dropout._DropoutNd)
        or type(module).__name__ in ("DropPath", "StochasticDepth", "DropBlock2d")
    )


@contextlib.contextmanager
def frozen_training_forward(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in training mode (the training outputs) with running statistics and dropout frozen; modes restored after."""
    modes = [(module, module.training) for module in model.modules()]
    model.train()
    for module in model.modules():
        if _frozen_in_validation(module):
            module.eval()
    try:
        yield model
    finally:
        for module, mode in modes:
            module.training = mode


def validation_losses(
    model: nn.Module, loader: Iterable[Any], recipe: "TrainingRecipe", device: torch.device, names: list[str]
) -> list[float]:
    """The summed validation losses named ``names`` (the training ones), then the number of batches, for this rank.

    The sums are returned in the order of ``names`` (0 for a name this rank never saw, so that
    every rank sends the same list to the cross-rank sum).
    """
    sums = dict.fromkeys(names, 0.0)
    batches = 0
    with torch.no_grad(), frozen_training_forward(model):
        for batch in loader:
            batch.pop(DAMAGED_KEY, None)
            batch = recipe.task.preprocess(batch, device)
            loss, items = recipe.forward_train(model, batch)
            for name, value in shown_losses(loss, items).items():
                if name in sums:
                    sums[name] += float(value)
            batches += 1
    return [*sums.values(), float(batches)]
