"""Resolve user spellings of a model (``YOLO9s``, ``yolo9-s``, ``LibreYOLO9s.pt``) to family and size.

A name is normalised (lower case; a weights suffix, ``-``, ``_``, ``.`` and spaces removed) and
looked up in a table built from every family's ``name_patterns`` plus ``{family}{size}``, and
from each size's published weights file: its file name (``LibreResNet18-cls.pt``), the other
names the registry gives it (``yolo_nas_s_coco.pth``) and their short forms without ``Libre``
(``ResNet18-cls.pt``, ``DFINEn.pt``). Two models producing the same normalised name is a registry
error, so resolution never guesses.
"""

from __future__ import annotations

import difflib
import re
from pathlib import PurePath
from typing import Mapping

from zoo_core.errors import ModelNameError, RegistryError
from zoo_core.registry import FamilyDeclaration

__all__ = ["WEIGHT_SUFFIXES", "normalise_name", "published_names", "name_table", "resolve_model_name", "canonical_name"]

WEIGHT_SUFFIXES = (".pt", ".pth", ".safetensors")


def normalise_name(name: str) -> str:
    """The comparison key of a spelling: file stem, lower case, without separators."""
    stem = PurePath(name).name
    for suffix in WEIGHT_SUFFIXES:
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return re.sub(r"[-_.\s]", "", stem.lower())


def canonical_name(family: str, size: str) -> str:
    """The name zoo prints for a model: ``family-size`` (``yolo9-t``, ``resnet-18``)."""
    return f"{family}-{size}"


_PUBLISHER_PREFIX = "libre"  # LibreYOLO's file names start with it; the short form leaves it out


def published_names(declaration: FamilyDeclaration, size: str) -> list[str]:
    """The file names that mean ``size``'s published weights: the file's own, the registry's ``names``, and the
    short form of each that starts with ``Libre`` (``LibreDFINEn.pt`` and ``DFINEn.pt``); [] when none is published."""
    source = declaration.size(size).weights
    if source is None:
        return []
    names = [source.file_name, *source.names]
    short = [name[len(_PUBLISHER_PREFIX):] for name in names if name.lower().startswith(_PUBLISHER_PREFIX)]
    return [*names, *short]


def name_table(families: Mapping[str, FamilyDeclaration]) -> dict[str, tuple[str, str]]:
    """Every normalised spelling of every declared model, mapped to ``(family, size)``."""
    table: dict[str, tuple[str, str]] = {}
    for declaration in families.values():
        patterns = ["{family}{size}", *declaration.name_patterns]
        for size in declaration.sizes:
            spellings = [pattern.replace("{family}", declaration.name).replace("{size}", size) for pattern in patterns]
            for spelling in [*spellings, *published_names(declaration, size)]:
                key = normalise_name(spelling)
                owner = table.setdefault(key, (declaration.name, size))
                if owner != (declaration.name, size):
                    raise RegistryError(
                        f"the name {key!r} resolves to both {canonical_name(*owner)} and "
                        f"{canonical_name(declaration.name, size)}; make one family's name_patterns (or weights "
                        "names) distinct"
                    )
    return table


def resolve_model_name(name: str, families: Mapping[str, FamilyDeclaration]) -> tuple[str, str]:
    """``(family, size)`` for a user spelling; ``ModelNameError`` with close matches if none."""
    table = name_table(families)
    key = normalise_name(name)
    if key in table:
        return table[key]
    if key in families:
        sizes = ", ".join(canonical_name(key, size) for size in families[key].sizes)
        raise ModelNameError(f"{name!r} names the family {key!r} but no size; choose one of: {sizes}")
    close = difflib.get_close_matches(key, list(table), n=3, cutoff=0.6)
    suggestions = sorted({canonical_name(*table[match]) for match in close})
    hint = f" Did you mean {', '.join(suggestions)}?" if suggestions else ""
    raise ModelNameError(
        f"{name!r} is neither an existing weights file nor a known model name.{hint} "
        "`zoo list` shows every family and size."
    )
