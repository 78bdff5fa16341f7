"""The ``device`` argument: parsing its grammar and resolving it against what torch can see.

Accepted forms (docs/multi-gpu.md): ``"0,1"``, ``[0, 1]``, ``0``, ``"cuda:0"``, ``"cuda"``, ``"cpu"``,
``"mps"``, ``"auto"`` (or None), and CPU ranks ``"cpu,cpu"`` / ``["cpu", "cpu"]`` — N entries mean
N ranks. CUDA indices are logical indices into ``CUDA_VISIBLE_DEVICES`` when it is set (E18).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from zoo_core.errors import DeviceSpecError, excerpt

__all__ = ["ACCEPTED_FORMS", "DevicePlan", "parse_device", "resolve_device_plan"]

ACCEPTED_FORMS = (
    "accepted forms: '0,1', [0, 1], 0, 'cuda:0', 'cuda', 'cpu', 'cpu,cpu' (CPU ranks), ['cpu', 'cpu'], 'mps', 'auto'"
)

DeviceKind = Literal["cpu", "cuda", "mps", "auto"]


@dataclass(frozen=True)
class DevicePlan:
    """What ``device`` asks for: a kind and one entry per rank.

    ``cuda_indices`` holds the logical CUDA index of each rank (empty for CPU and MPS);
    ``world_size`` is the number of ranks (processes) the request means.
    """

    kind: DeviceKind
    world_size: int = 1
    cuda_indices: tuple[int, ...] = ()

    @property
    def multi_device(self) -> bool:
        """True when the request means one process per device (spawn, or torchrun)."""
        return self.world_size > 1

    def torch_device(self, local_rank: int = 0) -> Any:
        """The ``torch.device`` of ``local_rank``."""
        import torch

        if self.kind == "cuda":
            return torch.device("cuda", self.cuda_indices[local_rank])
        return torch.device(self.kind)


def _bad(spec: Any, why: str) -> DeviceSpecError:
    return DeviceSpecError(f"device={excerpt(spec)}: {why}; {ACCEPTED_FORMS}")


def _index(text: str) -> int | None:
    """``text`` as a device index if it is ASCII digits only, else None.

    Not ``str.isdigit``: it is true for superscripts and other Unicode digits (``'²'``) that ``int``
    refuses, and a raw ``ValueError`` would escape the parser.
    """
    return int(text) if text.isascii() and text.isdigit() else None


def _entry_kind(entry: Any, spec: Any) -> tuple[str, int | None]:
    """One list entry as ``(kind, index)``: ``("cuda", 1)``, ``("cpu", None)``, ``("mps", None)``."""
    if isinstance(entry, bool):
        raise _bad(spec, f"{excerpt(entry)} is not a device")
    if isinstance(entry, int):
        if entry < 0:
            raise _bad(spec, f"CUDA index {entry} is negative")
        return "cuda", entry
    if not isinstance(entry, str):
        raise _bad(spec, f"{excerpt(entry)} ({type(entry).__name__}) is not a device")
    text = entry.strip().lower()
    if _index(text) is not None:
        return "cuda", _index(text)
    if text in ("cpu", "mps"):
        return text, None
    if text == "cuda":
        return "cuda", 0
    if text.startswith("cuda:") and _index(text[5:]) is not None:
        return "cuda", _index(text[5:])
    raise _bad(spec, f"unknown device spelling {excerpt(entry)}")


def parse_device(spec: Any) -> DevicePlan:
    """Parse ``spec`` without looking at the hardware; ``DeviceSpecError`` if it is malformed."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("", "auto")):
        return DevicePlan("auto")
    if isinstance(spec, (list, tuple)):
        entries = list(spec)
    elif isinstance(spec, str):
        entries = [part for part in spec.split(",")]
        if any(not part.strip() for part in entries):
            raise _bad(spec, "has an empty entry")
    else:
        entries = [spec]
    if not entries:
        raise _bad(spec, "is empty")
    parsed = [_entry_kind(entry, spec) for entry in entries]
    kinds = {kind for kind, _ in parsed}
    if len(kinds) > 1:
        raise _bad(spec, f"mixes device kinds ({', '.join(sorted(kinds))}); all ranks must be one kind")
    (kind,) = kinds
    if kind == "cuda":
        indices = tuple(index for _, index in parsed if index is not None)
        duplicates = sorted({index for index in indices if indices.count(index) > 1})
        if duplicates:
            raise _bad(spec, f"lists CUDA device {duplicates[0]} more than once")
        return DevicePlan("cuda", len(indices), indices)
    if kind == "mps" and len(parsed) > 1:
        raise _bad(spec, "MPS has one device; use device='mps'")
    return DevicePlan(kind, len(parsed))  # type: ignore[arg-type]


def resolve_device_plan(spec: Any, *, cuda_count: int | None = None, mps_available: bool | None = None) -> DevicePlan:
    """Parse ``spec`` and check it against the visible devices; ``auto`` picks cuda:0, mps or cpu.

    ``cuda_count``/``mps_available`` default to what torch reports (arguments for tests).
    """
    plan = parse_device(spec)
    if cuda_count is None or mps_available is None:
        import torch

        if cuda_count is None:
            cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if mps_available is None:
            mps_backend = getattr(torch.backends, "mps", None)
            mps_available = bool(mps_backend and mps_backend.is_available())
    if plan.kind == "auto":
        if cuda_count:
            return DevicePlan("cuda", 1, (0,))
        return DevicePlan("mps" if mps_available else "cpu")
    if plan.kind == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (logical indices into CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        if cuda_count == 0:
            raise _bad(spec, "torch sees no CUDA device; use 'cpu' (or 'cpu,cpu' for CPU ranks)")
        beyond = [index for index in plan.cuda_indices if index >= cuda_count]
        if beyond:
            raise _bad(spec, f"CUDA index {beyond[0]} is beyond the {cuda_count} visible device(s) 0..{cuda_count - 1}{where}")
    if plan.kind == "mps" and not mps_available:
        raise _bad(spec, "MPS is not available on this machine")
    return plan
