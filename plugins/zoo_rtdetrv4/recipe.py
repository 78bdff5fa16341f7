"""RT-DETRv4's training recipe: DEIM's recipe (``zoo_core.recipes.detr.DEIMRecipe``) without the teacher.

RT-DETRs/RT-DETRv4 ``configs/rtv4/rtv4_hgnetv2_{s,m,l,x}_coco.yml`` over ``configs/base/rtv4.yml``
use DEIM's numbers for every size (base and backbone rates, weight decay, epochs, flat epochs,
no-augmentation epochs, flat-cosine with ``lr_gamma`` 0.5 and 2000 warm-up iterations) and add
a distillation loss from a frozen DINOv3 ViT-B/16 teacher into the encoder's stride-32 map through
a training-only feature projector (``loss_distill`` 5 / 5 / 15 / 20 for S / M / L / X, with
gradient-guided adaptive weighting). That teacher is NOT built in zoo: zoo trains RT-DETRv4 as
DEIM trains (as LibreYOLO 1.6 does), so a zoo-trained RT-DETRv4 is a DEIM-trained student.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from zoo_core.recipes.detr import DEIM_SIZE_SETTINGS, DEIMRecipe

__all__ = ["RTDETRv4Recipe"]


class RTDETRv4Recipe(DEIMRecipe):
    """RT-DETRv4 without its DINOv3 teacher (see the module docstring)."""

    size_settings: ClassVar[Mapping[str, Mapping[str, Any]]] = {size: DEIM_SIZE_SETTINGS[size] for size in ("s", "m", "l", "x")}
