"""Starting and supervising one worker process per device: ``launch(worker, plan)``.

The launcher knows nothing of models or training. It gives each of ``plan.world_size`` processes
the torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR
on loopback, MASTER_PORT) and calls ``worker(local_rank, workdir)`` there; what a worker needs
travels as files in ``plan.workdir``, a private directory (``private_workdir``) that is removed
whatever happens. The parent then watches:

- the first worker that raises or dies stops the others, and the caller gets one exception
  naming that rank, with its traceback (E14); zoo's own error types arrive as themselves;
- a rendezvous port clash is retried on a fresh free port, unless the user chose the port (E15);
- workers exit when the parent dies (E21), and a later launch sweeps the directories such a
  parent left behind;
- Ctrl-C reaches the workers once, and the parent waits (bounded) for them to finish the
  checkpoint they are writing before it stops them.

Workers start from a forkserver where the platform has one (Linux, macOS), else by spawning: a
fresh interpreter that imports torch and zoo once (``FORKSERVER_PRELOAD``), then forks each worker
from that state. Its imports can run while the caller prepares the data (``start_worker_server``,
called before ``prepare_run``, and by ``zoo train`` as soon as it has parsed its arguments), and a second launch from the same process (a notebook, a test
suite) starts its workers at fork speed. The forkserver never touches CUDA, so the forked workers
may; it holds the environment of the moment it started, so each worker takes the caller's current
environment as an argument. A worker is still a fresh process for the caller: arguments are pickled
as under spawn, and the caller's script is imported as ``__mp_main__``.

Arguments cross the process boundary by pickling: ``pickle_arguments`` checks them before any
process exists (E4), ``read_arguments`` turns an argument that cannot be re-created in a worker
into the same clear error (E20).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import logging
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from zoo_core import errors
from zoo_core.engine.distributed import LOOPBACK, find_free_port, is_address_in_use_error, torchrun_environment
from zoo_core.errors import MasterPortInUseError, UnpicklableArgumentError, WorkerFailedError

__all__ = [
    "LaunchPlan",
    "launch",
    "start_worker_server",
    "prepare_workers",
    "private_workdir",
    "pickle_arguments",
    "write_arguments",
    "read_arguments",
    "inside_spawned_worker",
    "record_bootstrap_error",
    "PORT_ATTEMPTS",
    "PICKLE_HINT",
]

PORT_ATTEMPTS = 3
GRACE_SECONDS = 3.0  # how long the other workers get to exit on their own after a failure
INTERRUPT_GRACE_SECONDS = 60.0  # how long workers get after Ctrl-C to finish the checkpoint being written
WORKDIR_PREFIX = "zoo-spawn-"
# What the forkserver imports once for all the workers it forks: what a worker needs before its first
# step (torch and torchvision are most of it). None of these imports touches CUDA or starts GNU
# OpenMP's thread pool, which only a parallel op starts and which a fork would leave hanging.
FORKSERVER_PRELOAD = [
    "torch", "torchvision", "zoo_core.engine.fitting", "zoo_core.engine.rank", "zoo_core.engine.trainer",
    "zoo_core.tasks.classify", "zoo_core.tasks.detect", "zoo_core.tasks.restore", "zoo_core.tasks.semantic",
]
# Added when the run validates: torchmetrics (2.5 s of imports here, transformers and scipy.signal
# among them) is needed at the first validation, and imported there it costs every worker that time
# at once, N times the CPU; imported here it costs it once, and nothing for a later launch from the
# same process (a notebook, a test suite: 17 spawn tests went from 119 s to 60 s).
VALIDATION_PRELOAD = ["zoo_core.tasks.metrics"]
_SPAWNED_WORKER_MARKER = "ZOO_SPAWNED_WORKER"
_ERROR_DIRECTORY_VARIABLE = "ZOO_SPAWN_ERROR_DIR"
_ARGUMENTS = "arguments.pkl"
_ERRORS = "errors"
PICKLE_HINT = (
    "Training on several devices sends every argument to the worker processes by pickling: use a "
    "class defined at module level of an importable module (not a lambda, a closure, or a class "
    "defined inside a function or under `if __name__ == \"__main__\":`), or the built-in loggers: "
    "loggers=['csv', 'tensorboard']."
)


@dataclass(frozen=True)
class LaunchPlan:
    """How many workers, where they share files, and how they meet.

    ``cpu_threads``: torch threads per worker (0 keeps torch's default); ``master_port``: a port
    the user chose (a clash is then an error, not a retry), named in messages as ``port_origin``.
    """

    world_size: int
    workdir: Path
    cpu_threads: int = 0
    master_port: int | None = None
    port_origin: str = "master_port="


# --------------------------------------------------------------------------- files
@contextlib.contextmanager
def private_workdir() -> Iterator[Path]:
    """A private temp directory for one launch, removed afterwards (stale ones of dead parents are swept first)."""
    _sweep_stale_workdirs()
    directory = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _sweep_stale_workdirs() -> None:
    """Remove spawn directories whose creating process no longer exists (it was killed mid-run)."""
    for candidate in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*-*"):
        owner = candidate.name[len(WORKDIR_PREFIX):].split("-", 1)[0]
        if not owner.isdigit() or _process_exists(int(owner)):
            continue
        with contextlib.suppress(OSError):
            if candidate.is_dir() and candidate.stat().st_uid == os.getuid():
                shutil.rmtree(candidate, ignore_errors=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def pickle_arguments(arguments: dict[str, Any]) -> dict[str, bytes]:
    """Pickle each argument by name; ``UnpicklableArgumentError`` naming the first that fails (E4)."""
    encoded: dict[str, bytes] = {}
    for name, value in arguments.items():
        try:
            encoded[name] = pickle.dumps(value)
        except Exception as error:
            raise UnpicklableArgumentError(
                f"{name} = {value!r} cannot be sent to the training workers ({error}). {PICKLE_HINT}"
            ) from None
    return encoded


def write_arguments(workdir: Path, encoded: dict[str, bytes]) -> None:
    """Store pickled arguments for the workers (``pickle_arguments`` output)."""
    (workdir / _ARGUMENTS).write_bytes(pickle.dumps(encoded))


def read_arguments(workdir: Path, names: list[str] | None = None) -> dict[str, Any]:
    """The arguments in a worker, unpickled in order; ``UnpicklableArgumentError`` naming one that fails (E20)."""
    encoded: dict[str, bytes] = pickle.loads((workdir / _ARGUMENTS).read_bytes())  # our own private file
    decoded: dict[str, Any] = {}
    for name in names or list(encoded):
        try:
            decoded[name] = pickle.loads(encoded[name])
        except Exception as error:
            raise UnpicklableArgumentError(
                f"{name} could not be re-created in a training worker ({type(error).__name__}: {error}). Its class "
                "is probably defined under `if __name__ == \"__main__\":` or in a notebook, which the workers "
                f"cannot import. {PICKLE_HINT}"
            ) from None
    return decoded


# --------------------------------------------------------------------------- E3
def inside_spawned_worker() -> bool:
    """True in a process the launcher started (a training call there means a missing ``__main__`` guard).

    Also true while any multiprocessing child is still importing its parent's script (its
    bootstrapping phase), whoever started it.
    """
    import multiprocessing

    return bool(os.environ.get(_SPAWNED_WORKER_MARKER)) or bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def record_bootstrap_error(error: BaseException) -> None:
    """In a spawned worker, leave ``error`` where the parent reads it, before the worker's rank is known."""
    directory = os.environ.get(_ERROR_DIRECTORY_VARIABLE)
    if directory:
        with contextlib.suppress(OSError):
            _record_error(Path(directory), None, error)


