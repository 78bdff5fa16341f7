"""``freeze=``: which parameters a training run keeps fixed.

``freeze=N`` freezes the first ``N`` *blocks* in forward order, as Ultralytics means it
(``freeze=10`` is a YOLOv8's backbone). Zoo's models are not one flat ``nn.Sequential`` of
layers, so a block is defined here, the same way for every family:

- start from the model's top-level modules (``backbone``, ``neck``, ``head``, or a timm model's
  ``conv1`` ... ``fc``); open each top-level module once, into its children;
- then keep opening every plain ``nn.Sequential``, ``nn.ModuleList`` and ``nn.ModuleDict`` (they
  are lists of blocks, not blocks; a subclass such as ``ConvNormAct(nn.Sequential)`` is a layer);
- what is left, and holds parameters, is a block: ``backbone.stem.0``, ``backbone.blocks.1``,
  ``layer2.0``, ``neck.merge_p4``.

Blocks are counted in the order the training forward pass first runs them, found with forward
hooks on one synthetic batch (``Task.example_batch``) with gradients, random state and buffers
(BatchNorm statistics) left as they were; blocks the pass never runs come last, in registration
order. Where that pass cannot run, registration order is used, and the printed line says so.

``freeze=["backbone", "neck.top_down"]`` freezes by name prefix (whole dotted components). The
run prints the frozen blocks' names either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from zoo_core.errors import TrainConfigError

__all__ = ["FrozenParameters", "model_blocks", "forward_order", "freeze_parameters"]

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


@dataclass
class FrozenParameters:
    """What ``freeze_parameters`` did: the frozen parameter tensors' count, the blocks (or prefixes) and the order used."""

    tensors: int
    blocks: list[str] = field(default_factory=list)
    order: str = "by name"

    def describe(self, freeze: int | list[str]) -> str:
        """The line the run prints: ``freeze=3: 3 blocks stay fixed (forward order): a, b, c; 12 parameter tensors``."""
        what = f"{len(self.blocks)} blocks stay fixed ({self.order})" if isinstance(freeze, int) else "these modules stay fixed"
        names = ", ".join(self.blocks) if self.blocks else "none"
        return f"freeze={freeze!r}: {what}: {names}; {self.tensors} parameter tensors"


def _has_parameters(module: nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _open(name: str, module: nn.Module, top_level: bool) -> list[tuple[str, nn.Module]]:
    children = list(module.named_children())
    # Exactly these container types: a subclass (ConvNormAct(nn.Sequential), say) is a named layer, so a block.
    if children and (top_level or type(module) in _CONTAINERS):
        found: list[tuple[str, nn.Module]] = []
        for child_name, child in children:
            found.extend(_open(f"{name}.{child_name}" if name else child_name, child, top_level=False))
        return found
    return [(name, module)] if _has_parameters(module) else []


def model_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's blocks (module docstring) with their dotted names, in registration order."""
    blocks: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        blocks.extend(_open(name, child, top_level=True))
    return blocks


def forward_order(model: nn.Module, blocks: list[tuple[str, nn.Module]], run_forward: Callable[[], object]) -> list[str]:
    """The names of ``blocks`` in the order ``run_forward()`` first calls them (uncalled ones last, as registered).

    Nothing the pass touches survives it: no gradient is kept, the random state (CPU and CUDA) and
    every buffer are put back, and so is every module's training mode.
    """
    seen: list[str] = []
    handles = [module.register_forward_pre_hook(lambda _module, _inputs, name=name: seen.append(name) if name not in seen else None)
               for name, module in blocks]
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    modes = [(module, module.training) for module in model.modules()]  # each module's own: some keep BatchNorm in eval
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            run_forward()
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(buffers[name])
        for module, training in modes:
            module.training = training
    return seen + [name for name, _ in blocks if name not in seen]


def freeze_parameters(model: nn.Module, freeze: int | list[str],
                      run_forward: Callable[[], object] | None = None) -> FrozenParameters:
    """Stop gradients for the first ``freeze`` blocks in forward order, or for parameters under the prefixes in ``freeze``.

    ``run_forward`` runs one training forward pass (for the order; without it, registration order).
    An ``N`` beyond the number of blocks, or a prefix that matches nothing, is a ``TrainConfigError``
    naming what the model has.
    """
    children = [name for name, _ in model.named_children()]
    if isinstance(freeze, int):
        blocks = model_blocks(model)
        if not 0 <= freeze <= len(blocks):
            shown = ", ".join(name for name, _ in blocks[:8]) + (", ..." if len(blocks) > 8 else "")
            raise TrainConfigError(f"freeze={freeze}: the model has {len(blocks)} blocks ({shown}); give 0 to "
                                   f"{len(blocks)}, or a list of name prefixes such as freeze=['{children[0]}']")
        order, names = "registration order", [name for name, _ in blocks]
        if freeze and run_forward is not None:
            try:
                names, order = forward_order(model, blocks, run_forward), "forward order"
            except Exception as error:  # noqa: BLE001 - the order is a convenience; registration order still freezes
                order = f"registration order: the order-finding forward pass failed with {type(error).__name__}"
        prefixes = [f"{name}." for name in names[:freeze]]
    else:
        prefixes = [prefix if prefix.endswith(".") else f"{prefix}." for prefix in freeze]
        order = "by name"
    frozen = 0
    matched: set[str] = set()
    for name, parameter in model.named_parameters():
        hit = next((prefix for prefix in prefixes if f"{name}.".startswith(prefix)), None)
        if hit is not None:
            parameter.requires_grad_(False)
            matched.add(hit)
            frozen += 1
    missing = [prefix.rstrip(".") for prefix in prefixes if prefix not in matched]
    if missing:
        raise TrainConfigError(f"freeze names {missing} match no parameter; the top-level modules are {', '.join(children)}")
    return FrozenParameters(frozen, [prefix.rstrip(".") for prefix in prefixes], order)
