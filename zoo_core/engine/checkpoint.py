"""Checkpoint writing off the training thread (DESIGN.md E16: atomic, never half a file).

The checkpoint is serialised on the training thread — a consistent snapshot — and the bytes are
written by a background thread: temp file, fsync, ``os.replace``, then hard links for
``best.pt``/``epochN.pt``. Disk time (hundreds of MB for large models) overlaps the next epoch.
"""

from __future__ import annotations

import threading
from pathlib import Path

from zoo_core.weights import atomic_link_or_copy, atomic_write_bytes

__all__ = ["CheckpointWriter"]


class CheckpointWriter:
    """One background write at a time; ``wait()`` re-raises a failed write on the training thread."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, data: bytes, last: Path, also: list[Path]) -> None:
        """Write ``data`` to ``last`` atomically, then give each path of ``also`` the same content."""
        self.wait()

        def write() -> None:
            try:
                atomic_write_bytes(data, last)
                for path in also:
                    atomic_link_or_copy(last, path)
            except BaseException as error:  # surfaced by wait()
                self._error = error

        self._thread = threading.Thread(target=write, name="zoo-checkpoint-writer", daemon=False)
        self._thread.start()

    def wait(self) -> None:
        """Block until the pending write is on disk; raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
