"""The import layers of docs/architecture.md hold: no module imports from a layer above its own.

The contracts live in pyproject.toml ([tool.importlinter]): cli -> facade -> engine -> tasks ->
building blocks (losses, assigners, data, nn, ops) -> foundation (plugin manager, weights,
devices ...) -> registry -> hookspecs and errors. It also rules out import cycles between layers:
the engine never imports the facade. A second contract keeps the plugin packages independent:
no plugin imports another, so what two families share lives in zoo_core.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
import tomllib

from .conftest import REPO_ROOT


def test_the_import_layers_hold():
    from importlinter.cli import lint_imports

    previous = os.getcwd()
    # import-linter configures logging with dictConfig, which disables every logger that exists
    # (zoo.weights among them) for the rest of this test worker's session; they are put back after.
    loggers = [logger for logger in logging.root.manager.loggerDict.values() if isinstance(logger, logging.Logger)]
    disabled = [logger.disabled for logger in loggers]
    os.chdir(REPO_ROOT)  # import-linter reads pyproject.toml from the working directory
    try:
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            status = lint_imports(config_filename=str(REPO_ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    finally:
        os.chdir(previous)
        for logger, was_disabled in zip(loggers, disabled):
            logger.disabled = was_disabled
    assert status == 0, output.getvalue()


def test_the_engine_package_does_not_import_the_facade():
    import grimp

    graph = grimp.build_graph("zoo_core", exclude_type_checking_imports=True)
    chains = graph.find_shortest_chains(importer="zoo_core.engine", imported="zoo_core.facade")
    assert not chains, f"zoo_core.engine reaches zoo_core.facade through {sorted(chains)}"


def _plugin_packages() -> list[str]:
    return sorted(path.name for path in (REPO_ROOT / "plugins").iterdir() if (path / "__init__.py").is_file())


def test_plugins_never_import_each_other():
    import grimp

    plugins = _plugin_packages()
    assert len(plugins) == 24, plugins
    # The import-linter contract that the first test runs names every plugin package, so a new one is covered too.
    settings = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    (independence,) = [contract for contract in settings["contracts"] if contract["type"] == "independence"]
    assert sorted(independence["modules"]) == plugins
    assert set(plugins) <= set(settings["root_packages"])
    graph = grimp.build_graph("zoo_core", *plugins, exclude_type_checking_imports=True)
    chains = {
        (importer, imported): graph.find_shortest_chain(importer=importer, imported=imported, as_packages=True)
        for importer, imported in itertools.permutations(plugins, 2)
    }
    found = {pair: chain for pair, chain in chains.items() if chain}
    assert not found, f"plugins import other plugins: {found}"


def test_every_declared_converter_is_its_own_familys_and_resolves():
    import pkgutil

    from zoo_core.registry import load_registry

    declared = {name: family for name, family in load_registry().items() if family.converter is not None}
    assert len(declared) == 24, sorted(declared)
    for name, family in declared.items():
        module = family.converter.split(":")[0]
        assert module.split(".")[0] == family.plugin, f"{name}'s converter {family.converter} is not in {family.plugin}"
        assert callable(pkgutil.resolve_name(family.converter)), family.converter
