"""The plugin manager: finds, blocks, loads and checks family plugins, and answers hooks.

Loading follows pytest's order: find entry points in group ``zoo.plugins`` (metadata only),
drop the blocked ones *before* importing them, import the rest, then ``check_pending()`` so a
misspelt hook is an error rather than a silently ignored function. Then the declarations are
collected: first every plugin's ``zoo_tasks`` (the core declares the built-in tasks), then every
plugin's ``zoo_families``, each checked against the declaration of its task; one task or family
name declared twice is an error naming both plugins and their distributions.

The built-in families are served by zoo-core's own entry points; a built-in that registry.yaml
declares but no entry point served (another distribution's metadata can hide zoo-core's on a
crowded path) is registered from the ``plugin`` module its entry names, so the built-ins never
vanish. Switches (docs/plugins.md): ``ZOO_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points of every
distribution other than ``zoo-core`` (the built-ins stay), ``ZOO_BLOCK_PLUGINS=a,b`` (or
``get_plugin_manager(block=[...])``) blocks plugins by name, case-insensitively (``EVIL`` blocks the
plugin ``evil``: a block that failed over a capital letter would import the very code it was meant
to keep out), ``ZOO_DEBUG=1`` traces hook calls. ``blocked_plugins()`` says what each block stopped.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import pkgutil
import re
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import pluggy

from zoo_core import hookspecs
from zoo_core.building import BuildRequest, ConvertedWeights
from zoo_core.errors import (
    DuplicateFamilyError,
    PluginError,
    PluginHookError,
    PluginImportError,
    UnknownFamilyError,
    UnknownTaskError,
)
from zoo_core.hookspecs import hookimpl
from zoo_core.registry import (
    FamilyDeclaration,
    TaskDeclaration,
    builtin_tasks,
    load_registry,
    validate_declaration,
    validate_task_declaration,
)

if TYPE_CHECKING:
    import torch

    from zoo_core.engine.recipe import TrainingRecipe

_DEFAULT_RECIPE = "zoo_core.engine.recipe:TrainingRecipe"

__all__ = [
    "ENTRY_POINT_GROUP",
    "CORE_DISTRIBUTION",
    "PluginRecord",
    "ZooPluginManager",
    "get_plugin_manager",
    "reset_plugin_manager",
    "register_plugin",
]

ENTRY_POINT_GROUP = "zoo.plugins"
CORE_DISTRIBUTION = "zoo-core"
CORE_PLUGIN_NAME = "zoo-core"
_DISABLE_AUTOLOAD_ENV = "ZOO_DISABLE_PLUGIN_AUTOLOAD"
_BLOCK_ENV = "ZOO_BLOCK_PLUGINS"
_DEBUG_ENV = "ZOO_DEBUG"


@dataclass(frozen=True)
class PluginRecord:
    """Where a loaded plugin came from, for messages and ``zoo plugins``."""

    name: str
    module: str
    distribution: str | None = None  # None: registered at run time from Python
    version: str | None = None

    def describe(self) -> str:
        """``plugin 'x' (distribution dist 1.0)``, the form every error message uses."""
        origin = (
            f"distribution {self.distribution} {self.version}"
            if self.distribution
            else "registered at run time"
        )
        return f"plugin {self.name!r} ({origin})"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def _normalised(distribution: str | None) -> str | None:
    # Distribution names compare case-insensitively with runs of "-", "_" and "." equal (PEP 503).
    return re.sub(r"[-_.]+", "-", distribution).lower() if distribution else None


class _DeclarationAnswers:
    """The core's hook implementations: the built-in tasks, and ``trylast`` answers read from family declarations."""

    def __init__(self, manager: "ZooPluginManager") -> None:
        self._manager = manager

    @hookimpl
    def zoo_tasks(self) -> list[TaskDeclaration]:
        return list(builtin_tasks().values())

    @hookimpl(trylast=True)
    def build_model(self, family: str, size: str, num_classes: int, options: dict[str, Any]) -> Any:
        declaration = self._manager.family(family)
        builder = pkgutil.resolve_name(declaration.builder)
        request = BuildRequest(
            family=family,
            size=size,
            num_classes=num_classes,
            config=declaration.size(size).config,
            declaration=declaration,
            options=options,
        )
        return builder(request)

    @hookimpl(trylast=True)
    def default_sync_bn(self, family: str) -> bool:
        return self._manager.family(family).sync_bn

    @hookimpl(trylast=True)
    def supports_spawn(self, family: str) -> bool:
        return self._manager.family(family).spawn

    @hookimpl(trylast=True)
    def training_recipe(self, family: str, size: str) -> Any:
        declaration = self._manager.family(family)
        # Resolved by name like the builder, at training time only: the recipe imports torch.
        recipe_class = pkgutil.resolve_name(declaration.recipe or _DEFAULT_RECIPE)
        return recipe_class(declaration, size)

    @hookimpl(trylast=True)
    def convert_weights(
        self, family: str, size: str, state_dict: Mapping[str, Any], source: str, target: str
    ) -> "dict[str, Any] | ConvertedWeights | None":
        declaration = self._manager.family(family)
        if declaration.converter is None:
            return None  # only files in the family's own keys load
        # Resolved by name like the builder, when a file is converted only: converters import torch.
        converter = pkgutil.resolve_name(declaration.converter)
        return converter(size, state_dict, source, target)


