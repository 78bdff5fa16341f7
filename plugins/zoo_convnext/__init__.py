"""The ConvNeXt family plugin: the `convnext` entry of registry.yaml.

The architecture comes from timm through zoo_core's registry-driven builder; the foreign weight layouts in ``convert``, imported only when a file is converted.
Nothing here imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("convnext")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """Torchvision's ConvNeXt keys (``zoo_convnext.convert``)."""
    if family != "convnext":
        return None
    from zoo_convnext.convert import convert

    return convert(state_dict, source, target)
