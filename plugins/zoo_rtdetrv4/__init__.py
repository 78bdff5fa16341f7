"""The RT-DETRv4 family plugin (detection): its declaration is the `rtdetrv4` entry of registry.yaml.

The model is assembled by ``zoo_core.detr.distribution_detr`` in the sibling module ``model``;
``convert`` maps LibreYOLO checkpoints. Both are imported only when needed: nothing here imports torch.
"""

from __future__ import annotations

from typing import Any, Mapping

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import FamilyDeclaration, builtin_families

__all__ = ["zoo_families", "convert_weights"]


@hookimpl
def zoo_families() -> list[FamilyDeclaration]:
    """Declare the `rtdetrv4` family from registry.yaml."""
    return builtin_families("rtdetrv4")


@hookimpl
def convert_weights(family: str, size: str, state_dict: Mapping[str, Any], source: str, target: str) -> dict[str, Any] | None:
    """LibreYOLO 1.6.0 (and official, same names) weights → zoo keys, and zoo → LibreYOLO keys (``save(format="libreyolo")``)."""
    if family != "rtdetrv4":
        return None
    from zoo_rtdetrv4 import convert

    if source in ("libreyolo", "upstream") and target == "zoo":
        return convert.from_libreyolo(size, state_dict)
    if source == "zoo" and target == "libreyolo":
        return convert.to_libreyolo(size, state_dict)
    return None
