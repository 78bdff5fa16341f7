"""Renaming state-dict keys between a foreign layout and zoo's, both ways, from one rule list.

A converter is an ordered list of ``(foreign, zoo)`` template pairs. A template is a dotted key
fragment; ``{name}`` stands for one dotted segment of digits and is carried across, ``^`` and
``$`` anchor the fragment to the start or end of the key. Fragments match whole segments only
(``cv1`` never matches inside ``cv10``). Renaming *to* zoo applies the pairs in order, each to
every key; renaming *from* zoo applies them in reverse order, in reverse direction, so one list
serves loading and writing back and the two directions cannot drift apart.

A key no rule touches keeps its name; two keys renamed to one name are an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence, TypeVar

__all__ = ["KeyRenamer"]

T = TypeVar("T")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _compile(template: str) -> re.Pattern[str]:
    anchored_start, anchored_end = template.startswith("^"), template.endswith("$")
    body = template.strip("^$")
    pattern, position = "", 0
    for match in _PLACEHOLDER.finditer(body):
        pattern += re.escape(body[position:match.start()]) + rf"(?P<{match.group(1)}>\d+)"
        position = match.end()
    pattern += re.escape(body[position:])
    if anchored_start:
        start = "^"
    else:
        start = "" if body.startswith(".") else r"(?:^|(?<=\.))"
    if anchored_end:
        end = "$"
    else:
        end = "" if body.endswith(".") else r"(?=\.|$)"
    return re.compile(start + pattern + end)


def _substitute(template: str) -> str:
    # "{j}" -> "\g<j>" for re.sub; anchors are not part of the replacement.
    return _PLACEHOLDER.sub(r"\\g<\1>", template.strip("^$"))


@dataclass
class KeyRenamer:
    """Bidirectional key renaming by ordered ``(foreign, zoo)`` template pairs (see the module docstring)."""

    pairs: Sequence[tuple[str, str]]
    _forward: list[tuple[re.Pattern[str], str]] = field(init=False, repr=False)
    _backward: list[tuple[re.Pattern[str], str]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._forward = [(_compile(foreign), _substitute(zoo)) for foreign, zoo in self.pairs]
        self._backward = [(_compile(zoo), _substitute(foreign)) for foreign, zoo in reversed(self.pairs)]

    def key_to_zoo(self, key: str) -> str:
        """One foreign key in zoo's naming."""
        for pattern, replacement in self._forward:
            key = pattern.sub(replacement, key)
        return key

    def key_from_zoo(self, key: str) -> str:
        """One zoo key in the foreign naming."""
        for pattern, replacement in self._backward:
            key = pattern.sub(replacement, key)
        return key

    def to_zoo(self, state_dict: Mapping[str, T]) -> dict[str, T]:
        """``state_dict`` with every key renamed to zoo's naming."""
        return self._renamed(state_dict, self.key_to_zoo)

    def from_zoo(self, state_dict: Mapping[str, T]) -> dict[str, T]:
        """``state_dict`` with every key renamed from zoo's naming to the foreign one."""
        return self._renamed(state_dict, self.key_from_zoo)

    @staticmethod
    def _renamed(state_dict: Mapping[str, T], rename: Callable[[str], str]) -> dict[str, T]:
        renamed: dict[str, T] = {}
        origin: dict[str, str] = {}
        for key, value in state_dict.items():
            new_key = rename(key)
            if new_key in renamed:
                raise ValueError(f"renaming maps both {origin[new_key]!r} and {key!r} to {new_key!r}")
            renamed[new_key] = value
            origin[new_key] = key
        return renamed
