"""The YOLOv9 end-to-end (NMS-free) family plugin (detection): the `yolo9_e2e` entry of registry.yaml.

The GELAN backbone and neck are the `yolo9` family's (``zoo_core.nn.gelan``); the sibling module
``model`` adds the one-to-one head and the NMS-free postprocess, ``convert`` maps LibreYOLO
checkpoints (extending ``zoo_yolo9.convert``'s key rules). Both are imported only when needed;
nothing here imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("yolo9_e2e")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """LibreYOLO's YOLOv9-E2E keys (``zoo_yolo9_e2e.convert``)."""
    if family != "yolo9_e2e":
        return None
    from zoo_yolo9_e2e.convert import convert

    return convert(size, state_dict, source, target)