def _record_error(errors_dir: Path, rank: int | None, error: BaseException) -> None:
    errors_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "pid": os.getpid(),
        "type": f"{type(error).__module__}.{type(error).__qualname__}",
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
        "time": time.time(),
    }
    target = errors_dir / f"{'bootstrap' if rank is None else f'rank{rank}'}-{os.getpid()}.json"
    temporary = target.with_suffix(".tmp")
    temporary.write_text(json.dumps(record), encoding="utf-8")
    os.replace(temporary, target)


# --------------------------------------------------------------------------- parent side
_forkserver_is_ours = False
_forkserver_failure: str | None = None  # why the forkserver could not start here (then workers are spawned)
log = logging.getLogger("zoo.train")


def _bootstrap_errors_dir() -> Path:
    """Where workers record an error raised before they know their rank (E3): one directory per parent process,
    because a forkserver's workers inherit the environment the forkserver started with, not one launch's."""
    return Path(tempfile.gettempdir()) / f"{WORKDIR_PREFIX}{os.getpid()}-bootstrap"


def _start_method() -> str:
    """``forkserver`` where the platform has it and zoo started the running one (or none runs yet), else ``spawn``."""
    import multiprocessing.forkserver

    if "forkserver" not in multiprocessing.get_all_start_methods() or _forkserver_failure is not None:
        return "spawn"
    started_elsewhere = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None) is not None and not _forkserver_is_ours
    return "spawn" if started_elsewhere else "forkserver"


