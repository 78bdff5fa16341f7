"""Renaming state-dict keys between a foreign layout and zoo's, both ways, from one rule list.

A converter is an ordered list of ``(foreign, zoo)`` template pairs. A template is a dotted key
fragment; ``{name}`` stands for one dotted segment of digits and is carried across, ``^`` and
``$`` anchor the fragment to the start or end of the key. Fragments match whole segments only
(``cv1`` never matches inside ``cv10``). Renaming *to* zoo applies the pairs in order, each to
every key; renaming *from* zoo applies them in reverse order, in reverse direction, so one list
serves loading and writing back and the two directions cannot drift apart.

A key no rule touches keeps its name; two keys renamed to one name are an error.

Two more shapes of converter live here because several families use each:

- ``KeySchema``: for layouts whose names differ module by module rather than by a few fragments
  (PicoDet's and YOLO-NAS's mmdet / super-gradients trees), a schema of module kinds, each
  listing its children as ``(foreign name, zoo name, child kind)``; a key is translated by
  walking it from the root kind, so one table serves both directions;
- ``LayoutConverter``: a family's registry ``converter`` made of two key maps, one reading the
  foreign layouts into zoo's keys and one writing zoo's keys back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Collection, Generic, Mapping, Sequence, TypeVar

__all__ = ["KeyRenamer", "KeySchema", "LayoutConverter", "LEAF", "PARAMETER", "DROPPED", "EACH"]

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


# The child kinds a ``KeySchema`` knows besides the kinds it declares.
LEAF = "leaf"
"""A module holding tensors only (``weight``, ``bias``, BatchNorm statistics): the key ends there."""
PARAMETER = "param"
"""A parameter of its parent: the key ends with the child's own name (``alpha``, a residual scale)."""
DROPPED = "drop"
"""A foreign module zoo has no tensor for (a merged copy the training graph never uses): dropped on import."""
EACH = "each:"
"""Prefix of an indexed list of one kind: ``"each:conv"`` is ``<name>.<index>.<a conv's keys>``."""

_TENSOR_NAMES = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


@dataclass(frozen=True)
class KeySchema:
    """Key translation by walking a schema of module kinds from ``root`` (see the module docstring).

    ``kinds`` maps a kind to its children, each ``(foreign name, zoo name, child kind)``; a child
    kind is another kind of ``kinds``, ``LEAF``, ``PARAMETER``, ``DROPPED`` or ``EACH + kind``.
    A dropped child has no zoo name (None). ``what`` names the modules in errors ("PicoDet
    layer"); ``foreign`` names the other layout ("LibreYOLO"). A key that the schema does not
    describe is a ``KeyError`` naming it, so a converter can tell a file of another layout.
    """

    kinds: Mapping[str, Sequence[tuple[str, str | None, str]]]
    what: str
    foreign: str = "LibreYOLO"
    root: str = "root"

    def key_to_zoo(self, key: str, as_written: str | None = None) -> str | None:
        """``key`` (foreign naming) in zoo's; None for a dropped tensor. ``as_written``: the key as the file has it, for errors."""
        return self._translate(key, self.root, True, as_written or key)

    def key_from_zoo(self, key: str) -> str | None:
        """``key`` (zoo naming) in the foreign one."""
        return self._translate(key, self.root, False, key)

    def to_zoo(self, state_dict: Mapping[str, T]) -> dict[str, T]:
        """``state_dict`` (foreign keys) in zoo's keys, dropped tensors left out."""
        return self._renamed(state_dict, self.key_to_zoo)

    def from_zoo(self, state_dict: Mapping[str, T]) -> dict[str, T]:
        """``state_dict`` (zoo's keys) in the foreign keys."""
        return self._renamed(state_dict, self.key_from_zoo)

    @staticmethod
    def _renamed(state_dict: Mapping[str, T], rename: Callable[[str], str | None]) -> dict[str, T]:
        renamed: dict[str, T] = {}
        for key, value in state_dict.items():
            new_key = rename(key)
            if new_key is not None:
                renamed[new_key] = value
        return renamed

    def _translate(self, rest: str, kind: str, to_zoo: bool, full_key: str) -> str | None:
        """``rest`` (the key below a module of ``kind``) in the other naming; None for a dropped tensor."""
        if kind == LEAF:
            if rest not in _TENSOR_NAMES:
                raise KeyError(f"unexpected tensor name {rest!r} in key {full_key!r}")
            return rest
        for foreign, zoo, child in self.kinds[kind]:
            source, target = (foreign, zoo) if to_zoo else (zoo, foreign)
            if source is None:  # a dropped child has no zoo name to match
                continue
            if child == PARAMETER:
                if rest == source:
                    return target
                continue
            if not rest.startswith(source + "."):
                continue
            if child == DROPPED:
                return None
            tail = rest[len(source) + 1 :]
            if child.startswith(EACH):
                index, _, tail = tail.partition(".")
                if not index.isdigit():
                    raise KeyError(f"expected an index after {source!r} in key {full_key!r}")
                target, child = f"{target}.{index}", child[len(EACH) :]
            inner = self._translate(tail, child, to_zoo, full_key)
            return None if inner is None else f"{target}.{inner}"
        raise KeyError(f"key {full_key!r} matches no {self.what} ({self.foreign if to_zoo else 'zoo'} naming)")


@dataclass(frozen=True)
class LayoutConverter(Generic[T]):
    """A family's registry ``converter`` from two key maps of signature ``(size, state_dict) -> state_dict``.

    Called as ``converter(size, state_dict, source, target)``: ``to_zoo`` for a ``source`` in
    ``reads`` and ``target`` ``"zoo"``, ``from_zoo`` for ``source`` ``"zoo"`` and a ``target`` in
    ``writes``, None for any other pair (the ``convert_weights`` hook's "not handled"). The
    default layouts are those of the DETR families: LibreYOLO's names, which the official
    releases share, read; LibreYOLO's written.
    """

    to_zoo: Callable[[str, Mapping[str, T]], dict[str, T]]
    from_zoo: Callable[[str, Mapping[str, T]], dict[str, T]]
    reads: Collection[str] = ("libreyolo", "upstream")
    writes: Collection[str] = ("libreyolo",)

    def __call__(self, size: str, state_dict: Mapping[str, T], source: str, target: str) -> dict[str, T] | None:
        """``state_dict`` from layout ``source`` to ``target``; None for a pair this converter does not handle."""
        if target == "zoo" and source in self.reads:
            return self.to_zoo(size, state_dict)
        if source == "zoo" and target in self.writes:
            return self.from_zoo(size, state_dict)
        return None
