"""Run directories: ``runs/<task>/<name>``, then ``<name>2``, ``<name>3``... never overwriting a run.

A training run also *claims* its folder for as long as it trains (``claim_run_dir``): an advisory
lock on ``<run>/.zoo-run.lock``, which records the owner's pid and host. Without it, two runs into
one folder (the same ``name`` with ``exist_ok=True``, or a ``resume`` of a run still training)
interleaved their ``results.csv`` rows and left ``best.pt`` from one run beside ``last.pt`` from the
other. The second is refused with ``RunDirectoryInUseError`` naming the folder and the owner. The
lock is the kernel's (``flock``; ``msvcrt.locking`` on Windows), so it ends with its process however
that process ends: a killed run never leaves a folder locked. The lock file itself stays (removing it
on release would let a third run lock a new file while a second still holds the old one).

A folder that cannot be created or written (a read-only ``project``) is a ``RunDirectoryError``
naming it, not a raw ``PermissionError``.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import IO

from zoo_core.errors import RunDirectoryError, RunDirectoryInUseError
from zoo_core.settings import runs_dir

__all__ = ["LOCK_NAME", "RunDirectoryClaim", "claim_run_dir", "next_run_dir"]

LOCK_NAME = ".zoo-run.lock"


def _unwritable(path: Path, error: OSError) -> RunDirectoryError:
    reason = error.strerror or str(error)
    return RunDirectoryError(
        f"cannot create or write the run folder {path} ({reason}); choose a writable project= (it is "
        f"{path.parent.parent}), or fix the folder's permissions"
    )


def next_run_dir(task: str, name: str = "train", project: str | Path | None = None, *, exist_ok: bool = False) -> Path:
    """Create and return the first free ``project/task/name{,2,3...}`` (``exist_ok``: reuse ``name``; ``project``
    None: the ``runs_dir`` setting, zoo_core/settings.py).

    Creation is ``mkdir(exist_ok=False)``, so two processes racing for one name get two names; with
    ``exist_ok`` both get the same folder, and ``claim_run_dir`` lets only one of them train there.
    ``RunDirectoryError`` names a folder that cannot be created.
    """
    parent = (Path(project) if project is not None else runs_dir()) / task
    try:
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
    except FileExistsError as error:  # a file (not a folder) where a folder must go
        raise _unwritable(Path(error.filename or parent), error) from None
    except OSError as error:
        raise _unwritable(parent / name, error) from None
    raise RunDirectoryError(f"{parent}: no free run directory name for {name!r}; pass exist_ok=True or another name")


class RunDirectoryClaim:
    """This process's claim on a run folder; ``release()`` (or the process's end) gives it up."""

    def __init__(self, path: Path, stream: IO[str]) -> None:
        self.path = path
        self._stream: IO[str] | None = stream

    @property
    def held(self) -> bool:
        """Whether the claim is still held."""
        return self._stream is not None

    def release(self) -> None:
        """Give the folder up (closing the locked file releases the lock). Idempotent."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()

    def __enter__(self) -> "RunDirectoryClaim":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _try_lock(stream: IO[str]) -> bool:
    """Take an exclusive, non-blocking lock on ``stream``'s file; False if another process holds one."""
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        try:
            msvcrt.locking(stream.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _owner_of(lock: Path) -> str:
    """Who holds ``lock``, from what it wrote there (a moment's wait: the owner writes just after locking)."""
    for _ in range(10):
        try:
            text = lock.read_text(encoding="utf-8").strip()
        except OSError:
            text = ""
        if text:
            fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
            started = fields.get("since", "")
            when = f", training since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(float(started)))}" if started else ""
            return f"process {fields.get('pid', '?')} on host {fields.get('host', '?')}{when}"
        time.sleep(0.05)
    return "another process"


def claim_run_dir(path: str | Path) -> RunDirectoryClaim:
    """Claim run folder ``path`` for this process (see the module docstring).

    ``RunDirectoryInUseError`` names the folder and the process that holds it; ``RunDirectoryError``
    a folder where the lock file cannot be written.
    """
    path = Path(path)
    lock = path / LOCK_NAME
    try:
        stream = open(lock, "a+", encoding="utf-8")  # noqa: SIM115 - held open for the claim's life
    except OSError as error:
        raise _unwritable(path, error) from None
    try:
        locked = _try_lock(stream)
    except OSError as error:  # a file system without locks (some network mounts): say so rather than race
        stream.close()
        raise RunDirectoryError(f"cannot lock the run folder {path} ({error.strerror or error}); use a project= on a "
                                "local disk") from None
    if not locked:
        stream.close()
        raise RunDirectoryInUseError(
            f"the run folder {path} is in use by another training run ({_owner_of(lock)}); two runs in one folder "
            "would mix their results.csv rows and checkpoints. Wait for it to finish, or train under another name= "
            "(without exist_ok=True each run gets a fresh folder)"
        )
    try:
        stream.seek(0)
        stream.truncate()
        stream.write(f"pid={os.getpid()} host={socket.gethostname()} since={time.time():.0f}\n")
        stream.flush()
    except OSError as error:
        stream.close()
        raise _unwritable(path, error) from None
    return RunDirectoryClaim(path, stream)
