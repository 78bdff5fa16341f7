"""The ConvNeXt family plugin: the `convnext` entry of registry.yaml.

The architecture comes from timm through zoo_core's registry-driven builder; the foreign weight layouts in ``convert``, imported only when a file is converted.
Nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("convnext")
