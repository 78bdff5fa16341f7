"""The YOLOv7 family plugin (detection): the `yolo7` entry of registry.yaml.

The architecture lives in the sibling modules ``model`` (network), ``loss`` (ComputeLossOTA) and
``convert`` (LibreYOLO / official checkpoint keys), imported only when needed; nothing here
imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("yolo7")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """LibreYOLO's and the official release's YOLOv7 keys (``zoo_yolo7.convert``)."""
    if family != "yolo7":
        return None
    from zoo_yolo7.convert import convert

    return convert(size, state_dict, source, target)
