"""DEIM's training recipe: ``DETRRecipe`` with DEIM's flat-cosine schedule and per-size numbers.

Per size, from ShihuaHuang95/DEIM ``configs/deim_dfine/deim_hgnetv2_{n,s,m,l,x}_coco.yml`` over
``configs/base/deim.yml`` (the shared values are the registry's ``train_defaults``): base rate,
backbone rate (as a multiplier), weight decay, epochs, ``flat_epoch`` and ``no_aug_epoch``
(``close_mosaic``: the flat-cosine decay ends there and mosaic stops), total batch (``nbs``).
N keeps the rate flat (``flat_epoch: 7800``, ``lr_gamma: 1.0``): ``flat_epochs`` = its epochs, ``lrf`` 1.

DEIM's policy runs mosaic (p 0.5) and MixUp between epochs 4 and ``flat_epoch`` and the other
augmentations until the stop epoch; zoo runs mosaic from the start until ``close_mosaic`` and has
no MixUp (``zoo_rtdetr.recipe`` lists what else is not done).
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from zoo_rtdetr.recipe import BACKBONE_LR, DFINE_MULTI_SCALE_REPEAT, DETRRecipe

__all__ = ["DEIMRecipe", "DEIM_SIZE_SETTINGS"]

DEIM_SIZE_SETTINGS: Mapping[str, Mapping[str, Any]] = {
    # lr 8e-4, backbone 4e-4, wd 1e-4, 160 epochs, constant (flat 7800, lr_gamma 1), no-aug 12, total batch 128
    "n": {"lr0": 8e-4, BACKBONE_LR: 0.5, "weight_decay": 1e-4, "epochs": 160, "flat_epochs": 160, "lrf": 1.0,
          "close_mosaic": 12, "nbs": 128},
    # lr 4e-4, backbone 2e-4, wd 1e-4, 132 epochs, flat 64, no-aug 12
    "s": {"lr0": 4e-4, BACKBONE_LR: 0.5, "weight_decay": 1e-4, "epochs": 132, "flat_epochs": 64, "close_mosaic": 12},
    # lr 4e-4, backbone 4e-5, wd 1e-4, 102 epochs, flat 49, no-aug 12
    "m": {"lr0": 4e-4, BACKBONE_LR: 0.1, "weight_decay": 1e-4, "epochs": 102, "flat_epochs": 49, "close_mosaic": 12},
    # lr 5e-4, backbone 2.5e-5, wd 1.25e-4, 58 epochs, flat 29, no-aug 8
    "l": {"lr0": 5e-4, BACKBONE_LR: 0.05, "weight_decay": 1.25e-4, "epochs": 58, "flat_epochs": 29, "close_mosaic": 8},
    # lr 5e-4, backbone 5e-6, wd 1.25e-4, 58 epochs, flat 29, no-aug 8
    "x": {"lr0": 5e-4, BACKBONE_LR: 0.01, "weight_decay": 1.25e-4, "epochs": 58, "flat_epochs": 29, "close_mosaic": 8},
}


class DEIMRecipe(DETRRecipe):
    """DEIM (see the module docstring)."""

    size_settings: ClassVar[Mapping[str, Mapping[str, Any]]] = DEIM_SIZE_SETTINGS
    multi_scale_repeat: ClassVar[Mapping[str, int | None]] = DFINE_MULTI_SCALE_REPEAT
