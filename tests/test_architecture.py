"""The import layers of docs/architecture.md hold: no module imports from a layer above its own.

The contract lives in pyproject.toml ([tool.importlinter]): cli -> facade -> engine -> tasks ->
building blocks (losses, assigners, data, nn, ops) -> foundation (plugin manager, weights,
devices ...) -> registry -> hookspecs and errors. It also rules out import cycles between layers:
the engine never imports the facade.
"""

from __future__ import annotations

import contextlib
import io
import os

from .conftest import REPO_ROOT


def test_the_import_layers_hold():
    from importlinter.cli import lint_imports

    previous = os.getcwd()
    os.chdir(REPO_ROOT)  # import-linter reads pyproject.toml from the working directory
    try:
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            status = lint_imports(config_filename=str(REPO_ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    finally:
        os.chdir(previous)
    assert status == 0, output.getvalue()


def test_the_engine_package_does_not_import_the_facade():
    import grimp

    graph = grimp.build_graph("zoo_core", exclude_type_checking_imports=True)
    chains = graph.find_shortest_chains(importer="zoo_core.engine", imported="zoo_core.facade")
    assert not chains, f"zoo_core.engine reaches zoo_core.facade through {sorted(chains)}"
