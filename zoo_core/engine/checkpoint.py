"""Checkpoint writing off the training thread (E16, docs/architecture.md: atomic, never half a file).

The training thread takes a snapshot (every tensor copied to the CPU, so training may go on
changing the originals); a background thread serialises it and writes it: temp file, fsync,
``os.replace``, then hard links for ``best.pt``/``epochN.pt``. Serialisation and disk time
(hundreds of MB for large models) overlap the next epoch.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from zoo_core.weights import DIGEST_KEY, atomic_link_or_copy, atomic_torch_save, weights_digest

__all__ = ["CheckpointWriter", "snapshot"]


def snapshot(value: Any, _copies: dict[int, torch.Tensor] | None = None) -> Any:
    """A copy of ``value`` whose tensors are detached CPU copies (containers copied, scalars shared).

    A tensor reached twice is copied once, so torch.save still stores it once.
    """
    copies = {} if _copies is None else _copies
    if isinstance(value, torch.Tensor):
        if id(value) not in copies:
            copies[id(value)] = value.detach().to("cpu", copy=True)
        return copies[id(value)]
    if isinstance(value, dict):
        return {key: snapshot(item, copies) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(item, copies) for item in value)
    return value


class CheckpointWriter:
    """One background write at a time; ``wait()`` re-raises a failed write on the training thread."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, checkpoint: dict[str, Any], last: Path, also: list[Path]) -> None:
        """Write ``checkpoint`` (a ``snapshot``) to ``last`` atomically, then link each path of ``also`` to it."""
        self.wait()

        def write() -> None:
            try:
                if isinstance(checkpoint.get("meta"), dict) and isinstance(checkpoint.get("model"), dict):
                    # A checksum of the deployable weights, checked whenever the file is loaded.
                    checkpoint["meta"] = {**checkpoint["meta"], DIGEST_KEY: weights_digest(checkpoint["model"])}
                atomic_torch_save(checkpoint, last)
                for path in also:
                    atomic_link_or_copy(last, path)
            except BaseException as error:  # surfaced by wait()
                self._error = error

        self._thread = threading.Thread(target=write, name="zoo-checkpoint-writer", daemon=False)
        self._thread.start()

    def wait(self, *, raise_error: bool = True) -> None:
        """Block until the pending write is on disk; raise its error if it failed (unless ``raise_error`` is False)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            if raise_error:
                raise error
