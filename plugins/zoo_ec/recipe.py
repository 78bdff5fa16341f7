"""EdgeCrafter ECDet's published training recipe (``ecdetseg/configs/ecdet/ecdet.yml`` and ``ecdet_{s,m,l,x}.yml``).

Family-wide values (AdamW, betas 0.9/0.999, flat-cosine with a 2000-iteration warm-up, EMA 0.9999
with a 1000-step ramp, clip 0.1, batch 32, mixup/mosaic policy) are the registry's
``train_defaults``; this class (the DETR line's ``DETRRecipe``, ``zoo_core.recipes.detr``) adds the
per-size values and the DETR training step:

- S: lr 5e-4, backbone ×0.05 (2.5e-5), weight decay 1e-4, 74 epochs, flat until 36 (the mosaic
  epoch), strong augmentation off for the last 2 (stop epoch 72), final lr ×0.5, mosaic 0.75;
- M: as S with 62 epochs, flat 30, stop 60;
- L: backbone ×0.01 (5e-6), weight decay 1.25e-4, 50 epochs, flat 24, stop 48, mosaic 1.0;
- X: as L with backbone ×0.005 (2.5e-6).

The backbone multiplier covers ECViT and its projectors (the configs' ``.backbone`` parameter group).
At the stop epoch every augmentation but the flip stops (``only_flips``). ECDet trains at one size
(its collate has no multi-scale).
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from zoo_core.recipes.detr import BACKBONE_LR, DETRRecipe
from zoo_core.engine.recipe import TrainingRecipe

__all__ = ["ECRecipe", "SIZES"]

SIZES: dict[str, dict[str, Any]] = {
    "s": dict(lr0=5e-4, weight_decay=1e-4, epochs=74, flat_epochs=36, close_mosaic=2, lrf=0.5, mosaic=0.75, backbone=0.05),
    "m": dict(lr0=5e-4, weight_decay=1e-4, epochs=62, flat_epochs=30, close_mosaic=2, lrf=0.5, mosaic=0.75, backbone=0.05),
    "l": dict(lr0=5e-4, weight_decay=1.25e-4, epochs=50, flat_epochs=24, close_mosaic=2, lrf=0.5, mosaic=1.0, backbone=0.01),
    "x": dict(lr0=5e-4, weight_decay=1.25e-4, epochs=50, flat_epochs=24, close_mosaic=2, lrf=0.5, mosaic=1.0, backbone=0.005),
}


class ECRecipe(DETRRecipe):
    """See the module docstring."""

    size_multiple = 32  # ECViT's stride-16 tokens resampled to stride 32
    size_settings: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        size: {**{key: value for key, value in values.items() if key != "backbone"}, BACKBONE_LR: values["backbone"]}
        for size, values in SIZES.items()
    }
    # ECDet's collate has no multi-scale, so it publishes no list of sizes: a run that asks for
    # multi-scale gets the default rule, not the DETR line's 0.75-1.25x.
    multi_scale_sizes = TrainingRecipe.multi_scale_sizes
