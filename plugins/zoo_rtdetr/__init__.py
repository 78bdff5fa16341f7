"""The RT-DETR family plugin (detection): its declaration is the `rtdetr` entry of registry.yaml.

The architecture lives in the sibling modules ``model`` and ``presnet`` (the DETR core in
``zoo_core.detr``), the checkpoint key mapping in ``convert``; they are imported only when
needed, so nothing here imports torch.
"""

from __future__ import annotations

from typing import Any, Mapping

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import FamilyDeclaration, builtin_families

__all__ = ["zoo_families", "convert_weights"]


@hookimpl
def zoo_families() -> list[FamilyDeclaration]:
    """Declare the `rtdetr` family from registry.yaml."""
    return builtin_families("rtdetr")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Mapping[str, Any], source: str, target: str) -> dict[str, Any] | None:
    """LibreYOLO 1.6.0 weights → zoo keys, and zoo → LibreYOLO keys (``save(format="libreyolo")``)."""
    if family != "rtdetr":
        return None
    from zoo_rtdetr import convert

    if source in ("libreyolo",) and target == "zoo":
        return convert.from_libreyolo(size, state_dict)
    if source == "zoo" and target == "libreyolo":
        return convert.to_libreyolo(size, state_dict)
    return None
