"""Hook specifications: the reference for plugin authors.

A plugin is a module (or object) with functions marked ``@hookimpl`` whose names match the
specifications below. Each family is its own plugin, registered under its family name; a plugin
may also add tasks (``zoo_tasks``). zoo's core implements every hook ``trylast`` by answering from
the declarations, so a plugin only implements a hook where it means to override that answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import pluggy

if TYPE_CHECKING:
    import torch

    from zoo_core.building import ConvertedWeights
    from zoo_core.engine.recipe import TrainingRecipe

__all__ = [
    "PROJECT_NAME",
    "hookspec",
    "hookimpl",
    "zoo_tasks",
    "zoo_families",
    "build_model",
    "default_sync_bn",
    "supports_spawn",
    "training_recipe",
    "convert_weights",
]

PROJECT_NAME = "zoo"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def zoo_tasks() -> list[Any]:
    """Return the tasks this plugin adds: a list of dicts or ``TaskDeclaration`` objects.

    Called once, when the plugin manager loads, before any family declaration is checked. Each
    declaration names the task, its ``Task`` subclass as ``"module:Class"`` (imported only when a
    model of the task is built, trained or run) and whether its models predict classes and take
    rectangular inputs (docs/registry.md); the class states the rest (``zoo_core/tasks/base.py``).
    It must be cheap: data only, no torch import. The core answers with the built-in tasks of
    registry.yaml; a task name declared twice is an error naming both plugins.
    """


@hookspec
def zoo_families() -> list[Any]:
    """Return this plugin's family declarations: a list of dicts or ``FamilyDeclaration`` objects.

    Called once, when the plugin manager loads. Each declaration has the schema of a
    registry.yaml entry (docs/registry.md) plus its ``name``. It must be cheap: data only, no
    torch import. A family name declared by two plugins is an error naming both.
    """


@hookspec(firstresult=True)
def build_model(family: str, size: str, num_classes: int, options: dict[str, Any]) -> Any:
    """Return a freshly initialised ``torch.nn.Module`` for ``family`` at ``size``, or None.

    ``num_classes`` is the number of output classes; ``options`` holds extra builder keyword
    arguments from the caller (may be empty). firstresult: the first non-None answer wins; the
    core answers last by calling the declared ``builder`` ("module:function") with a
    ``BuildRequest``. Import torch and the architecture inside this function, never at the
    plugin's top level. Must not download anything.
    """


@hookspec(firstresult=True)
def default_sync_bn(family: str) -> bool | None:
    """Return whether DDP training of ``family`` converts BatchNorm to SyncBatchNorm by default.

    Used when ``train(sync_bn=None)``. firstresult; the core answers last with the family's
    declared ``sync_bn``. A policy plugin returning False for every family switches it off
    everywhere.
    """


@hookspec(firstresult=True)
def supports_spawn(family: str) -> bool | None:
    """Return whether ``train(device=[...])`` may spawn one worker per device for ``family``.

    firstresult; the core answers last with the family's declared ``spawn`` (False when not
    declared). A family without spawn support trains on several devices only under torchrun.
    """


@hookspec(firstresult=True)
def training_recipe(family: str, size: str) -> "TrainingRecipe | None":
    """Return the ``TrainingRecipe`` the trainer follows for ``family`` at ``size``, or None.

    Called once per training run, on every rank. The recipe answers everything family-specific
    the trainer asks (``zoo_core/engine/recipe.py``): the training forward pass, parameter groups
    and optimizer, the per-iteration learning-rate schedule, the EMA, the input-size multiple,
    augmentation settings and training events. firstresult; the core answers last with an
    instance of the family's declared ``recipe`` class (``"module:Class"``), else of
    ``TrainingRecipe``, built as ``Class(declaration, size)``. Import torch and the recipe's
    module inside this function, never at the plugin's top level.
    """


@hookspec(firstresult=True)
def convert_weights(
    family: str, size: str, state_dict: Mapping[str, "torch.Tensor"], source: str, target: str
) -> "dict[str, torch.Tensor] | ConvertedWeights | None":
    """Return ``state_dict`` converted from the ``source`` layout to ``target``, or None if not handled.

    Layouts: ``"zoo"`` (the family's own keys), ``"libreyolo"`` (a LibreYOLO checkpoint's
    ``model``), ``"upstream"`` (the family's official release), ``"timm"``, ``"torchvision"``.
    Loading a foreign file asks ``target="zoo"``; ``save(format="libreyolo")`` asks
    ``source="zoo", target="libreyolo"``. Return a plain dict, or a
    ``zoo_core.building.ConvertedWeights`` when the file also decides builder options or the size
    (a class tower width, a block layout). The result is loaded strictly: every tensor must find
    its place. Keep it a pure mapping of keys and tensors (no model build, no download).
    firstresult; the core has no answer: without a converter only files in the family's own
    keys load.
    """
