"""The training recipes of the RT-DETR line: ``DETRRecipe`` (shared) and RT-DETR's own.

``DETRRecipe`` is what every DETR of the line (RT-DETR, D-FINE, DEIM, RT-DETRv4 and the
families built on ``zoo_core.detr``) changes in ``TrainingRecipe``:

- ``forward_train`` passes the batch's targets to ``forward``: the decoder builds its
  denoising queries (label- and box-noised copies of the ground truth, in groups) from them;
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

What the published recipes do that zoo does not (yet): MixUp (DEIM),
restarting the EMA from the best checkpoint at the stop epoch (D-FINE),
a quadratic warm-up (DEIM's flat-cosine; zoo's is linear), and freezing the backbone stem and
BatchNorms of the large sizes (published only with ImageNet-pretrained backbones, which zoo does
not load: a frozen random stem would never learn).
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import torch
from torch import nn

from zoo_core.engine.multi_scale import sizes_around
from zoo_core.engine.recipe import TrainingRecipe, only_flips
from zoo_core.tasks.base import AugmentSettings, unwrap_model

__all__ = ["DETRRecipe", "RTDETRRecipe", "DFINE_MULTI_SCALE_REPEAT"]

BACKBONE_LR = "backbone_lr"  # size_settings key: the backbone's learning-rate multiplier

# D-FINE's ``base_size_repeat`` per size (Peterande/D-FINE configs/dfine/dfine_hgnetv2_{n,s,m,l,x}_coco.yml;
# DEIM's and RT-DETRv4's configs include them): N trains at one size (``~``), the smaller the model the
# more often its training size is drawn.
DFINE_MULTI_SCALE_REPEAT: Mapping[str, int | None] = {"n": None, "s": 20, "m": 6, "l": 4, "x": 3}


class DETRRecipe(TrainingRecipe):
    """The DETR line's recipe; subclasses fill ``size_settings``.

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

    def forward_train(self, model: nn.Module, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``model(images, targets=...)`` (denoising queries need the targets), then the set-prediction loss."""
        outputs = model(batch["images"], targets=batch["targets"])
        return self.task.loss(unwrap_model(model), outputs, batch)


class RTDETRRecipe(DETRRecipe):
    """RT-DETR (the registry's ``train_defaults`` hold what all sizes share).

    Backbone learning rates, lyuwenyu/RT-DETR ``rtdetr_pytorch/configs/rtdetr/rtdetr_r*vd_6x_coco.yml``
    (base 1e-4): 1e-5 for R18/R34/R50-M/R50, 1e-6 for R101; HGNetv2-L/X from
    ``rtdetr_paddle/configs/rtdetr/rtdetr_hgnetv2_{l,x}_6x_coco.yml`` ``lr_mult_list`` (0.05 / 0.01,
    stem 0 = frozen: not done, see the module docstring).
    """

    size_settings: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "r18": {BACKBONE_LR: 0.1},
        "r34": {BACKBONE_LR: 0.1},
        "r50m": {BACKBONE_LR: 0.1},
        "r50": {BACKBONE_LR: 0.1},
        "r101": {BACKBONE_LR: 0.01},
        "l": {BACKBONE_LR: 0.05},
        "x": {BACKBONE_LR: 0.01},
    }
