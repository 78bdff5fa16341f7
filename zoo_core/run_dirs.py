"""Run directories: ``runs/<task>/<name>``, then ``<name>2``, ``<name>3``... never overwriting a run."""

from __future__ import annotations

from pathlib import Path

__all__ = ["next_run_dir"]


def next_run_dir(task: str, name: str = "train", project: str | Path = "runs", *, exist_ok: bool = False) -> Path:
    """Create and return the first free ``project/task/name{,2,3...}`` (``exist_ok``: reuse ``name``).

    Creation is ``mkdir(exist_ok=False)``, so two processes racing for one name get two names.
    """
    parent = Path(project) / task
    parent.mkdir(parents=True, exist_ok=True)
    if exist_ok:
        path = parent / name
        path.mkdir(exist_ok=True)
        return path
    for index in range(1, 10_000):
        path = parent / (name if index == 1 else f"{name}{index}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{parent}: no free run directory name for {name!r}; pass exist_ok=True or another name")
