"""Where zoo keeps files it owns: the cache (``ZOO_HOME``) for downloads and built-in datasets, and the
private temporary folders of a run.

Every temporary folder zoo makes carries its owner's process id in its name (``zoo-spawn-<pid>-…``,
``zoo-weights-<pid>-…``, the ``shapes`` generator's ``.<dataset>.<pid>-…`` staging folder). Each is removed
when its owner is done, in ``finally``; one left by an owner that was killed (SIGKILL, the OOM killer,
a power cut) is removed by the next run that makes a folder of its kind, once ``process_alive`` says its
owner is gone (``sweep_stale_folders``). A folder whose pid now belongs to an unrelated live process
is kept until that one ends: a sweep never removes a folder whose owner might be alive.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

__all__ = [
    "zoo_home", "sample_image", "SAMPLE_SEED", "SPAWN_PREFIX", "WEIGHTS_PREFIX", "BENCHMARK_PREFIX", "TEMP_PREFIXES", "process_alive",
    "owned_temp_dir", "sweep_stale_folders",
]

SPAWN_PREFIX = "zoo-spawn-"  # a launch's arguments, results and worker errors (engine/launcher.py)
WEIGHTS_PREFIX = "zoo-weights-"  # the weights a train() call hands its workers (facade.py)
BENCHMARK_PREFIX = "zoo-benchmark-"  # the files zoo benchmark writes and loads back (model_benchmark.py)
TEMP_PREFIXES = (SPAWN_PREFIX, WEIGHTS_PREFIX, BENCHMARK_PREFIX)  # the folders zoo makes in the temp directory


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited.

    A zombie (exited, not yet reaped by its parent: ``State: Z`` in ``/proc/<pid>/status``) is dead:
    ``os.kill(pid, 0)`` still succeeds on one, and a parent killed while its own parent is busy stays
    a zombie for as long as that parent likes. Another user's live process counts as alive.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists; the state below still tells a zombie
    except OSError:  # pragma: no cover - e.g. a pid beyond the platform's range
        return False
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("State:"):
                    return line.split()[1] not in ("Z", "X")  # zombie, or dead and being reaped
    except OSError:
        pass  # no /proc (macOS, Windows), or the process ended just now: os.kill's answer stands
    return True


def _owner(name: str, prefix: str) -> int | None:
    """The owner pid in folder name ``<prefix><pid>-…``, or None when the name is not one of zoo's."""
    owner = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
    return int(owner) if owner.isascii() and owner.isdigit() else None


def sweep_stale_folders(prefixes: Iterable[str] = TEMP_PREFIXES, directory: str | Path | None = None) -> list[Path]:
    """Remove the folders named ``<prefix><pid>-…`` in ``directory`` (default: the temp directory) whose owner
    process has died; returns what was removed. Only this user's folders are touched."""
    parent = Path(directory) if directory is not None else Path(tempfile.gettempdir())
    removed = []
    for prefix in prefixes:
        for candidate in parent.glob(f"{prefix}*-*"):
            owner = _owner(candidate.name, prefix)
            if owner is None or process_alive(owner):
                continue
            with contextlib.suppress(OSError):
                if candidate.is_dir() and not candidate.is_symlink() and candidate.stat().st_uid == os.getuid():
                    shutil.rmtree(candidate, ignore_errors=True)
                    removed.append(candidate)
    return removed


@contextlib.contextmanager
def owned_temp_dir(prefix: str, directory: str | Path | None = None) -> Iterator[Path]:
    """A private temp folder ``<prefix><this pid>-…`` for the block, removed afterwards whatever happens.

    First sweeps every kind of folder zoo leaves in the temp directory (``TEMP_PREFIXES``), and those of
    ``prefix`` in ``directory``, whose owners died without removing them.
    """
    sweep_stale_folders()
    if directory is not None:
        sweep_stale_folders([prefix], directory)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=directory))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def zoo_home() -> Path:
    """The cache directory: ``$ZOO_HOME``, else ``~/.cache/zoo``. Created on first use by callers."""
    configured = os.environ.get("ZOO_HOME")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "zoo"


SAMPLE_SEED = 2040  # sample.jpg is the scene zoo_core.data.shapes.render_scene draws from this seed at 320 px


def sample_image() -> Path:
    """A 320×320 JPEG of coloured shapes that ships with zoo, to try ``predict`` on a fresh machine.

    zoo drew it itself: ``render_scene(numpy.random.default_rng(SAMPLE_SEED), 320)`` from
    ``zoo_core.data.shapes``, saved at JPEG quality 90 (tests/test_readme.py checks that).
    """
    return Path(__file__).with_name("assets") / "sample.jpg"
