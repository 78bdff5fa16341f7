"""SegFormer's training recipe (imported when training starts).

The published recipe (mmsegmentation ``segformer_mit-b0_8xb2-160k_ade20k-512x512.py``) trains the
decode head at ten times the encoder's learning rate; everything else it sets is data in the
registry's ``train_defaults`` (AdamW 6e-5, weight decay 0.01, 1500 warm-up iterations, poly 1.0).
"""

from __future__ import annotations

from zoo_core.engine.recipe import TrainingRecipe

__all__ = ["SegformerRecipe"]


class SegformerRecipe(TrainingRecipe):
    """The default recipe with the all-MLP decoder (``decoder.*``) at 10x the learning rate (mmseg ``head`` lr_mult 10)."""

    lr_multipliers = {"decoder.": 10.0}
