"""Starting and supervising one worker process per device: ``launch(worker, arguments, plan)``.

The launcher knows nothing of models or training. It gives each of ``plan.world_size`` processes
the torchrun variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR on loopback, MASTER_PORT),
calls ``worker(local_rank, arguments)`` there and returns what rank 0's call returned. The
arguments (checked by ``pickle_arguments`` before any process exists) and rank 0's result travel
as files in a private directory that is removed whatever happens. The parent watches:

- the first worker that raises or dies stops the others, and the caller gets one exception
  naming that rank, with its traceback (E14); zoo's own error types arrive as themselves;
- a rendezvous port clash is retried on a fresh free port, unless the user chose the port (E15);
- workers exit when the parent dies (E21), and a later launch sweeps the directories such a
  parent left behind;
- Ctrl-C reaches the workers once, and the parent waits (bounded) for them to finish the
  checkpoint they are writing before it stops them.

Workers start from a forkserver where the platform has one (Linux, macOS), else by spawning: a
fresh interpreter that imports torch and the modules a worker needs once (the engine's
``ENGINE_MODULES`` and what the run's task names), then forks each worker from that state. Its
imports can run while the caller prepares the data (``start_worker_server``, called before
``prepare_run``, and by ``zoo train`` as soon as it has parsed its arguments), and a second launch
from the same process (a notebook, a test suite) starts its workers at fork speed. The forkserver
never touches CUDA, so the forked workers may; it holds the environment of the moment it started,
so each worker takes the caller's current environment as an argument. A worker is still a fresh
process for the caller: arguments are pickled as under spawn, and the caller's script is imported
as ``__mp_main__``. ``WORKER_SERVER`` holds what this process knows of its forkserver.

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
from typing import Any, Callable, Iterator, Mapping, Sequence

from zoo_core import errors
from zoo_core.engine.distributed import LOOPBACK, find_free_port, is_address_in_use_error, torchrun_environment
from zoo_core.errors import MasterPortInUseError, UnpicklableArgumentError, WorkerFailedError
from zoo_core.paths import SPAWN_PREFIX, owned_temp_dir, process_alive

__all__ = [
    "LaunchPlan",
    "launch",
    "WorkerServer",
    "WORKER_SERVER",
    "ENGINE_MODULES",
    "start_worker_server",
    "prepare_workers",
    "pickle_arguments",
    "inside_spawned_worker",
    "refuse_inside_worker",
    "PORT_ATTEMPTS",
    "PICKLE_HINT",
]

PORT_ATTEMPTS = 3
GRACE_SECONDS = 3.0  # how long the other workers get to exit on their own after a failure
INTERRUPT_GRACE_SECONDS = 60.0  # how long workers get after Ctrl-C to finish the checkpoint being written
WORKDIR_PREFIX = SPAWN_PREFIX  # zoo-spawn-<pid>-...: swept by a later launch once <pid> is dead (paths.py)
# What the forkserver imports once for all the workers it forks, with the modules of the run's task
# (its ``preloaded_modules``: its own module, and the metrics when the run validates, which imported
# in each worker at its first validation would cost every rank those seconds at once). torch and
# torchvision are most of it. None of these imports touches CUDA or starts GNU OpenMP's thread
# pool, which only a parallel op starts and which a fork would leave hanging.
ENGINE_MODULES = ("torch", "torchvision", "zoo_core.engine.fitting", "zoo_core.engine.rank", "zoo_core.engine.trainer")
_SPAWNED_WORKER_MARKER = "ZOO_SPAWNED_WORKER"
_ERROR_DIRECTORY_VARIABLE = "ZOO_SPAWN_ERROR_DIR"
_ARGUMENTS = "arguments.pkl"
_RESULT = "result.pkl"
_ERRORS = "errors"
PICKLE_HINT = (
    "Training on several devices sends every argument to the worker processes by pickling: use a "
    "class or function defined at module level of an importable module (not a lambda, a closure, or a "
    "class defined inside a function or under `if __name__ == \"__main__\":`), or the built-in loggers: "
    "loggers=['csv', 'tensorboard']."
)


@dataclass(frozen=True)
class LaunchPlan:
    """How many workers, and how they meet.

    ``cpu_threads``: torch threads per worker (0 keeps torch's default); ``master_port``: a port
    the user chose (a clash is then an error, not a retry), named in messages as ``port_origin``.
    """

    world_size: int
    cpu_threads: int = 0
    master_port: int | None = None
    port_origin: str = "master_port="


# --------------------------------------------------------------------------- files
@contextlib.contextmanager
def private_workdir() -> Iterator[Path]:
    """A private temp directory for one launch, removed afterwards; first, every temp folder zoo left behind
    for a dead owner (zoo-spawn-*, zoo-weights-*) is swept (``paths.owned_temp_dir``)."""
    with owned_temp_dir(WORKDIR_PREFIX) as directory:
        yield directory


def pickle_arguments(arguments: Mapping[str, Any]) -> dict[str, bytes]:
    """Pickle each argument by name for ``launch``; ``UnpicklableArgumentError`` naming the first that fails (E4).

    Call it before anything has happened that a refused argument would leave behind; the encoded
    arguments of several calls can be merged (``dict.update``) and launched together.
    """
    encoded: dict[str, bytes] = {}
    for name, value in arguments.items():
        try:
            encoded[name] = pickle.dumps(value)
        except Exception as error:
            raise UnpicklableArgumentError(
                f"{name} = {value!r} cannot be sent to the training workers ({error}). {PICKLE_HINT}"
            ) from None
    return encoded


def _write_arguments(workdir: Path, encoded: Mapping[str, bytes]) -> None:
    """Store pickled arguments for the workers (``pickle_arguments`` output)."""
    (workdir / _ARGUMENTS).write_bytes(pickle.dumps(dict(encoded)))


def _read_arguments(workdir: Path) -> dict[str, Any]:
    """The arguments in a worker, unpickled in order; ``UnpicklableArgumentError`` naming one that fails (E20)."""
    encoded: dict[str, bytes] = pickle.loads((workdir / _ARGUMENTS).read_bytes())  # our own private file
    decoded: dict[str, Any] = {}
    for name in encoded:
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


def refuse_inside_worker(error: BaseException) -> None:
    """Raise ``error`` in a process the launcher started (``inside_spawned_worker``), after leaving it where
    the parent reads it: the worker's rank is not known yet. Outside a worker, nothing happens."""
    if not inside_spawned_worker():
        return
    directory = os.environ.get(_ERROR_DIRECTORY_VARIABLE)
    if directory:
        with contextlib.suppress(OSError):
            _record_error(Path(directory), None, error)
    raise error


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
log = logging.getLogger("zoo.train")


def _bootstrap_errors_dir() -> Path:
    """Where workers record an error raised before they know their rank (E3): one directory per parent process,
    because a forkserver's workers inherit the environment the forkserver started with, not one launch's."""
    return Path(tempfile.gettempdir()) / f"{WORKDIR_PREFIX}{os.getpid()}-bootstrap"


class WorkerServer:
    """This process's forkserver, as the launcher uses it: whether zoo started it, or why it could not start.

    The forkserver is multiprocessing's, one per process; zoo starts it with the modules to import
    (``start``) and forks workers from it only if zoo started it (another library's forkserver
    would lack those imports and the worker marker). Where it cannot start, workers are spawned.
    """

    def __init__(self) -> None:
        self.started_here = False
        self.failure: str | None = None  # why it could not start here (then workers are spawned)

    @staticmethod
    def _running() -> bool:
        """Whether multiprocessing's forkserver runs in this process, whoever started it.

        multiprocessing has no public question for this; its forkserver object's pid is the answer,
        and this is the one place zoo reads it.
        """
        import multiprocessing.forkserver

        return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None) is not None

    def start_method(self) -> str:
        """``forkserver`` where the platform has it and zoo started the running one (or none runs yet), else ``spawn``."""
        import multiprocessing

        if "forkserver" not in multiprocessing.get_all_start_methods() or self.failure is not None:
            return "spawn"
        return "spawn" if self._running() and not self.started_here else "forkserver"

    def start(self, modules: Sequence[str]) -> None:
        """Start the forkserver, importing ``modules`` in the background, if it is not running yet.

        Its environment carries the worker marker and the bootstrap error directory, so a worker
        that re-imports an unguarded script reports E3 from there.
        """
        if self.start_method() != "forkserver" or self._running():
            return
        import multiprocessing.forkserver

        multiprocessing.forkserver.set_forkserver_preload(list(dict.fromkeys(modules)))
        try:
            with _worker_environment(_bootstrap_errors_dir()):
                multiprocessing.forkserver.ensure_running()
        except OSError as error:  # e.g. its socket path under a long TMPDIR passes the 108-byte limit of AF_UNIX
            self.failure = f"{type(error).__name__}: {error}"
            log.warning("zoo: the worker forkserver could not start (%s); training workers are spawned instead, which "
                        "starts them more slowly. A short TMPDIR (e.g. /tmp) lets the forkserver start.", self.failure)
            return
        self.started_here = True
        atexit.register(shutil.rmtree, _bootstrap_errors_dir(), ignore_errors=True)