def start_worker_server(validates: bool = True) -> None:
    """Start the forkserver the workers will fork from, if it is not running (its imports run in the background).

    ``validates``: the workers will validate, so the forkserver imports the metrics as well
    (``VALIDATION_PRELOAD``). Its environment carries the worker marker and the bootstrap error
    directory, so a worker that re-imports an unguarded script reports E3 from there.
    """
    global _forkserver_is_ours, _forkserver_failure
    if _start_method() != "forkserver":
        return
    import multiprocessing.forkserver

    if multiprocessing.forkserver._forkserver._forkserver_pid is not None:
        return
    multiprocessing.forkserver.set_forkserver_preload(FORKSERVER_PRELOAD + (VALIDATION_PRELOAD if validates else []))
    try:
        with _worker_environment(_bootstrap_errors_dir()):
            multiprocessing.forkserver.ensure_running()
    except OSError as error:  # e.g. its socket path under a long TMPDIR passes the 108-byte limit of AF_UNIX
        _forkserver_failure = f"{type(error).__name__}: {error}"
        log.warning("zoo: the worker forkserver could not start (%s); training workers are spawned instead, which "
                    "starts them more slowly. A short TMPDIR (e.g. /tmp) lets the forkserver start.", _forkserver_failure)
        return
    _forkserver_is_ours = True
    atexit.register(shutil.rmtree, _bootstrap_errors_dir(), ignore_errors=True)


def prepare_workers(device: Any, *, validates: bool = True) -> None:
    """Start, in the background, the process that ``train(device=device)`` will fork its workers from.

    Optional: ``train()`` starts it itself, but only once it is called, and then waits for its
    imports (torch, torchvision, the engine, the metrics: several seconds on a small machine).
    Called first thing in a script that trains on several devices, the imports run while the script
    imports torch and builds its model. ``validates=False`` (for ``train(val=False)``) leaves out
    the metrics, which such a run never imports. Does nothing for one device, under torchrun (the
    ranks exist already) or where the platform has no forkserver; a ``device`` that names no
    devices is a ``DeviceSpecError``.
    """
    from zoo_core.devices import parse_device

    if parse_device(device).multi_device and not torchrun_environment():
        start_worker_server(validates=validates)


def launch(worker: Callable[[int, Path], None], plan: LaunchPlan) -> None:
    """Run ``worker(local_rank, plan.workdir)`` in ``plan.world_size`` spawned processes; raise the first failure."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = plan.master_port or find_free_port()
        failure = _run_workers(worker, plan, port)
        if failure is None:
            return
        if failure.port_clash:
            if plan.master_port is not None:
                raise MasterPortInUseError(
                    f"master port {plan.master_port} (from {plan.port_origin}) is already in use on {LOOPBACK}; "
                    "choose another port, or leave it unset and zoo picks a free one"
                )
            if attempt < PORT_ATTEMPTS:
                continue
        raise failure.exception()


@contextlib.contextmanager
def _worker_environment(error_directory: Path) -> Iterator[None]:
    """Mark the environment the children inherit, only while they are being started."""
    saved = {name: os.environ.get(name) for name in (_SPAWNED_WORKER_MARKER, _ERROR_DIRECTORY_VARIABLE)}
    os.environ[_SPAWNED_WORKER_MARKER] = "1"
    os.environ[_ERROR_DIRECTORY_VARIABLE] = str(error_directory)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _typed_error_class(type_name: str) -> type[Exception] | None:
    """zoo's own error class named ``type_name`` (re-raised as itself in the parent), if it is one."""
    module, _, name = type_name.rpartition(".")
    candidate = getattr(errors, name, None) if module == errors.__name__ else None
    if isinstance(candidate, type) and issubclass(candidate, errors.ZooError) and candidate is not WorkerFailedError:
        return candidate
    return None


