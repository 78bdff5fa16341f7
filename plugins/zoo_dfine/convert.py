"""D-FINE and D-FINE-seg checkpoints: LibreYOLO 1.6.0 keys ↔ zoo keys (pure renaming; no model is built).

LibreYOLO's D-FINE model uses the official names, the same for D-FINE, DEIM and RT-DETRv4: the
conversion is ``zoo_core.detr.libreyolo_keys``'s, shared by the three. D-FINE-seg adds its mask head's keys
(``mask_head_rules``).
"""

from __future__ import annotations

from typing import Mapping

import torch

from zoo_core.detr.libreyolo_keys import (
    FROZEN_NORM_SIZES,
    distribution_detr_from_libreyolo,
    distribution_detr_to_libreyolo,
    mask_head_rules,
)
from zoo_core.key_renaming import LayoutConverter

__all__ = [
    "convert", "from_libreyolo", "to_libreyolo", "FROZEN_NORM_SIZES",
    "convert_segmenter", "from_libreyolo_segmenter", "to_libreyolo_segmenter",
]


def from_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO D-FINE ``model`` state dict (or the official one) → zoo's ``dfine`` keys."""
    return distribution_detr_from_libreyolo(state_dict)


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """zoo's ``dfine`` state dict → LibreYOLO keys."""
    return distribution_detr_to_libreyolo(size, state_dict)


# The registry ``converter``: LibreYOLO's names (the official release's too) read, LibreYOLO's written
# (``save(format="libreyolo")``).
convert = LayoutConverter(from_libreyolo, to_libreyolo)


def _refuse_detector(state_dict: Mapping[str, torch.Tensor]) -> None:
    if not any(key.startswith(("decoder.mask_decoder.", "decoder.mask_head.")) for key in state_dict):
        raise ValueError(
            "this D-FINE checkpoint has no mask head (no decoder.mask_decoder.* / decoder.mask_head.* keys): it is a "
            "detector; load it as dfine (LibreYOLO('dfine-n') names), not dfine_seg"
        )


def from_libreyolo_segmenter(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO D-FINE-seg ``model`` state dict (``LibreDFINE{size}-seg.pt``) → zoo's ``dfine_seg`` keys."""
    _refuse_detector(state_dict)
    return distribution_detr_from_libreyolo(state_dict, extra_rules=mask_head_rules())


def to_libreyolo_segmenter(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """zoo's ``dfine_seg`` state dict → LibreYOLO's D-FINE-seg keys."""
    return distribution_detr_to_libreyolo(size, state_dict, extra_rules=mask_head_rules())


# The registry ``converter`` of dfine_seg.
convert_segmenter = LayoutConverter(from_libreyolo_segmenter, to_libreyolo_segmenter)
