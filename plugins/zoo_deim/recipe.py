"""DEIM's training recipe: ``zoo_core.recipes.detr.DEIMRecipe``, DEIM's flat-cosine schedule and per-size numbers.

The recipe and its numbers (``DEIM_SIZE_SETTINGS``, from ShihuaHuang95/DEIM
``configs/deim_dfine/deim_hgnetv2_{n,s,m,l,x}_coco.yml``) live in ``zoo_core.recipes.detr``
because RT-DETRv4 trains with them too; registry.yaml names this module's ``DEIMRecipe``.
"""

from __future__ import annotations

from zoo_core.recipes.detr import DEIM_SIZE_SETTINGS, DEIMRecipe

__all__ = ["DEIMRecipe", "DEIM_SIZE_SETTINGS"]