WORKER_SERVER = WorkerServer()


def start_worker_server(modules: Sequence[str]) -> None:
    """Start, in the background, the forkserver the workers will fork from, importing ``modules`` there
    (``ENGINE_MODULES`` and the run's task's ``preloaded_modules``)."""
    WORKER_SERVER.start(modules)


def prepare_workers(device: Any, *, validates: bool = True) -> None:
    """Start, in the background, the process that ``train(device=device)`` will fork its workers from.

    Optional: ``train()`` starts it itself, but only once it is called, and then waits for its
    imports (torch, torchvision, the engine, the tasks, the metrics: several seconds on a small
    machine). Called first thing in a script that trains on several devices, the imports run while
    the script imports torch and builds its model. The run's task is not known yet, so every
    declared task's module is imported; ``validates=False`` (for ``train(val=False)``) leaves out
    the metrics, which such a run never imports. Does nothing for one device, under torchrun (the
    ranks exist already) or where the platform has no forkserver; a ``device`` that names no
    devices is a ``DeviceSpecError``.
    """
    from zoo_core.devices import parse_device
    from zoo_core.plugin_manager import get_plugin_manager
    from zoo_core.tasks.base import Task

    if parse_device(device).multi_device and not torchrun_environment():
        tasks = [declaration.implementation.split(":")[0] for declaration in get_plugin_manager().tasks.values()]
        start_worker_server([*ENGINE_MODULES, *tasks, *(Task.validation_modules if validates else ())])


