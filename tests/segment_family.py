"""``tinyseg``: ``TinyInstanceSegmenter`` (tests/doubles.py) declared as a family of the segment task, so a
test trains instance segmentation through the engine without a real family.

Registered at run time (``register_plugin("tests.segment_family")``); its training runs in process (``spawn``
false), so no worker has to find it.
"""

from __future__ import annotations

from zoo_core import hookimpl
from zoo_core.building import BuildRequest

from .doubles import TinyInstanceSegmenter

__all__ = ["build_tinyseg"]


@hookimpl
def zoo_families() -> list[dict]:
    return [{
        "name": "tinyseg", "display": "tinyseg", "task": "segment", "builder": "tests.segment_family:build_tinyseg",
        "published_num_classes": 2, "spawn": False,
        "sizes": {"s": {"input_size": 64, "params": 1, "params_source": "segment task tests", "config": {"prototypes": 4}}},
    }]


def build_tinyseg(request: BuildRequest) -> TinyInstanceSegmenter:
    """A ``TinyInstanceSegmenter`` with the request's classes and its size's prototypes."""
    return TinyInstanceSegmenter(request.num_classes, request.config["prototypes"])
