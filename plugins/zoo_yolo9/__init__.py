"""The YOLOv9 family plugin (detection): the `yolo9` entry of registry.yaml.

The architecture lives in the sibling module ``model`` and the foreign weight layouts in
``convert``; both are imported only when needed. Nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("yolo9")
