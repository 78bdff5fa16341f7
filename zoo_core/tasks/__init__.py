"""Tasks: what is the same for every family of one task (data, batches, default loss, metrics).

A task is one module here (its ``Task`` subclass states the task's facts, ``base.py``) and one
declaration: registry.yaml's ``tasks`` for the built-in ones, a plugin's ``zoo_tasks`` hook for
others. ``get_task(name)`` finds the declaration through the plugin manager and imports the
task's module on first use; ``task_of_family(family, size)`` is that task running the family's
input pipeline.
"""

from __future__ import annotations

import pkgutil
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from zoo_core.plugin_manager import ZooPluginManager
    from zoo_core.registry import FamilyDeclaration, InputPipeline
    from zoo_core.tasks.base import Task

__all__ = ["get_task", "task_of_family"]


def get_task(name: str, *, manager: "ZooPluginManager | None" = None, input_pipeline: "InputPipeline | None" = None,
             **thresholds: Any) -> "Task":
    """A fresh ``Task`` for the task ``name``, declared to ``manager`` (default: the process-wide one).

    ``input_pipeline`` is the family's (``FamilyDeclaration.input_pipeline_of``); None: the task's
    default. ``thresholds`` (``conf``, ``iou``, ``max_det``...) reach the task when it takes them
    (its ``thresholds``) and are not None; the others are dropped, so callers may pass them for any task.
    """
    from zoo_core.errors import PluginError
    from zoo_core.plugin_manager import get_plugin_manager
    from zoo_core.tasks.base import Task

    declaration = (manager or get_plugin_manager()).task(name)
    task_class = pkgutil.resolve_name(declaration.implementation)
    if not (isinstance(task_class, type) and issubclass(task_class, Task)):
        raise PluginError(f"task {name!r} declares {declaration.implementation!r}, which is not a zoo_core.tasks.base.Task "
                        "subclass")
    taken = {key: value for key, value in thresholds.items() if key in task_class.thresholds and value is not None}
    return task_class(declaration=declaration, input_pipeline=input_pipeline, **taken)


def task_of_family(family: "FamilyDeclaration", size: str, *, pipeline_changes: Mapping[str, Any] | None = None,
                   manager: "ZooPluginManager | None" = None, **thresholds: Any) -> "Task":
    """The task of ``family`` at ``size``, running the family's input pipeline for that size (its declaration, else
    the task's default) with ``pipeline_changes`` (those a weights file records) on top."""
    from zoo_core.plugin_manager import get_plugin_manager

    declaration = (manager or get_plugin_manager()).task(family.task)
    task_class = pkgutil.resolve_name(declaration.implementation)
    pipeline = family.input_pipeline_of(size, task_class.default_input_pipeline).merged(pipeline_changes)
    return get_task(family.task, manager=manager, input_pipeline=pipeline, **thresholds)
