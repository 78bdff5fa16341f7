"""The YOLOv9 end-to-end (NMS-free) family plugin (detection): the `yolo9_e2e` entry of registry.yaml.

The GELAN backbone and neck are the `yolo9` family's (``zoo_core.nn.gelan``); the sibling module
``model`` adds the one-to-one head and the NMS-free postprocess, ``convert`` (the registry's
``converter``) maps LibreYOLO checkpoints (extending GELAN's key rules, ``zoo_core.nn.gelan_keys``).
Both are imported only when needed; nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("yolo9_e2e")
