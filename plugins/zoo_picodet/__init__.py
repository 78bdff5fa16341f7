"""The PP-PicoDet family plugin (detection): the `picodet` entry of registry.yaml.

The architecture lives in the sibling modules (``model``, ``loss``, ``recipe``) and the foreign
weight layouts in ``convert``, imported only when needed; nothing here imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("picodet")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """LibreYOLO's and Bo396543018's (mmdet) PicoDet keys (``zoo_picodet.convert``)."""
    if family != "picodet":
        return None
    from zoo_picodet.convert import convert

    return convert(size, state_dict, source, target)
