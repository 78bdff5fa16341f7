"""Tasks: what is the same for every family of one task (data, batches, default loss, metrics).

``get_task(name)`` imports the task module on first use; the contract is in ``base.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zoo_core.tasks.base import Task

__all__ = ["TASK_CLASSES", "get_task"]

TASK_CLASSES = {
    "detect": "zoo_core.tasks.detect:DetectTask",
    "points": "zoo_core.tasks.points:PointsTask",
    "classify": "zoo_core.tasks.classify:ClassifyTask",
    "semantic": "zoo_core.tasks.semantic:SemanticTask",
    "restore": "zoo_core.tasks.restore:RestoreTask",
}


def get_task(name: str) -> "Task":
    """A fresh ``Task`` instance for ``name`` (``detect``, ``points``, ``classify``, ``semantic``, ``restore``)."""
    try:
        reference = TASK_CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; tasks are {', '.join(TASK_CLASSES)}") from None
    module_name, class_name = reference.split(":")
    return getattr(importlib.import_module(module_name), class_name)()
