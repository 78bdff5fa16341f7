"""The NAFNet (restoration) family plugin: the `nafnet` entry of registry.yaml.

The architecture lives in the sibling module ``model``; the foreign weight layouts in ``convert``, imported only when a file is converted.
Nothing here imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("nafnet")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """The official release's (and LibreYOLO's) NAFNet keys (``zoo_nafnet.convert``)."""
    if family != "nafnet":
        return None
    from zoo_nafnet.convert import convert

    return convert(state_dict, source, target)
