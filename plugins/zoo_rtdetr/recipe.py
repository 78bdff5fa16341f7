"""RT-DETR's training recipe: the DETR line's ``DETRRecipe`` (``zoo_core.recipes.detr``) with RT-DETR's backbone rates.

``zoo_core.recipes.detr`` says what the DETR line changes in ``TrainingRecipe`` (targets reach
``forward``, the backbone's learning-rate multiplier, per-size numbers, multi-scale sizes, the
flip-only stop epoch) and what the published recipes do that zoo does not.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from zoo_core.recipes.detr import BACKBONE_LR, DETRRecipe

__all__ = ["RTDETRRecipe"]


class RTDETRRecipe(DETRRecipe):
    """RT-DETR (the registry's ``train_defaults`` hold what all sizes share).

    Backbone learning rates, lyuwenyu/RT-DETR ``rtdetr_pytorch/configs/rtdetr/rtdetr_r*vd_6x_coco.yml``
    (base 1e-4): 1e-5 for R18/R34/R50-M/R50, 1e-6 for R101; HGNetv2-L/X from
    ``rtdetr_paddle/configs/rtdetr/rtdetr_hgnetv2_{l,x}_6x_coco.yml`` ``lr_mult_list`` (0.05 / 0.01,
    stem 0 = frozen: not done, see ``zoo_core.recipes.detr``).
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
