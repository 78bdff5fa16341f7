"""Data errors and warnings: what is wrong with a dataset, with the file (and line) that says so.

Policy (docs/data.md, "Bad data"):

- A dataset that cannot be used at all (a missing path, a YAML without ``names``, a split with
  no usable sample) raises ``DatasetError``, whose message names the path and the fix.
- A bad item inside a usable dataset (an unreadable or truncated image, a label line with the
  wrong number of fields, a class id outside ``names``, coordinates outside [0, 1], a mask
  value outside the classes) is skipped and reported as a ``DatasetWarning`` through the
  ``warnings`` module, naming the file and, for text files, the line. Each problem is reported
  once per process (on rank 0 only under DDP); after ``MAX_REPORTED_PROBLEMS`` individual
  messages per dataset, the rest are counted in one summary warning.
"""

from __future__ import annotations

import os
from pathlib import Path

from zoo_core.errors import ZooError, ZooWarning, warn

__all__ = ["DatasetError", "ImageDecodeError", "DatasetWarning", "ProblemReport", "MAX_REPORTED_PROBLEMS"]

MAX_REPORTED_PROBLEMS = 30


class DatasetError(ZooError, ValueError):
    """A dataset that cannot be used as given; the message names the path and the fix."""


class ImageDecodeError(DatasetError):
    """An image whose header reads but whose pixels do not decode (found only when it is loaded)."""


class DatasetWarning(ZooWarning):
    """A bad item (image, label line, mask) that was skipped; the message names the file and line."""


def _is_primary_process() -> bool:
    """False on DDP ranks other than 0, so a problem is reported once per run, not once per rank."""
    rank = os.environ.get("RANK")
    if rank not in (None, "", "0"):
        return False
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return True
    return not (dist.is_available() and dist.is_initialized() and dist.get_rank() != 0)


class ProblemReport:
    """Collects the problems found while indexing one dataset split and warns about each.

    Use ``add(path, message, line=...)`` for each skipped item and ``finish()`` at the end,
    which emits the summary when more than ``limit`` problems were found.
    """

    #: How many skipped lines ``first_skipped_lines`` keeps, for an error that must say why all of them were skipped.
    kept = 3

    def __init__(self, what: str, limit: int = MAX_REPORTED_PROBLEMS) -> None:
        self.what = what
        self.limit = limit
        self.count = 0
        self.skipped_lines = 0  # problems that name a line: the label lines that were dropped
        self.first_skipped_lines: list[str] = []  # the first few of them, "path:line: message"
        self._primary = _is_primary_process()

    def add(self, path: str | Path, message: str, line: int | None = None) -> None:
        """Record one skipped item: ``path[:line]: message``."""
        self.count += 1
        where = f"{path}:{line}" if line is not None else str(path)
        if line is not None:
            self.skipped_lines += 1
            if len(self.first_skipped_lines) < self.kept:
                self.first_skipped_lines.append(f"{where}: {message}")
        if self._primary and self.count <= self.limit:
            warn(f"{where}: {message}", DatasetWarning)

    def finish(self) -> None:
        """Emit one summary warning for the problems beyond the reporting limit."""
        if self._primary and self.count > self.limit:
            warn(f"{self.what}: {self.count - self.limit} more problems not shown ({self.count} in all); "
                 "each affected item was skipped", DatasetWarning)
