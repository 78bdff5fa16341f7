"""The distributed training engine: ``fit(spec, arguments, manager=...) -> FitOutcome``.

``fit`` (``fitting.py``) is the one entry point: it chooses one device, torchrun or spawn (the
generic process supervisor is ``launcher.py``; what crosses process boundaries is ``spec.py``),
and every rank runs ``rank.run_rank``, which hands the loop to ``trainer.Trainer``. What is family-specific comes from the family's
``TrainingRecipe`` (``recipe.py``: forward pass, parameter groups and optimizer (``optim.py``),
schedule (``schedule.py``), EMA (``ema.py``), events). The other modules are pieces of the loop:
``distributed`` (process group, collectives), ``sync_batchnorm``, ``precision`` (AMP), ``autobatch``, ``seeding``,
``checkpoint``, ``resume``, ``callbacks``, ``freezing``, ``progress``, ``validation``, ``multi_scale``, ``host_exchange``;
the training figures are drawn by ``zoo_core/reports``. docs/architecture.md describes the whole,
docs/multi-gpu.md is the user's guide.

Nothing here imports the facade: the engine receives a ``ModelSpec`` and returns a
``FitOutcome``; the caller applies it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fit", "ModelSpec", "FitOutcome", "TrainResult", "EpochReport", "TrainingRecipe", "RunInfo"]

_LAZY = {
    "fit": "zoo_core.engine.fitting",
    "ModelSpec": "zoo_core.engine.spec",
    "FitOutcome": "zoo_core.engine.spec",
    "TrainResult": "zoo_core.engine.train_result",
    "EpochReport": "zoo_core.engine.train_result",
    "TrainingRecipe": "zoo_core.engine.recipe",
    "RunInfo": "zoo_core.engine.recipe",
}


def __getattr__(name: str) -> Any:
    # Lazy: ``zoo_core.engine.spec`` and friends import torch; importing the package must not.
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'zoo_core.engine' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
