"""Where zoo keeps files it owns: the cache (``ZOO_HOME``) for downloads and built-in datasets."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["zoo_home", "sample_image", "SAMPLE_SEED"]


def zoo_home() -> Path:
    """The cache directory: ``$ZOO_HOME``, else ``~/.cache/zoo``. Created on first use by callers."""
    configured = os.environ.get("ZOO_HOME")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "zoo"


SAMPLE_SEED = 2040  # sample.jpg is the scene zoo_core.data.shapes.render_scene draws from this seed at 320 px


def sample_image() -> Path:
    """A 320×320 JPEG of coloured shapes that ships with zoo, to try ``predict`` on a fresh machine.

    zoo drew it itself: ``render_scene(numpy.random.default_rng(SAMPLE_SEED), 320)`` from
    ``zoo_core.data.shapes``, saved at JPEG quality 90 (tests/test_readme.py checks that).
    """
    return Path(__file__).with_name("assets") / "sample.jpg"
