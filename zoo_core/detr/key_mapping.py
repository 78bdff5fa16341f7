"""Rename state-dict keys between zoo's DETR modules and another layout (LibreYOLO, official).

The template matching and both directions are ``zoo_core.key_renaming.KeyRenamer``'s; this
module says how the DETR families write their rules, module by module, and applies them:

- ``KeyRule(foreign, zoo)``: the module at ``foreign`` there is the module at ``zoo`` here, keys
  below it unchanged (``self_attn.in_proj_weight`` …); ``{name}`` placeholders match an index and
  carry it over. A path may also be a whole key (``decoder.up``).
- ``KeyRule(foreign, zoo, "conv_norm")``: a conv-BatchNorm pair named ``conv``/``norm`` there and
  ``0``/``1`` here (zoo's ``ConvNormAct``).

Paths are anchored at the start of the key. The FIRST rule that covers a key renames it (rule
lists put the specific before the general, and an identity rule guards a subtree from the rules
after it); ``KeyRenamer`` alone composes its pairs instead (every pair sees the previous pairs'
output, and the way back runs them in reverse), which would let a general rule listed after a
specific one (DEIMv2's ``backbone.dinov3`` → ``backbone.vit`` after its ViT rules) take the
specific rule's keys on the way back. So each rule here is its own ``KeyRenamer`` (the template
matching and both directions are KeyRenamer's), and ``rename_keys`` applies one rule per key.

``rename_keys`` also drops foreign buffers zoo recomputes (``drop``: regular expressions,
applied on the way in). Keys no rule covers keep their names: the strict load after conversion
names any that do not fit, and a converter tried on a layout it does not know (the loader tries
several) must not fail on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import torch

from zoo_core.key_renaming import KeyRenamer

__all__ = ["KeyRule", "rename_keys", "add_batch_counters"]


@dataclass(frozen=True)
class KeyRule:
    """``foreign`` ↔ ``zoo`` module paths; ``kind`` says how the keys below them are renamed."""

    foreign: str
    zoo: str
    kind: str = "same"

    def __post_init__(self) -> None:
        if self.kind not in ("same", "conv_norm"):
            raise ValueError(f"unknown key rule kind {self.kind!r}")

    def pairs(self) -> list[tuple[str, str]]:
        """The rule as ``KeyRenamer`` ``(foreign, zoo)`` templates, anchored at the key's start."""
        if self.kind == "conv_norm":
            return [(f"^{self.foreign}.conv", f"^{self.zoo}.0"), (f"^{self.foreign}.norm", f"^{self.zoo}.1")]
        return [(f"^{self.foreign}", f"^{self.zoo}")]

    def renamer(self) -> KeyRenamer:
        """This rule alone as a ``KeyRenamer``."""
        return KeyRenamer(self.pairs())

    def guard(self) -> KeyRenamer | None:
        """For an identity rule (same path both sides): a renamer that changes exactly the keys it covers; else None."""
        if self.foreign != self.zoo:
            return None
        return KeyRenamer([(foreign, f"{foreign}.guarded") for foreign, _ in self.pairs()])


def rename_keys(
    state_dict: Mapping[str, torch.Tensor], rules: Sequence[KeyRule], *, to_zoo: bool, drop: Iterable[str] = ()
) -> dict[str, torch.Tensor]:
    """The renamed state dict (tensors shared): the first rule covering a key renames it; ``drop`` patterns are left out."""
    drop_patterns = [re.compile(pattern) for pattern in drop]
    compiled = [(rule.renamer(), rule.guard()) for rule in rules]
    renamed: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for key, tensor in state_dict.items():
        if any(pattern.search(key) for pattern in drop_patterns):
            continue
        new_key = key
        for renamer, guard in compiled:
            if guard is not None:
                if guard.key_to_zoo(key) != key:
                    break  # an identity rule keeps this key's name and guards it from the rules after it
                continue
            candidate = renamer.key_to_zoo(key) if to_zoo else renamer.key_from_zoo(key)
            if candidate != key:
                new_key = candidate
                break
        if new_key in renamed:
            raise ValueError(f"renaming maps both {origin[new_key]!r} and {key!r} to {new_key!r}")
        renamed[new_key], origin[new_key] = tensor, key
    return renamed


def add_batch_counters(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Give every BatchNorm (a ``running_var`` key) a ``num_batches_tracked`` (0) where it has none.

    Checkpoints with frozen BatchNorms (FrozenBatchNorm2d: statistics as plain buffers) lack it.
    """
    for key in [k for k in state_dict if k.endswith(".running_var")]:
        counter = key[: -len("running_var")] + "num_batches_tracked"
        if counter not in state_dict:
            state_dict[counter] = torch.tensor(0, dtype=torch.long)
    return state_dict
