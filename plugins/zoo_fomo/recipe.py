"""FOMO's training recipe: LibreYOLO 1.6's ``FOMOConfig`` (Edge Impulse publishes no training script).

Everything but one thing is data (registry ``train_defaults``): Adam, lr 3e-4, no weight decay,
cosine to 0.05 × lr, no warm-up, no augmentation, no EMA. What data cannot say: FOMO's grid has
a stride of 8, so any input that is a multiple of 8 fits (the ``points`` task has no stride of
its own to impose).
"""

from __future__ import annotations

from zoo_core.engine.recipe import TrainingRecipe

__all__ = ["FomoRecipe"]


class FomoRecipe(TrainingRecipe):
    """The FOMO recipe: inputs rounded up to multiples of the grid stride (8)."""

    size_multiple = 8
