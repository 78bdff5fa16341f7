"""The UNet (semantic segmentation) family plugin: the `unet` entry of registry.yaml.

The architecture lives in the sibling module ``model``; the foreign weight layouts in ``convert``, imported only when a file is converted.
Nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("unet")
