"""The DEIMv2 family plugin (detection): the `deimv2` entry of registry.yaml.

The architecture lives in the sibling modules (``model`` and its parts), the published training
recipe in ``recipe`` and the LibreYOLO/official key layout in ``convert``; all are imported only
when needed: nothing here imports torch.
"""

from __future__ import annotations

from typing import Any, Mapping

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families", "convert_weights"]

zoo_families = declared_in_registry("deimv2")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Mapping[str, Any], source: str, target: str) -> dict[str, Any] | None:
    """LibreYOLO 1.6 weights (the official release's names too) → zoo keys, and zoo → LibreYOLO keys."""
    if family != "deimv2":
        return None
    from zoo_deimv2 import convert

    if source in ("libreyolo", "upstream") and target == "zoo":
        return convert.from_libreyolo(size, state_dict)
    if source == "zoo" and target == "libreyolo":
        return convert.to_libreyolo(size, state_dict)
    return None
