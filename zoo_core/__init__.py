"""zoo: a vision model zoo with a DDP training engine and pluggy family plugins.

``from zoo_core import LibreYOLO`` is the entry point for users; ``hookimpl`` is what plugin
authors mark their hooks with. Importing this package is cheap: torch and the engine load on
first use of ``LibreYOLO``.
"""

from __future__ import annotations

from typing import Any

from zoo_core.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "hookimpl",
    "LibreYOLO",
    "TrainResult",
    "TrainingRecipe",
    "get_plugin_manager",
    "prepare_workers",
    "register_plugin",
    "sample_image",
]

_LAZY = {
    "LibreYOLO": "zoo_core.facade",
    "TrainResult": "zoo_core.engine.train_result",
    "TrainingRecipe": "zoo_core.engine.recipe",
    "get_plugin_manager": "zoo_core.plugin_manager",
    "prepare_workers": "zoo_core.engine.launcher",
    "register_plugin": "zoo_core.plugin_manager",
    "sample_image": "zoo_core.paths",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'zoo_core' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
