"""Where zoo keeps files it owns: the cache (``ZOO_HOME``) for downloads and built-in datasets."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["zoo_home"]


def zoo_home() -> Path:
    """The cache directory: ``$ZOO_HOME``, else ``~/.cache/zoo``. Created on first use by callers."""
    configured = os.environ.get("ZOO_HOME")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "zoo"
