"""The YOLOv9 family plugin: registry.yaml's `yolo9` (detection) and `yolo9_seg` (instance segmentation).

The architectures live in the sibling modules ``model`` and ``segment`` (the segmenter builds on
the detector) and the foreign weight layouts in ``convert``; all are imported only when needed.
Nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("yolo9", "yolo9_seg")
