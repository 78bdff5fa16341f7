"""The FOMO family plugin (centroid detection, task `points`): the `fomo` entry of registry.yaml.

The architecture lives in the sibling modules (``model``, ``recipe``) and the foreign
weight layouts in ``convert``, imported only when needed; nothing here imports torch.
"""

from typing import Any

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("fomo")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Any, source: str, target: str) -> Any:
    """LibreYOLO's FOMO keys (``zoo_fomo.convert``)."""
    if family != "fomo":
        return None
    from zoo_fomo.convert import convert

    return convert(size, state_dict, source, target)
