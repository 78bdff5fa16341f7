"""The PP-LiteSeg family plugin (semantic segmentation): its declaration is the `ppliteseg` entry of registry.yaml.

The architecture lives in the sibling module ``model``, its training loss in ``loss`` and the
checkpoint key mapping in ``convert``; they are imported only when a model is built or a
file converted, so nothing here imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("ppliteseg")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """PP-LiteSeg keys between zoo and LibreYOLO / the upstream release (``zoo_ppliteseg.convert``)."""
    if family != "ppliteseg":
        return None
    from zoo_ppliteseg.convert import convert

    return convert(state_dict, source, target)