@dataclass
class _Failure:
    """The first failing worker, and how to explain it."""

    rank: int | None
    exit_code: int | None
    record: dict[str, Any] | None

    @property
    def port_clash(self) -> bool:
        return bool(self.record) and is_address_in_use_error(self.record.get("message", "") + self.record.get("traceback", ""))

    def exception(self) -> Exception:
        record = self.record or {}
        if record:
            worker_error = WorkerFailedError(
                f"training worker rank {self.rank} failed: {record['type']}: {record['message']}\n\n"
                f"--- traceback of rank {self.rank} ---\n{record['traceback']}",
                rank=self.rank, worker_traceback=record["traceback"],
            )
            error_class = _typed_error_class(record.get("type", ""))
            if error_class is None:
                return worker_error
            try:
                typed = error_class(record["message"])
            except TypeError:  # a constructor with other arguments
                return worker_error
            typed.__cause__ = worker_error  # the worker's traceback stays visible
            return typed
        if self.exit_code is not None and self.exit_code < 0:
            try:
                name = signal.Signals(-self.exit_code).name
            except ValueError:
                name = f"signal {-self.exit_code}"
            why = f"was killed by {name}"
        else:
            why = f"exited with code {self.exit_code} without reporting an error"
        return WorkerFailedError(
            f"training worker rank {self.rank} {why}; no Python traceback exists. An external kill or the "
            "kernel's out-of-memory killer are the usual causes; the other workers were stopped.",
            rank=self.rank,
        )


class _LaunchersOutput:
    """The launching process's stdout and stderr as they are now, for a worker to write to: a forkserver's
    workers would otherwise write where the forkserver's output went when it started (pickling hands the
    two descriptors to the child, multiprocessing's ``DupFd``)."""

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return _adopt_output, (reduction.DupFd(1), reduction.DupFd(2))


def _adopt_output(stdout: Any, stderr: Any) -> None:
    """In the worker, while its arguments are unpickled: write to the launcher's stdout and stderr."""
    for handed, target in ((stdout, 1), (stderr, 2)):
        descriptor = handed.detach() if hasattr(handed, "detach") else handed
        if descriptor != target:
            os.dup2(descriptor, target)
            os.close(descriptor)


def _run_workers(worker: Callable[[int, Path], None], plan: LaunchPlan, port: int) -> _Failure | None:
    """Start the workers and wait; the first failure stops the rest and is returned (None: success)."""
    import torch.multiprocessing as torch_mp

    errors_dir = plan.workdir / _ERRORS
    errors_dir.mkdir(exist_ok=True)
    for stale in errors_dir.iterdir():
        stale.unlink()
    start_worker_server()
    method = _start_method()
    bootstrap_dir = _bootstrap_errors_dir() if method == "forkserver" else errors_dir
    with _worker_environment(bootstrap_dir):
        environment = dict(os.environ)
        context = torch_mp.start_processes(
            _worker_entry, args=(worker, str(plan.workdir), plan.world_size, port, plan.cpu_threads, os.getpid(), environment,
                                 _LaunchersOutput() if method == "forkserver" else None),  # spawned workers inherit it
            nprocs=plan.world_size, join=False, start_method=method,
        )
    processes = list(context.processes)
    try:
        return _wait(processes, errors_dir, bootstrap_dir)
    finally:
        _stop(processes)


def _wait(processes: list[Any], errors_dir: Path, bootstrap_dir: Path) -> _Failure | None:
    try:
        return _wait_for_exit(processes, errors_dir, bootstrap_dir)
    except KeyboardInterrupt:
        _interrupt(processes)
        raise


def _interrupt(processes: list[Any]) -> None:
    """Ctrl-C: pass the interrupt on and give the workers time to finish writing their checkpoint."""
    for process in processes:
        if process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGINT)
    deadline = time.monotonic() + INTERRUPT_GRACE_SECONDS
    try:
        while time.monotonic() < deadline and any(process.is_alive() for process in processes):
            time.sleep(0.05)
    except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
        pass


