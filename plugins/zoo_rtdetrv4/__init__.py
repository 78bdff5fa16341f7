"""The RT-DETRv4 family plugin (detection): its declaration is the `rtdetrv4` entry of registry.yaml.

The model is assembled by ``zoo_core.detr.distribution_detr`` in the sibling module ``model``;
``convert`` maps LibreYOLO checkpoints. Both are imported only when needed: nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("rtdetrv4")
