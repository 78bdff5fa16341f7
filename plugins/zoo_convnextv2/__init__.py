"""The ConvNeXt V2 family plugin: the `convnextv2` entry of registry.yaml.

The architecture comes from timm through zoo_core's registry-driven builder; the foreign weight layouts in ``convert``, imported only when a file is converted.
Nothing here imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("convnextv2")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """The official release's (and LibreYOLO's) ConvNeXt V2 keys (``zoo_convnextv2.convert``)."""
    if family != "convnextv2":
        return None
    from zoo_convnextv2.convert import convert

    return convert(size, state_dict, source, target)