def _wait_for_exit(processes: list[Any], errors_dir: Path, bootstrap_dir: Path) -> _Failure | None:
    pending = {process.sentinel: rank for rank, process in enumerate(processes)}
    while pending:
        ready = multiprocessing.connection.wait(list(pending), timeout=1.0)
        failed: list[int] = []
        for sentinel in ready:
            rank = pending.pop(sentinel)
            processes[rank].join()
            if processes[rank].exitcode != 0:
                failed.append(rank)
        if failed:
            deadline = time.monotonic() + GRACE_SECONDS
            while time.monotonic() < deadline and any(process.is_alive() for process in processes):
                time.sleep(0.05)
            return _first_failure(failed, processes, errors_dir, bootstrap_dir)
    return None


def _first_failure(failed: list[int], processes: list[Any], errors_dir: Path, bootstrap_dir: Path) -> _Failure:
    records = []
    for path in errors_dir.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(path.read_text(encoding="utf-8")))
    ours = {process.pid for process in processes}  # the bootstrap directory may outlive this launch
    for path in bootstrap_dir.glob("bootstrap-*.json") if bootstrap_dir != errors_dir else ():
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text(encoding="utf-8"))
            if record.get("pid") in ours:
                records.append(record)
    bootstrap = [record for record in records if record.get("rank") is None]
    if bootstrap:  # a worker failed while importing the user's script (E3)
        return _Failure(None, None, min(bootstrap, key=lambda record: record["time"]))
    by_rank = {record["rank"]: record for record in records}
    # A worker killed by a signal leaves no record and is the cause of its peers' errors.
    killed = [rank for rank in failed if (processes[rank].exitcode or 0) < 0 and rank not in by_rank]
    if killed:
        return _Failure(killed[0], processes[killed[0]].exitcode, None)
    if records:
        first = min(records, key=lambda record: record["time"])
        return _Failure(first["rank"], processes[first["rank"]].exitcode, first)
    return _Failure(failed[0], processes[failed[0]].exitcode, None)


def _stop(processes: list[Any]) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + 5.0
    for process in processes:
        process.join(timeout=max(deadline - time.monotonic(), 0.1))
        if process.is_alive():
            process.kill()
            process.join()


# --------------------------------------------------------------------------- worker side
def _die_with_parent(parent_pid: int) -> None:
    """Exit as soon as the launching process dies (E21): PR_SET_PDEATHSIG on Linux, plus a watchdog thread.

    Under a forkserver the worker's parent is the forkserver, which exits when the launching
    process does; the watchdog also watches the launching process itself.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    direct_parent = os.getppid()
    if direct_parent == 1 or not _process_exists(parent_pid):  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != direct_parent or not _process_exists(parent_pid):
                os._exit(1)

    threading.Thread(target=watch, name="zoo-parent-watchdog", daemon=True).start()


def _interrupt_once() -> None:
    """The first SIGINT interrupts the worker; later ones are ignored so its clean-up (the checkpoint write) ends.

    A Ctrl-C in a terminal reaches the whole process group, and the parent forwards it as well.
    """

    def interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)


def _worker_entry(local_rank: int, worker: Callable[[int, Path], None], workdir_text: str, world_size: int, port: int,
                  cpu_threads: int, parent_pid: int, environment: dict[str, str], output: None) -> None:
    """One worker process: take the launching process's environment, become rank ``local_rank`` (torchrun
    variables) and run ``worker``. ``output`` was the launcher's stdout and stderr (``_LaunchersOutput``):
    unpickling it already made them this process's."""
    _die_with_parent(parent_pid)
    _interrupt_once()
    workdir = Path(workdir_text)
    os.environ.clear()  # a forkserver's workers start with the environment the forkserver started with
    os.environ.update(environment)
    os.environ.update({
        "RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port),
    })
    try:
        if cpu_threads:
            import torch

            torch.set_num_threads(cpu_threads)
        worker(local_rank, workdir)
    except BaseException as error:
        _record_error(workdir / _ERRORS, local_rank, error)
        traceback.print_exc()
        # An explicit non-zero exit: torch's process wrapper would treat KeyboardInterrupt as a clean exit.
        sys.exit(1)