def launch(worker: Callable[[int, dict[str, Any]], Any], arguments: Mapping[str, bytes], plan: LaunchPlan) -> Any:
    """Run ``worker(local_rank, arguments)`` in ``plan.world_size`` processes and return rank 0's return value.

    ``arguments`` come from ``pickle_arguments``; each worker gets them unpickled. The first
    failure is raised as one exception naming its rank (E14); a rendezvous port clash is retried
    (E15). Rank 0's return value must pickle.
    """
    with private_workdir() as workdir:
        _write_arguments(workdir, arguments)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = plan.master_port or find_free_port()
            failure = _run_workers(worker, plan, workdir, port)
            if failure is None:
                break
            if failure.port_clash:
                if plan.master_port is not None:
                    raise MasterPortInUseError(
                        f"master port {plan.master_port} (from {plan.port_origin}) is already in use on {LOOPBACK}; "
                        "choose another port, or leave it unset and zoo picks a free one"
                    )
                if attempt < PORT_ATTEMPTS:
                    continue
            raise failure.exception()
        if not (workdir / _RESULT).is_file():
            raise WorkerFailedError("the workers exited without an error but rank 0 left no result; see their output above", rank=0)
        return pickle.loads((workdir / _RESULT).read_bytes())  # written by our own rank 0


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


