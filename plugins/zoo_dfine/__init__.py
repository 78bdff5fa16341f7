"""The D-FINE family plugin: registry.yaml's `dfine` (detection) and `dfine_seg` (instance segmentation).

The model is assembled by ``zoo_core.detr.distribution_detr`` in the sibling module ``model``;
``convert`` maps LibreYOLO checkpoints. Both are imported only when needed: nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("dfine", "dfine_seg")
