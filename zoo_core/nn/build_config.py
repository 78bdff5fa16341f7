"""A network's config dataclass from registry data and build options, every setting checked.

A family whose architecture settings are one frozen dataclass (the semantic families' ``UNetConfig``,
``SegformerConfig``, ``PPLiteSegConfig``) builds it the same way: the size's registry ``config``
makes the declared config, the caller's build ``options`` override fields of it, and both are
checked first, so a misspelt key or a value of the wrong type is an error naming the field and
where it came from instead of a ``TypeError`` deep in the network.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

from zoo_core.building import BuildRequest
from zoo_core.errors import RegistryError

__all__ = ["checked_config_settings", "config_from_request"]

ConfigT = TypeVar("ConfigT")


def _checked_value(default: Any, value: Any) -> tuple[bool, Any, str]:
    """``(ok, value as the field stores it, what the field takes)`` for one setting."""
    if isinstance(default, tuple):
        # YAML gives lists: a sequence of the items' type is accepted, stored as a tuple.
        numbers = isinstance(default[0], float)
        item_types = (int, float) if numbers else (int,)
        ok = isinstance(value, (list, tuple)) and all(type(item) in item_types for item in value)
        if ok:
            value = tuple(float(item) for item in value) if numbers else tuple(value)
        return ok, value, "a list of numbers" if numbers else "a list of ints"
    if isinstance(default, float):
        ok = type(value) in (int, float)  # an int is a float setting's whole number
        return ok, float(value) if ok else value, "float"
    # An exact type check: bool is an int subclass, and True is no channel count.
    return type(value) is type(default), value, type(default).__name__


def checked_config_settings(config_class: type, values: Mapping[str, Any], where: str, *, what: str) -> dict[str, Any]:
    """``values`` checked against the fields of the dataclass ``config_class``, ready for it.

    Every key must be a field and every value of the field's type (ints are accepted for float
    fields, lists for tuple fields); a ValueError names ``where``, ``what`` (the family's
    published name) and the key otherwise.
    """
    defaults = {field.name: field.default for field in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - set(defaults))
    if unknown:
        raise ValueError(f"{where}: unknown {what} setting(s) {', '.join(unknown)}; known settings: {', '.join(defaults)}")
    checked: dict[str, Any] = {}
    for key, value in values.items():
        ok, checked_value, expected = _checked_value(defaults[key], value)
        if not ok:
            raise ValueError(f"{where}: {what} setting {key!r} must be {expected} (like {defaults[key]!r}), got {value!r}")
        checked[key] = checked_value
    return checked


def config_from_request(config_class: type[ConfigT], request: BuildRequest, *, what: str) -> ConfigT:
    """The size's config: ``request.config`` (registry) overridden by ``request.options`` (caller).

    A bad registry config is a ``RegistryError`` (the declaration is at fault), a bad option a
    ValueError naming it; either names the family and size.
    """
    where = f"{request.family}-{request.size}"
    try:
        declared = config_class(**checked_config_settings(config_class, request.config, f"registry config of {where}", what=what))
    except ValueError as error:
        raise RegistryError(f"{error} (docs/registry.md)") from None
    overrides = checked_config_settings(config_class, request.options, f"build options of {where}", what=what)
    return dataclasses.replace(declared, **overrides)  # type: ignore[type-var]
