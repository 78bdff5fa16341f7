"""DEIMv2's published training recipe (Intellindust-AI-Lab/DEIMv2 ``configs/deimv2/*.yml`` + ``configs/base``).

Family-wide values are the registry's ``train_defaults``; this class adds what differs per size
and what needs code:

- per size: learning rate, weight decay, epochs, warm-up iterations, flat epochs, no-augmentation
  epochs (= ``close_mosaic``: mosaic, photometric, zoom-out and IoU-crop stop there), final lr
  ratio (``lr_gamma`` → ``lrf``), mosaic probability and total batch (``SIZES``);
- the backbone learning-rate multiplier: the whole HGNetv2 for Atto-N, only the DINOv3/ViT-Tiny
  of the S-X adapters (their STA and fusion convs learn at the base rate);
- from the DETR line's ``DETRRecipe`` (``zoo_core.recipes.detr``): the DETR training step
  (targets go to ``forward`` for the denoising queries), the stop epoch (``close_mosaic`` epochs
  before the end: every augmentation but the flip stops, ``only_flips``) and multi-scale training
  (``base_size_repeat``, ``MULTI_SCALE_REPEAT``) for the DINOv3 sizes S-X only, as published: the
  HGNetv2 sizes Atto-N train at one size;
- the **epoch-aware matcher switch** as a recipe event: from ``matcher_change_epoch`` on, the
  Hungarian cost becomes ``−p·IoU⁴`` (``zoo_deimv2.criterion``). The published epoch is kept
  as a fraction of the published schedule (e.g. S: 100 of 132), so a shorter run switches at the
  same point of its own schedule.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from torch import nn

from zoo_core.recipes.detr import DETRRecipe
from zoo_core.engine.recipe import RunInfo

__all__ = ["DEIMv2Recipe", "SIZES"]

# Per size: the config files' optimizer lr, weight_decay, epoches, warmup_iter, flat_epoch, no_aug_epoch,
# lr_gamma, mosaic_prob, total_batch_size; the backbone group's lr ratio; matcher_change_epoch.
SIZES: dict[str, dict[str, Any]] = {
    "atto": dict(lr0=2e-3, weight_decay=1e-4, epochs=500, warmup_iters=4000, flat_epochs=250, close_mosaic=32, lrf=0.5, mosaic=0.3, batch=128,
                 backbone=("backbone.", 0.5), change_epoch=450),
    "femto": dict(lr0=1.6e-3, weight_decay=1e-4, epochs=500, warmup_iters=4000, flat_epochs=250, close_mosaic=32, lrf=0.5, mosaic=0.3, batch=128,
                  backbone=("backbone.", 0.5), change_epoch=450),
    "pico": dict(lr0=1.6e-3, weight_decay=1e-4, epochs=500, warmup_iters=4000, flat_epochs=250, close_mosaic=32, lrf=0.5, mosaic=0.3, batch=128,
                 backbone=("backbone.", 0.5), change_epoch=450),
    "n": dict(lr0=8e-4, weight_decay=1e-4, epochs=160, warmup_iters=2000, flat_epochs=78, close_mosaic=12, lrf=1.0, mosaic=0.5, batch=32,
              backbone=("backbone.", 0.5), change_epoch=136),
    "s": dict(lr0=5e-4, weight_decay=1e-4, epochs=132, warmup_iters=2000, flat_epochs=64, close_mosaic=12, lrf=0.5, mosaic=0.5, batch=32,
              backbone=("backbone.vit.", 0.05), change_epoch=100),
    "m": dict(lr0=5e-4, weight_decay=1e-4, epochs=102, warmup_iters=2000, flat_epochs=49, close_mosaic=12, lrf=0.5, mosaic=0.5, batch=32,
              backbone=("backbone.vit.", 0.05), change_epoch=80),
    "l": dict(lr0=5e-4, weight_decay=1.25e-4, epochs=68, warmup_iters=2000, flat_epochs=34, close_mosaic=8, lrf=0.5, mosaic=0.5, batch=32,
              backbone=("backbone.vit.", 0.025), change_epoch=50),
    "x": dict(lr0=5e-4, weight_decay=1.25e-4, epochs=58, warmup_iters=2000, flat_epochs=29, close_mosaic=8, lrf=0.5, mosaic=0.5, batch=32,
              backbone=("backbone.vit.", 0.02), change_epoch=45),
}
_NOT_ARGUMENTS = ("backbone", "change_epoch")
# The collate's ``base_size_repeat`` per size (None: ``~``, one training size).
MULTI_SCALE_REPEAT: dict[str, int | None] = {"atto": None, "femto": None, "pico": None, "n": None, "s": 20, "m": 6,
                                             "l": 3, "x": 3}


class DEIMv2Recipe(DETRRecipe):
    """See the module docstring."""

    size_multiple = 32  # strides 8/16/32 (patch 16, resampled to 8 and 32)
    multi_scale_repeat: ClassVar[Mapping[str, int | None]] = MULTI_SCALE_REPEAT

    @property
    def spec(self) -> dict[str, Any]:
        return SIZES[self.size]

    @property
    def config_defaults(self) -> dict[str, Any]:
        """The registry's ``train_defaults``, then this size's ``SIZES`` values (multi-scale on where published)."""
        values = {key: value for key, value in self.spec.items() if key not in _NOT_ARGUMENTS}
        multi_scale = MULTI_SCALE_REPEAT[self.size] is not None
        return {**dict(self.declaration.train_defaults), **values, "nbs": values["batch"], "multi_scale": multi_scale}

    @property
    def lr_multipliers(self) -> Mapping[str, float]:  # type: ignore[override]
        """The size's backbone group and its multiplier: the whole HGNetv2 (Atto-N), the ViT only (S-X)."""
        prefix, multiplier = self.spec["backbone"]
        return {prefix: multiplier}

    def matcher_change_epoch(self, epochs: int) -> int:
        """The epoch the IoU-ordered matching starts at in a run of ``epochs`` (the published fraction)."""
        return round(epochs * self.spec["change_epoch"] / self.spec["epochs"])

    def on_epoch_start(self, model: nn.Module, run: RunInfo) -> None:
        model.criterion.matcher.iou_ordered = run.epoch >= self.matcher_change_epoch(run.epochs)
