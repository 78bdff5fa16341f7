"""The YOLOv9 family plugin (detection): the `yolo9` entry of registry.yaml.

The architecture lives in the sibling module ``model`` and the foreign weight layouts in
``convert``; both are imported only when needed. Nothing here imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("yolo9")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """LibreYOLO's and the upstream release's YOLOv9 keys (``zoo_yolo9.convert``)."""
    if family != "yolo9":
        return None
    from zoo_yolo9.convert import convert

    return convert(state_dict, source, target)
