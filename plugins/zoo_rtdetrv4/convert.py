"""RT-DETRv4 checkpoints: LibreYOLO 1.6.0 keys ↔ zoo keys (pure renaming; no model is built).

LibreYOLO's RT-DETRv4 model uses the official names (the same for D-FINE, DEIM and RT-DETRv4), mapped
by ``zoo_core.detr.libreyolo_keys.distribution_detr_rules``. Cached anchors, their validity mask and
per-layer point scales are dropped (zoo recomputes them; LibreYOLO regenerates them when missing).
Backbones LibreYOLO builds with frozen BatchNorms (L and X when loading a checkpoint) have no
``num_batches_tracked``: zoo adds them on the way in and drops them on the way out.
"""

from __future__ import annotations

from typing import Mapping

import torch

from zoo_core.detr.key_mapping import add_batch_counters, rename_keys
from zoo_core.detr.libreyolo_keys import DISTRIBUTION_DETR_DROP, distribution_detr_rules

__all__ = ["from_libreyolo", "to_libreyolo", "FROZEN_NORM_SIZES"]

#: Sizes whose LibreYOLO backbone, when loaded from a checkpoint, uses FrozenBatchNorm2d (no counters).
FROZEN_NORM_SIZES = frozenset({"l", "x"})
_RULES = distribution_detr_rules()


def from_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO RT-DETRv4 ``model`` state dict (or the official one) → zoo's ``rtdetrv4`` keys."""
    drop = (*DISTRIBUTION_DETR_DROP, r"^encoder\.feature_projector\.")  # official: the training-only distillation projector
    return add_batch_counters(rename_keys(state_dict, _RULES, to_zoo=True, drop=drop))


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """zoo's ``rtdetrv4`` state dict → LibreYOLO keys (its loader regenerates the dropped anchor buffers)."""
    renamed = rename_keys(state_dict, _RULES, to_zoo=False)
    for name in ("up", "reg_scale"):  # LibreYOLO's inner decoder holds the same two tensors
        renamed[f"decoder.decoder.{name}"] = renamed[f"decoder.{name}"]
    if size in FROZEN_NORM_SIZES:
        renamed = {k: v for k, v in renamed.items() if not (k.startswith("backbone.") and k.endswith("num_batches_tracked"))}
    return renamed
