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
import warnings
from pathlib import Path

from zoo_core.errors import ZooError

__all__ = ["DatasetError", "ImageDecodeError", "DatasetWarning", "ProblemReport", "MAX_REPORTED_PROBLEMS"]

MAX_REPORTED_PROBLEMS = 30


class DatasetError(ZooError, ValueError):
    """A dataset that cannot be used as given; the message names the path and the fix."""


class ImageDecodeError(DatasetError):
    """An image whose header reads but whose pixels do not decode (found only when it is loaded)."""


class DatasetWarning(UserWarning):
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

    def __init__(self, what: str, limit: int = MAX_REPORTED_PROBLEMS) -> None:
        self.what = what
        self.limit = limit
        self.count = 0
        self._primary = _is_primary_process()

    def add(self, path: str | Path, message: str, line: int | None = None) -> None:
        """Record one skipped item: ``path[:line]: message``."""
        self.count += 1
        if self._primary and self.count <= self.limit:
            where = f"{path}:{line}" if line is not None else str(path)
            warnings.warn(f"{where}: {message}", DatasetWarning, stacklevel=3)

    def finish(self) -> None:
        """Emit one summary warning for the problems beyond the reporting limit."""
        if self._primary and self.count > self.limit:
            warnings.warn(
                f"{self.what}: {self.count - self.limit} more problems not shown ({self.count} in all); "
                "each affected item was skipped",
                DatasetWarning,
                stacklevel=2,
            )
