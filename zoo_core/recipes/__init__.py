"""Training recipes several families share (``TrainingRecipe`` subclasses, ``zoo_core/engine/recipe.py``).

A family names its recipe in registry.yaml (``recipe: "module:Class"``); what only one family does
stays in its plugin, what several do lives here: ``detr`` for the DETR line (targets reach the
forward pass, the flip-only stop epoch, the published multi-scale sizes, DEIM's per-size numbers).
This package sits above the engine in the import layers: nothing in the engine imports it.
"""
