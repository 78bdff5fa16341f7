"""The training recipes the DETR families share: ``DETRStepRecipe``, ``DETRRecipe`` and DEIM's.

Every DETR family (RT-DETR, D-FINE, DEIM, RT-DETRv4 on ``zoo_core.detr``; DEIMv2 and EdgeCrafter
on ``zoo_core.detr_vit``; RF-DETR) changes ``TrainingRecipe`` in the same places:

- ``forward_train`` passes the batch's targets to ``forward``: the decoder builds its
  denoising queries (label- and box-noised copies of the ground truth, in groups) from them
  (``DETRStepRecipe``: that alone);
- the backbone learns at a fraction of the base rate (``lr_multipliers = {"backbone.": ...}``);
- the published numbers that differ by size (base rate, backbone multiplier, weight decay,
  epochs, flat epochs, the epoch the augmentation stops, the total batch) come from
  ``size_settings`` on top of the registry's ``train_defaults``;
- multi-scale training (the registry's ``multi_scale: true``): each batch at a size drawn from
  0.75× to 1.25× of the training size in steps of 32, the training size itself
  ``multi_scale_repeat`` times among them (RT-DETR's list [480 ... 800] at 640 has it 3 times;
  D-FINE's ``base_size_repeat`` per size, where ``None`` trains that size at one size);
- the stop epoch (``close_mosaic`` epochs before the end): every augmentation but the flip stops,
  multi-scale with it (``only_flips``; D-FINE's ``stop_epoch`` policy and collate).

``DEIMRecipe`` and its per-size numbers live here too: RT-DETRv4 trains with them.

What the published recipes do that zoo does not (yet): MixUp (DEIM),
restarting the EMA from the best checkpoint at the stop epoch (D-FINE),
a quadratic warm-up (DEIM's flat-cosine; zoo's is linear), and freezing the backbone stem and
BatchNorms of the large sizes (published only with ImageNet-pretrained backbones, which zoo does
not load: a frozen random stem would never learn).

This module sits above the engine in the import layers (a recipe is a ``TrainingRecipe``), so
the DETR core ``zoo_core.detr`` never imports it; families name their recipe in registry.yaml.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import torch
from torch import nn

from zoo_core.engine.multi_scale import sizes_around
from zoo_core.engine.recipe import TrainingRecipe, only_flips
from zoo_core.tasks.base import AugmentSettings, unwrap_model

__all__ = [
    "DETRStepRecipe",
    "DETRRecipe",
    "DEIMRecipe",
    "BACKBONE_LR",
    "DFINE_MULTI_SCALE_REPEAT",
    "DEIM_SIZE_SETTINGS",
]

BACKBONE_LR = "backbone_lr"  # size_settings key: the backbone's learning-rate multiplier

# D-FINE's ``base_size_repeat`` per size (Peterande/D-FINE configs/dfine/dfine_hgnetv2_{n,s,m,l,x}_coco.yml;
# DEIM's and RT-DETRv4's configs include them): N trains at one size (``~``), the smaller the model the
# more often its training size is drawn.
DFINE_MULTI_SCALE_REPEAT: Mapping[str, int | None] = {"n": None, "s": 20, "m": 6, "l": 4, "x": 3}


class DETRStepRecipe(TrainingRecipe):
    """The DETR training step, nothing else: the batch's targets reach ``forward``."""

    def forward_train(self, model: nn.Module, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``model(images, targets=...)`` (denoising queries need the targets), then the set-prediction loss."""
        outputs = model(batch["images"], targets=batch["targets"])
        return self.task.loss(unwrap_model(model), outputs, batch)


class DETRRecipe(DETRStepRecipe):
    """The DETR line's recipe (see the module docstring); subclasses fill ``size_settings``.

    ``size_settings[size]`` holds training arguments (any ``TrainConfig`` key) that override the
    family's ``train_defaults`` for that size, plus ``backbone_lr``: the multiplier of the
    learning rate of every parameter under ``backbone.``.
    """

    size_settings: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: Per size: how often the training size is among the multi-scale sizes (None: no multi-scale for
    #: that size); sizes not listed have it 3 times, as RT-DETR's list does.
    multi_scale_repeat: ClassVar[Mapping[str, int | None]] = {}

    def _settings(self) -> Mapping[str, Any]:
        return self.size_settings.get(self.size, {})

    @property
    def lr_multipliers(self) -> Mapping[str, float]:  # type: ignore[override]
        """``{"backbone.": the size's backbone multiplier}`` (1: none)."""
        scale = float(self._settings().get(BACKBONE_LR, 1.0))
        return {"backbone.": scale} if scale != 1.0 else {}

    @property
    def config_defaults(self) -> dict[str, Any]:
        """The family's ``train_defaults``, then this size's published values."""
        sized = {key: value for key, value in self._settings().items() if key != BACKBONE_LR}
        one_size = {"multi_scale": False} if self.multi_scale_repeat.get(self.size, 3) is None else {}
        return {**self.declaration.train_defaults, **sized, **one_size}

    def multi_scale_sizes(self, image_size: int) -> tuple[int, ...]:
        """0.75× to 1.25× of ``image_size`` in steps of 32, ``image_size`` itself ``multi_scale_repeat`` times."""
        return sizes_around(image_size, self.multi_scale_repeat.get(self.size) or 3)

    def closed_augmentation(self, settings: AugmentSettings) -> AugmentSettings:
        """The stop epoch: only the flip goes on (``only_flips``)."""
        return only_flips(settings)


# DEIM's per-size numbers, ShihuaHuang95/DEIM ``configs/deim_dfine/deim_hgnetv2_{n,s,m,l,x}_coco.yml`` over
# ``configs/base/deim.yml`` (the shared values are the registry's ``train_defaults``): base rate, backbone
# rate (as a multiplier), weight decay, epochs, ``flat_epoch`` and ``no_aug_epoch`` (``close_mosaic``: the
# flat-cosine decay ends there and mosaic stops), total batch (``nbs``). N keeps the rate flat
# (``flat_epoch: 7800``, ``lr_gamma: 1.0``): ``flat_epochs`` = its epochs, ``lrf`` 1.
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
    """DEIM's recipe: ``DETRRecipe`` with DEIM's per-size numbers and D-FINE's multi-scale repeats.

    DEIM's policy runs mosaic (p 0.5) and MixUp between epochs 4 and ``flat_epoch`` and the other
    augmentations until the stop epoch; zoo runs mosaic from the start until ``close_mosaic`` and
    has no MixUp (the module docstring lists what else is not done).
    """

    size_settings: ClassVar[Mapping[str, Mapping[str, Any]]] = DEIM_SIZE_SETTINGS
    multi_scale_repeat: ClassVar[Mapping[str, int | None]] = DFINE_MULTI_SCALE_REPEAT
