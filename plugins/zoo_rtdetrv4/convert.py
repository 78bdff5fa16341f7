"""RT-DETRv4 checkpoints: LibreYOLO 1.6.0 keys ↔ zoo keys (pure renaming; no model is built).

LibreYOLO's RT-DETRv4 model uses the official names, the same for D-FINE, DEIM and RT-DETRv4: the
conversion is ``zoo_core.detr.libreyolo_keys``'s, shared by the three. Official RT-DETRv4 checkpoints also hold
the training-only distillation projector, which is dropped.
"""

from __future__ import annotations

from typing import Mapping

import torch

from zoo_core.detr.libreyolo_keys import FROZEN_NORM_SIZES, distribution_detr_from_libreyolo, distribution_detr_to_libreyolo
from zoo_core.key_renaming import LayoutConverter

__all__ = ["convert", "from_libreyolo", "to_libreyolo", "FROZEN_NORM_SIZES"]


def from_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO RT-DETRv4 ``model`` state dict (or the official one) → zoo's ``rtdetrv4`` keys."""
    return distribution_detr_from_libreyolo(state_dict, extra_drop=(r"^encoder\.feature_projector\.",))


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """zoo's ``rtdetrv4`` state dict → LibreYOLO keys."""
    return distribution_detr_to_libreyolo(size, state_dict)


# The registry ``converter``: LibreYOLO's names (the official release's too) read, LibreYOLO's written
# (``save(format="libreyolo")``).
convert = LayoutConverter(from_libreyolo, to_libreyolo)
