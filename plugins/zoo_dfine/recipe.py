"""D-FINE's training recipe: ``DETRRecipe`` (``zoo_core.recipes.detr``) with D-FINE's per-size numbers.

Per size, from Peterande/D-FINE ``configs/dfine/dfine_hgnetv2_{n,s,m,l,x}_coco.yml`` (the shared
values are the registry's ``train_defaults``): base rate, backbone rate (as a multiplier),
weight decay, epochs, the augmentation stop epoch (``policy.epoch`` = ``collate_fn.stop_epoch``:
``close_mosaic`` = epochs - stop) and the total batch (``nbs``: a smaller batch accumulates up
to it). The schedule is constant after the 500-iteration warm-up (``MultiStepLR`` milestone
500 epochs, never reached); flat-cosine came with DEIM.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from zoo_core.recipes.detr import BACKBONE_LR, DFINE_MULTI_SCALE_REPEAT, DETRRecipe

__all__ = ["DFINERecipe"]


class DFINERecipe(DETRRecipe):
    """D-FINE (see the module docstring)."""

    multi_scale_repeat: ClassVar[Mapping[str, int | None]] = DFINE_MULTI_SCALE_REPEAT
    size_settings: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        # lr 8e-4, backbone 4e-4, wd 1e-4, 160 epochs, stop 148, total batch 128
        "n": {"lr0": 8e-4, BACKBONE_LR: 0.5, "weight_decay": 1e-4, "epochs": 160, "close_mosaic": 12, "nbs": 128},
        # lr 2e-4, backbone 1e-4, wd 1e-4, 132 epochs, stop 120
        "s": {"lr0": 2e-4, BACKBONE_LR: 0.5, "weight_decay": 1e-4, "epochs": 132, "close_mosaic": 12},
        # lr 2e-4, backbone 2e-5, wd 1e-4, 132 epochs, stop 120
        "m": {"lr0": 2e-4, BACKBONE_LR: 0.1, "weight_decay": 1e-4, "epochs": 132, "close_mosaic": 12},
        # lr 2.5e-4, backbone 1.25e-5, wd 1.25e-4, 80 epochs, stop 72
        "l": {"lr0": 2.5e-4, BACKBONE_LR: 0.05, "weight_decay": 1.25e-4, "epochs": 80, "close_mosaic": 8},
        # lr 2.5e-4, backbone 2.5e-6, wd 1.25e-4, 80 epochs, stop 72
        "x": {"lr0": 2.5e-4, BACKBONE_LR: 0.01, "weight_decay": 1.25e-4, "epochs": 80, "close_mosaic": 8},
    }
