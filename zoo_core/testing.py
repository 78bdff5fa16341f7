"""Helpers for testing zoo plugins (yours and ours).

``write_plugin_distribution`` writes a throwaway installed distribution — modules plus a
``.dist-info`` with entry points in group ``zoo.plugins`` — into a directory; put that directory
on ``sys.path`` (``plugin_distribution_on_path``) or ``PYTHONPATH`` (subprocesses) and
``importlib.metadata`` finds it exactly as it finds a pip-installed plugin.
``isolated_plugin_manager`` gives a test its own freshly loaded plugin manager and restores the
previous one afterwards.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import textwrap
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from zoo_core import plugin_manager as _plugin_manager
from zoo_core.plugin_manager import ENTRY_POINT_GROUP, ZooPluginManager

__all__ = ["write_plugin_distribution", "plugin_distribution_on_path", "isolated_plugin_manager"]


def write_plugin_distribution(
    directory: str | os.PathLike[str],
    *,
    distribution: str,
    entry_points: Mapping[str, str],
    modules: Mapping[str, str],
    version: str = "1.0.0",
) -> Path:
    """Write an installed-looking distribution into ``directory`` and return ``directory``.

    Args:
        distribution: the distribution name (``zoo-tinynet``).
        entry_points: plugin name -> module, registered in group ``zoo.plugins``.
        modules: dotted module name -> source; ``pkg/__init__.py`` is written for ``pkg``
            when another module lives under it (``pkg.model``).
        version: the distribution's version.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    packages = {name.rsplit(".", 1)[0] for name in modules if "." in name}
    for name, source in modules.items():
        parts = name.split(".")
        if name in packages:
            target = root.joinpath(*parts, "__init__.py")
        else:
            target = root.joinpath(*parts[:-1], parts[-1] + ".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(source), encoding="utf-8")
    for package in packages:
        init = root.joinpath(*package.split("."), "__init__.py")
        if not init.exists():
            init.write_text("", encoding="utf-8")
    info = root / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n", encoding="utf-8"
    )
    lines = [f"[{ENTRY_POINT_GROUP}]", *(f"{name} = {module}" for name, module in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@contextlib.contextmanager
def plugin_distribution_on_path(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """Put ``directory`` first on ``sys.path`` for the block; forget its modules afterwards."""
    root = str(Path(directory))
    before = set(sys.modules)
    sys.path.insert(0, root)
    importlib.invalidate_caches()
    try:
        yield Path(root)
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(root)
        for name in set(sys.modules) - before:
            module_file = getattr(sys.modules[name], "__file__", None) or ""
            if module_file.startswith(root):
                del sys.modules[name]
        importlib.invalidate_caches()


@contextlib.contextmanager
def isolated_plugin_manager(*, block: Iterable[str] = (), autoload: bool | None = None) -> Iterator[ZooPluginManager]:
    """A freshly loaded process-wide plugin manager for the block; the previous one is restored after."""
    previous = _plugin_manager._manager
    try:
        yield _plugin_manager.reset_plugin_manager(block=block, autoload=autoload)
    finally:
        _plugin_manager._manager = previous