class ZooPluginManager(pluggy.PluginManager):
    """A pluggy manager that knows zoo's families, where each came from, and how to block plugins."""

    def __init__(self, *, block: Iterable[str] = (), autoload: bool | None = None) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        requested = [*(f"{_BLOCK_ENV}={name}" for name in _env_list(_BLOCK_ENV)), *(f"block={name!r}" for name in block)]
        # Compared case-folded everywhere: plugin names are lower-case by convention, not by rule.
        self.blocked_names: frozenset[str] = frozenset(
            [*(name.casefold() for name in _env_list(_BLOCK_ENV)), *(name.strip().casefold() for name in block)])
        self._block_requests = requested  # as the user spelled them, for `zoo plugins`
        self._stopped: dict[str, list[str]] = {}  # blocked name -> what the block kept out, as it happened
        # Modules a block kept out, so that a sibling family served by the same package does not import it after all.
        self._blocked_modules: dict[str, str] = {}  # module -> the block (case-folded name) that keeps it out
        self.autoload = (not _env_flag(_DISABLE_AUTOLOAD_ENV)) if autoload is None else autoload
        self._records: dict[str, PluginRecord] = {}
        self._tasks: dict[str, TaskDeclaration] = {}
        self._task_owner: dict[str, str] = {}
        self._families: dict[str, FamilyDeclaration] = {}
        self._family_owner: dict[str, str] = {}
        self._runtime_plugins: list[tuple[str, Any]] = []
        for name in self.blocked_names:
            self.set_blocked(name)  # pluggy's own block (exact name); blocks() is the case-insensitive check
        core = _DeclarationAnswers(self)
        self.register(core, name=CORE_PLUGIN_NAME)
        self._collect_tasks(core, PluginRecord(name=CORE_PLUGIN_NAME, module=__name__, distribution=CORE_DISTRIBUTION))
        if _env_flag(_DEBUG_ENV):
            self.trace.root.setwriter(sys.stderr.write)
            self.enable_tracing()

    # ----------------------------------------------------------------------------- blocking
    def blocks(self, name: str | None) -> bool:
        """Whether plugin (or family) ``name`` is blocked, compared case-insensitively."""
        return name is not None and name.casefold() in self.blocked_names

    def _stop(self, name: str, what: str) -> None:
        """Record that the block on ``name`` kept ``what`` out (for ``blocked_plugins`` and ``zoo plugins``)."""
        self._stopped.setdefault(name.casefold(), []).append(what)

    def block_on_module(self, module: str | None) -> str | None:
        """The block (a case-folded name) that kept plugin package ``module`` out, or None when it was not kept out."""
        return self._blocked_modules.get(module) if module is not None else None

    def blocked_plugins(self) -> dict[str, list[str]]:
        """Each blocked name (case-folded) with what its block kept out, never imported; empty: it matched nothing."""
        return {name: list(self._stopped.get(name, [])) for name in sorted(self.blocked_names)}

    @property
    def block_requests(self) -> list[str]:
        """The blocks as they were asked for (``ZOO_BLOCK_PLUGINS=EVIL``, ``block='x'``)."""
        return list(self._block_requests)

    # ----------------------------------------------------------------------------- loading
    def load_entry_point_plugins(self) -> None:
        """Find, filter, import and register every plugin of group ``zoo.plugins``, then check hooks.

        Every plugin is registered before any declaration is collected, so a family may use a task
        that another plugin declares, whatever the order of the entry points.
        """
        loaded: list[tuple[Any, PluginRecord]] = []
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            distribution = entry_point.dist.name if entry_point.dist else None
            record = PluginRecord(
                name=entry_point.name,
                module=entry_point.value,
                distribution=distribution,
                version=entry_point.dist.version if entry_point.dist else None,
            )
            if self.blocks(entry_point.name):
                self._stop(entry_point.name, f"{record.describe()}, entry point {entry_point.value!r}")
                self._blocked_modules.setdefault(entry_point.value, entry_point.name.casefold())
                continue
            if not self.autoload and _normalised(distribution) != CORE_DISTRIBUTION:
                continue
            if entry_point.name in self._records:
                if self._records[entry_point.name] == record:
                    continue  # the same distribution seen twice on sys.path
                raise DuplicateFamilyError(
                    f"two plugins are named {entry_point.name!r}: "
                    f"{self._records[entry_point.name].describe()} and {record.describe()}; "
                    f"uninstall one of the distributions, or block one with {_BLOCK_ENV}={entry_point.name}"
                )
            try:
                plugin = entry_point.load()
            except Exception as error:
                raise PluginImportError(
                    f"{record.describe()} failed to import {entry_point.value!r}: "
                    f"{type(error).__name__}: {error}. Fix or uninstall the distribution "
                    f"(pip uninstall {distribution}), block just this plugin with "
                    f"{_BLOCK_ENV}={entry_point.name}, or skip all third-party plugins with "
                    f"{_DISABLE_AUTOLOAD_ENV}=1"
                ) from error
            if self._register_recorded(plugin, record):
                loaded.append((plugin, record))
        for plugin, record in loaded:
            self._collect_tasks(plugin, record)
        for plugin, record in loaded:
            self._collect_families(plugin, record)
        self._register_unserved_builtins()
        self._check_hooks()

    def _register_unserved_builtins(self) -> None:
        """Register each registry.yaml family that no entry point served from its declared plugin module."""
        from zoo_core import __version__

        registry = load_registry()
        # A package may serve several families (zoo_yolo9: yolo9 and yolo9_seg): blocking one of them, or the
        # package, keeps the whole package out, whichever family the loop meets first.
        for name, declaration in registry.items():
            if declaration.plugin is not None and (self.blocks(name) or self.blocks(declaration.plugin)):
                self._blocked_modules.setdefault(declaration.plugin, (name if self.blocks(name) else declaration.plugin).casefold())
        for name, declaration in registry.items():
            plugin_name = declaration.plugin
            if name in self._families or plugin_name is None or plugin_name in self._records:
                continue
            if plugin_name in self._blocked_modules:
                self._stop(self._blocked_modules[plugin_name], f"built-in family {name!r} (module {plugin_name})")
                continue
            try:
                plugin = importlib.import_module(plugin_name)
            except Exception as error:
                raise PluginImportError(
                    f"the built-in family {name!r} could not import its plugin module {plugin_name!r}: "
                    f"{type(error).__name__}: {error}. Reinstall zoo-core, or block it with {_BLOCK_ENV}={name}"
                ) from error
            record = PluginRecord(name=name, module=plugin_name, distribution=CORE_DISTRIBUTION, version=__version__)
            if self._register_recorded(plugin, record):
                self._collect_families(plugin, record)

    def register_family_plugin(self, plugin: Any, name: str | None = None) -> str | None:
        """Register ``plugin`` at run time (a module or an object with ``@hookimpl`` methods).

        Its declarations are validated and added; blocked names are ignored (None is returned).
        Spawned training workers re-register it by module name, or by pickling the object, so
        it must be importable there (defined at module level, not under ``__main__``).
        """
        if isinstance(plugin, str):
            plugin = importlib.import_module(plugin)
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        if self.blocks(name):
            self._stop(name, f"plugin {name!r} registered at run time")
            return None
        module = plugin.__name__ if isinstance(plugin, type(sys)) else type(plugin).__module__
        record = PluginRecord(name=name, module=module)
        if self._register_recorded(plugin, record):
            self._collect_tasks(plugin, record)
            self._collect_families(plugin, record)
        self._check_hooks()
        self._runtime_plugins.append((name, module if isinstance(plugin, type(sys)) else plugin))
        return name

    def _register_recorded(self, plugin: Any, record: PluginRecord) -> bool:
        """Register ``plugin`` under ``record``'s name; False if its name is blocked."""
        if self.blocks(record.name):
            self._stop(record.name, record.describe())
            return False
        try:
            registered = self.register(plugin, name=record.name)
        except pluggy.PluginValidationError as error:
            raise PluginHookError(f"{record.describe()}: {error}") from None
        except ValueError as error:
            existing = self._records.get(record.name)
            other = existing.describe() if existing else f"plugin {record.name!r}"
            raise DuplicateFamilyError(
                f"{record.describe()} cannot register: {other} already uses that name ({error}); "
                f"uninstall one, or block one with {_BLOCK_ENV}={record.name}"
            ) from None
        if registered is None:  # blocked
            return False
        self._records[record.name] = record
        return True

    @staticmethod
    def _declared(plugin: Any, hook: str, single: tuple[type, ...]) -> list[Any]:
        """What ``plugin``'s declaration hook ``hook`` returns, as a list (none: empty)."""
        implementation = getattr(plugin, hook, None)
        declared = implementation() if implementation is not None else None
        if declared is None:
            return []
        return [declared] if isinstance(declared, single) else list(declared)

    def _collect_tasks(self, plugin: Any, record: PluginRecord) -> None:
        for index, item in enumerate(self._declared(plugin, "zoo_tasks", (Mapping, TaskDeclaration))):
            declaration = validate_task_declaration(item, f"{record.describe()} zoo_tasks() item {index}")
            owner = self._task_owner.get(declaration.name)
            if owner is not None:
                first = self._records[owner].describe() if owner in self._records else "zoo-core's built-in tasks"
                raise DuplicateFamilyError(
                    f"task {declaration.name!r} is declared by {first} and by {record.describe()}; uninstall one of the "
                    f"distributions or block one of the plugins ({_BLOCK_ENV}={record.name})"
                )
            self._tasks[declaration.name] = declaration
            self._task_owner[declaration.name] = record.name

    def _collect_families(self, plugin: Any, record: PluginRecord) -> None:
        for index, item in enumerate(self._declared(plugin, "zoo_families", (Mapping, FamilyDeclaration))):
            where = f"{record.describe()} zoo_families() item {index}"
            declaration = validate_declaration(item, where, self._tasks)
            if declaration.plugin is None:
                declaration = declaration.model_copy(update={"plugin": record.module})
            owner = self._family_owner.get(declaration.name)
            if owner is not None:
                raise DuplicateFamilyError(
                    f"family {declaration.name!r} is declared by {self._records[owner].describe()} "
                    f"and by {record.describe()}; uninstall one of the distributions or block one "
                    f"of the plugins ({_BLOCK_ENV}={record.name})"
                )
            self._families[declaration.name] = declaration
            self._family_owner[declaration.name] = record.name

    def _check_hooks(self) -> None:
        try:
            self.check_pending()
        except pluggy.PluginValidationError as error:
            plugin_name = self.get_name(error.plugin) or "?"
            record = self._records.get(plugin_name, PluginRecord(name=plugin_name, module="?"))
            callers = {name: caller for name, caller in vars(self.hook).items() if not name.startswith("_")}
            known = sorted(name for name, caller in callers.items() if caller.has_spec())
            unknown = [
                name
                for name, caller in callers.items()
                if not caller.has_spec() and any(impl.plugin is error.plugin for impl in caller.get_hookimpls())
            ]
            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, known, n=1)
                hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
            raise PluginHookError(
                f"{record.describe()} implements unknown hook {', '.join(hints)}; the hooks are "
                f"{', '.join(known)} (zoo_core/hookspecs.py)"
            ) from None

    # ----------------------------------------------------------------------------- queries
    @property
    def tasks(self) -> Mapping[str, TaskDeclaration]:
        """Every declared task by name: the built-in ones, then those plugins add."""
        return dict(self._tasks)

    def task(self, name: str) -> TaskDeclaration:
        """The declaration of task ``name``; ``UnknownTaskError`` naming the declared tasks if none."""
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTaskError(
                f"no plugin declares a task {name!r}; the tasks are {', '.join(self._tasks)}. A plugin adds one with "
                "its zoo_tasks hook (docs/plugins.md)"
            ) from None

    @property
    def families(self) -> Mapping[str, FamilyDeclaration]:
        """Every declared family by name, in load order."""
        return dict(self._families)

    def family(self, name: str) -> FamilyDeclaration:
        """The declaration of ``name``; ``UnknownFamilyError`` with close matches if none."""
        try:
            return self._families[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._families), n=3, cutoff=0.6)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            blocked = f" (blocked plugins: {', '.join(sorted(self.blocked_names))})" if self.blocked_names else ""
            raise UnknownFamilyError(
                f"no plugin declares a family {name!r}.{hint} Known families: "
                f"{', '.join(self._families) or 'none'}{blocked}. Install the plugin that provides "
                "it (`zoo plugins` lists what is loaded)."
            ) from None

    def family_record(self, name: str) -> PluginRecord:
        """The plugin that declared family ``name``."""
        self.family(name)
        return self._records[self._family_owner[name]]

    def plugin_records(self) -> list[PluginRecord]:
        """Every loaded plugin (the core's own answers excluded)."""
        return list(self._records.values())

    def families_of(self, plugin_name: str) -> list[str]:
        """Family names declared by the plugin ``plugin_name``."""
        return [family for family, owner in self._family_owner.items() if owner == plugin_name]

    @property
    def runtime_plugins(self) -> list[tuple[str, Any]]:
        """Plugins registered from Python: ``(name, module name or picklable object)`` for workers."""
        return list(self._runtime_plugins)

    def settings(self) -> dict[str, Any]:
        """The switches this manager was loaded with, so a worker process can load the same plugins."""
        return {"blocked": sorted(self.blocked_names), "autoload": self.autoload}

    # ----------------------------------------------------------------------------- hooks
    def build_model(
        self, family: str, size: str, num_classes: int | None = None, options: Mapping[str, Any] | None = None
    ) -> "torch.nn.Module":
        """Build a freshly initialised model through the ``build_model`` hook."""
        declaration = self.family(family)
        declaration.size(size)
        if num_classes is None:
            num_classes = declaration.published_num_classes or 0
        model = self.hook.build_model(family=family, size=size, num_classes=num_classes, options=dict(options or {}))
        if model is None:
            raise PluginError(f"no plugin built a model for family {family!r} size {size!r}")
        return model

    def default_sync_bn(self, family: str) -> bool:
        """The family's SyncBatchNorm default under DDP (E8)."""
        self.family(family)
        return bool(self.hook.default_sync_bn(family=family))

    def supports_spawn(self, family: str) -> bool:
        """Whether ``train(device=[...])`` may spawn workers for ``family`` (E13)."""
        self.family(family)
        return bool(self.hook.supports_spawn(family=family))

    def training_recipe(self, family: str, size: str) -> "TrainingRecipe":
        """The ``TrainingRecipe`` of ``family`` at ``size`` (the ``training_recipe`` hook)."""
        self.family(family).size(size)
        recipe = self.hook.training_recipe(family=family, size=size)
        if recipe is None:
            raise PluginError(f"no plugin returned a training recipe for family {family!r} size {size!r}")
        return recipe

    def convert_weights(
        self, family: str, size: str, state_dict: Mapping[str, Any], source: str, target: str = "zoo"
    ) -> "ConvertedWeights | None":
        """``state_dict`` converted from ``source``'s layout to ``target``'s; None if no plugin converts it."""
        self.family(family)
        answer = self.hook.convert_weights(family=family, size=size, state_dict=state_dict, source=source, target=target)
        if answer is None or isinstance(answer, ConvertedWeights):
            return answer
        if not isinstance(answer, Mapping):
            raise PluginError(
                f"{self.family_record(family).describe()} returned a {type(answer).__name__} from convert_weights; "
                "return a dict of tensors, a ConvertedWeights, or None"
            )
        return ConvertedWeights(dict(answer))


_manager: ZooPluginManager | None = None
_manager_lock = threading.Lock()


def get_plugin_manager() -> ZooPluginManager:
    """The process-wide plugin manager, loaded on first use from entry points and the environment."""
    global _manager
    with _manager_lock:
        if _manager is None:
            manager = ZooPluginManager()
            manager.load_entry_point_plugins()
            _manager = manager
        return _manager


def reset_plugin_manager(*, block: Iterable[str] = (), autoload: bool | None = None) -> ZooPluginManager:
    """Replace the process-wide manager with a freshly loaded one (tests, or after installing a plugin)."""
    global _manager
    importlib.invalidate_caches()
    manager = ZooPluginManager(block=block, autoload=autoload)
    manager.load_entry_point_plugins()
    with _manager_lock:
        _manager = manager
    return manager


def register_plugin(plugin: Any, name: str | None = None) -> str | None:
    """Register a plugin object or module with the process-wide manager at run time."""
    return get_plugin_manager().register_family_plugin(plugin, name)