def _run_workers(worker: Callable[[int, dict[str, Any]], Any], plan: LaunchPlan, workdir: Path, port: int) -> _Failure | None:
    """Start the workers and wait; the first failure stops the rest and is returned (None: success)."""
    import torch.multiprocessing as torch_mp

    errors_dir = workdir / _ERRORS
    errors_dir.mkdir(exist_ok=True)
    for stale in errors_dir.iterdir():
        stale.unlink()
    method = WORKER_SERVER.start_method()
    bootstrap_dir = _bootstrap_errors_dir() if method == "forkserver" else errors_dir
    with _worker_environment(bootstrap_dir):
        environment = dict(os.environ)
        context = torch_mp.start_processes(
            _worker_entry, args=(worker, str(workdir), plan.world_size, port, plan.cpu_threads, os.getpid(), environment,
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
        # The first error in time, but never a rank that only stopped because another one failed
        # (PeerFailedError): it may record before the rank that failed does.
        first = min(records, key=lambda record: (record.get("type", "").endswith(".PeerFailedError"), record["time"]))
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
WATCHDOG_SECONDS = 0.5  # how often a worker checks that the launching process still runs


def _release_forkserver_alive_fd() -> None:
    """Close this worker's copy of the write end of the forkserver's "alive" pipe.

    The forkserver exits when every copy of that pipe's write end is closed, which is meant to
    happen when the launching process dies. But multiprocessing hands a copy to every process the
    forkserver forks (so that it could fork from the same server), and while a worker held one, a
    dead launcher's forkserver stayed up, and with it the workers' parent: PR_SET_PDEATHSIG never
    fired, and workers of a parent killed by SIGTERM trained on for 13-16 s (until the zombie
    parent was reaped). zoo's workers never fork from the forkserver, so they give their copy up.
    """
    import multiprocessing.forkserver

    server = multiprocessing.forkserver._forkserver
    descriptor = getattr(server, "_forkserver_alive_fd", None)
    if descriptor is not None:
        with contextlib.suppress(OSError):
            os.close(descriptor)
        server._forkserver_alive_fd = None


def _die_with_parent(parent_pid: int) -> None:
    """Exit within about a second of the launching process's death, however it died (E21).

    Two mechanisms: PR_SET_PDEATHSIG on Linux (SIGKILL when the direct parent exits: the launching
    process when spawned, the forkserver under a forkserver, which exits once the launcher and its
    workers have closed the "alive" pipe, ``_release_forkserver_alive_fd``), and a watchdog thread
    that checks the launching process itself every ``WATCHDOG_SECONDS``. The watchdog counts a zombie
    as dead (``paths.process_alive`` reads ``/proc/<pid>/status``): a launcher killed while its own
    parent does not reap it stays a zombie, and ``os.kill(pid, 0)`` still finds it.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    _release_forkserver_alive_fd()
    direct_parent = os.getppid()
    if direct_parent == 1 or not process_alive(parent_pid):  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_SECONDS)
            if os.getppid() != direct_parent or not process_alive(parent_pid):
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


def _worker_entry(local_rank: int, worker: Callable[[int, dict[str, Any]], Any], workdir_text: str, world_size: int,
                  port: int, cpu_threads: int, parent_pid: int, environment: dict[str, str], output: None) -> None:
    """One worker process: take the launching process's environment, become rank ``local_rank`` (torchrun
    variables), run ``worker`` on the unpickled arguments and, on rank 0, leave its return value for the
    launcher. ``output`` was the launcher's stdout and stderr (``_LaunchersOutput``): unpickling it already
    made them this process's."""
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
        result = worker(local_rank, _read_arguments(workdir))
        if local_rank == 0:
            temporary = workdir / f".{_RESULT}.tmp"
            temporary.write_bytes(pickle.dumps(result))
            os.replace(temporary, workdir / _RESULT)
    except BaseException as error:
        _record_error(workdir / _ERRORS, local_rank, error)
        traceback.print_exc()
        # An explicit non-zero exit: torch's process wrapper would treat KeyboardInterrupt as a clean exit.
        sys.exit(1)
