"""The YOLOX family plugin (detection): the `yolox` entry of registry.yaml.

The architecture lives in the sibling modules ``model`` (network), ``loss`` (SimOTA loss) and
``convert`` (LibreYOLO / official checkpoint keys), imported only when needed; nothing here
imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("yolox")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """LibreYOLO's and the official release's YOLOX keys (``zoo_yolox.convert``)."""
    if family != "yolox":
        return None
    from zoo_yolox.convert import convert

    return convert(size, state_dict, source, target)
