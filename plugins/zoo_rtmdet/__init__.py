"""The RTMDet family plugin (detection): the `rtmdet` entry of registry.yaml.

The architecture lives in the sibling modules ``model`` (network), ``loss`` (dynamic soft-label
assignment, quality focal loss + GIoU) and ``convert`` (LibreYOLO / mmdetection checkpoint keys),
imported only when needed; nothing here imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("rtmdet")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """LibreYOLO's and mmdetection's RTMDet keys (``zoo_rtmdet.convert``)."""
    if family != "rtmdet":
        return None
    from zoo_rtmdet.convert import convert

    return convert(size, state_dict, source, target)
