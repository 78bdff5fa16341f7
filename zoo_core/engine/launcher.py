"""Spawn training (DESIGN.md E1): one worker process per device, supervised by the caller.

The parent checks everything that can be checked before a process exists — spawn support
(E13), batch divisibility (E5), that every argument pickles (E4) — prepares the data (E17),
measures autobatch (E7), and writes the model's weights and the pickled arguments into a private
temp directory. ``torch.multiprocessing`` then starts one worker per device with the spawn
method. Each worker sets the torchrun variables and runs ``run_rank``, the code path a torchrun
launch runs. The parent watches the workers: the first failure stops the others and is raised as
one exception naming the rank (E14); a port clash on the rendezvous is retried on a fresh port
(E15); workers die with the parent (E21). On success rank 0's best weights are loaded into the
caller's model. The temp directory is removed whatever happens.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import importlib
import json
import multiprocessing.connection
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from zoo_core.engine.autobatch import check_divisible, global_batch_from_probe, probe_batch_size
from zoo_core.engine.config import TrainConfig
from zoo_core.engine.devices import DevicePlan
from zoo_core.engine.distributed import LOOPBACK, find_free_port, is_address_in_use_error
from zoo_core.engine.results import TrainResult
from zoo_core.engine.seeding import seed_everything
from zoo_core.engine.trainer import SPAWN_ERROR_DIRECTORY, SPAWNED_WORKER_MARKER, adapt_model_to_data, run_rank
from zoo_core.errors import (
    MasterPortInUseError,
    SpawnGuardError,
    SpawnNotSupportedError,
    UnpicklableArgumentError,
    WorkerFailedError,
)
from zoo_core.plugin_manager import get_plugin_manager, reset_plugin_manager
from zoo_core.tasks import get_task
from zoo_core.tasks.runner import check_image_size
from zoo_core.weights import ModelMeta, save_safetensors

if TYPE_CHECKING:
    from zoo_core.facade import LibreYOLO

__all__ = ["spawn_training", "record_worker_error", "PORT_ATTEMPTS"]

PORT_ATTEMPTS = 3
GRACE_SECONDS = 3.0  # how long the other workers get to exit on their own after a failure
_PAYLOAD = "payload.pkl"
_RESULT = "result.pkl"
_ERRORS = "errors"
_WEIGHTS = "initial.safetensors"
_TYPED_ERRORS = {cls.__name__: cls for cls in (SpawnGuardError, UnpicklableArgumentError)}
_PICKLE_HINT = (
    "Training on several devices sends every argument to the worker processes by pickling: use a "
    "class defined at module level of an importable module (not a lambda, a closure, or a class "
    "defined inside a function or under `if __name__ == \"__main__\":`), or the built-in loggers: "
    "loggers=['csv', 'tensorboard']."
)


# --------------------------------------------------------------------------- parent side
def spawn_training(libre: "LibreYOLO", config: TrainConfig, plan: DevicePlan, *, resume_from: Path | None = None) -> TrainResult:
    """Train ``libre`` with one spawned worker per device of ``plan``; see the module docstring."""
    manager = get_plugin_manager()
    world_size = plan.world_size
    if not manager.supports_spawn(libre.family):
        raise SpawnNotSupportedError(
            f"the {libre.family!r} family's plugin does not support spawning one process per device, so "
            f"device={config.device!r} cannot start {world_size} workers from train(). Launch the ranks "
            f"with torchrun instead, from a script that calls model.train(...) without several devices:\n\n"
            f"    torchrun --nproc_per_node={world_size} your_script.py\n\n"
            f"(Python API: LibreYOLO({libre.name!r}).train(data=...) inside that script.)"
        )
    if config.batch != -1:
        check_divisible(config.batch, world_size)
    arguments = _worker_arguments(libre, config, manager)
    encoded = {name: _pickle_argument(name, value) for name, value in arguments.items()}

    task = get_task(libre.task)
    spec = task.prepare(config.data)
    image_size = check_image_size(libre.task, config.imgsz or libre.input_size)
    batch = config.batch
    if batch == -1:
        per_device = probe_batch_size(copy.deepcopy(libre.model), task, image_size, plan.torch_device(0), max(libre.num_classes, 1))
        batch = global_batch_from_probe(per_device, world_size, config.nbs)
    seed_everything(config.seed)
    model, names, num_classes = adapt_model_to_data(libre, spec)
    meta = ModelMeta(libre.family, libre.size, libre.task, num_classes, names, image_size, "", dict(libre.options))
    encoded.update({
        "spec": pickle.dumps(spec),
        "batch": pickle.dumps(batch),
        "resume_from": pickle.dumps(resume_from),
        "device_plan": pickle.dumps(plan),
    })

    with tempfile.TemporaryDirectory(prefix="zoo-spawn-") as directory:
        workdir = Path(directory)
        save_safetensors(workdir / _WEIGHTS, model.state_dict(), meta)
        (workdir / _PAYLOAD).write_bytes(pickle.dumps(encoded))
        user_port = config.master_port or (int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else None)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = user_port or find_free_port()
            failure = _run_workers(workdir, world_size, port, plan)
            if failure is None:
                break
            if failure.port_clash:
                if user_port is not None:
                    raise MasterPortInUseError(
                        f"master port {user_port} (from {'master_port=' if config.master_port else 'MASTER_PORT'}) is "
                        f"already in use on {LOOPBACK}; choose another port, or leave it unset and zoo picks a free one"
                    )
                if attempt < PORT_ATTEMPTS:
                    continue
            raise failure.exception()
        if not (workdir / _RESULT).is_file():
            raise WorkerFailedError("the training workers exited without an error but rank 0 left no result; see their output above", rank=0)
        with (workdir / _RESULT).open("rb") as stream:
            result: TrainResult = pickle.load(stream)  # written by our own rank 0 into our private directory
    import torch

    best = torch.load(result.best, map_location="cpu", weights_only=True)["model"]
    model.load_state_dict(best)
    libre.model, libre.names, libre.num_classes = model.eval(), names, num_classes
    libre.input_size, libre.weights_path = image_size, result.best
    return result


def _worker_arguments(libre: "LibreYOLO", config: TrainConfig, manager: Any) -> dict[str, Any]:
    """Everything user-supplied the workers need, by name, so a pickling error can name it."""
    arguments: dict[str, Any] = {"config": config.model_copy(update={"callbacks": []})}
    for index, callback in enumerate(config.callbacks):
        arguments[f"callbacks[{index}]"] = callback
    for name, plugin in manager.runtime_plugins:
        arguments[f"plugin {name!r}"] = plugin
    arguments["plugin settings"] = {"blocked": sorted(manager.blocked_names), "autoload": manager.autoload,
                                    "runtime": [name for name, _ in manager.runtime_plugins]}
    return arguments


def _pickle_argument(name: str, value: Any) -> bytes:
    try:
        return pickle.dumps(value)
    except Exception as error:
        raise UnpicklableArgumentError(f"{name} = {value!r} cannot be sent to the training workers ({error}). {_PICKLE_HINT}") from None


@contextlib.contextmanager
def _worker_environment(error_directory: Path) -> Iterator[None]:
    """Mark the environment the children inherit, only while they are being started."""
    saved = {name: os.environ.get(name) for name in (SPAWNED_WORKER_MARKER, SPAWN_ERROR_DIRECTORY)}
    os.environ[SPAWNED_WORKER_MARKER] = "1"
    os.environ[SPAWN_ERROR_DIRECTORY] = str(error_directory)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
        error_class = _TYPED_ERRORS.get(record.get("type", "").rsplit(".", 1)[-1])
        if error_class is not None:
            return error_class(record["message"])
        if record:
            return WorkerFailedError(
                f"training worker rank {self.rank} failed: {record['type']}: {record['message']}\n\n"
                f"--- traceback of rank {self.rank} ---\n{record['traceback']}",
                rank=self.rank, worker_traceback=record["traceback"],
            )
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


def _run_workers(workdir: Path, world_size: int, port: int, plan: DevicePlan) -> _Failure | None:
    """Start the workers and wait; the first failure stops the rest and is returned (None: success)."""
    import torch.multiprocessing as torch_mp

    errors = workdir / _ERRORS
    errors.mkdir(exist_ok=True)
    for stale in errors.iterdir():
        stale.unlink()
    cpu_threads = max(1, (os.cpu_count() or 1) // world_size) if plan.kind == "cpu" else 0
    with _worker_environment(errors):
        context = torch_mp.start_processes(
            _worker_main, args=(str(workdir), world_size, port, cpu_threads, os.getpid()),
            nprocs=world_size, join=False, start_method="spawn",
        )
    processes = list(context.processes)
    try:
        return _wait(processes, errors)
    finally:
        _stop(processes)


def _wait(processes: list[Any], errors: Path) -> _Failure | None:
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
            return _first_failure(failed, processes, errors)
    return None


def _first_failure(failed: list[int], processes: list[Any], errors: Path) -> _Failure:
    records = []
    for path in errors.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(path.read_text(encoding="utf-8")))
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
def record_worker_error(errors: Path, rank: int | None, error: BaseException) -> None:
    """Leave ``error`` (type, message, traceback, time) where the parent reads it."""
    errors.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "pid": os.getpid(),
        "type": f"{type(error).__module__}.{type(error).__qualname__}",
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
        "time": time.time(),
    }
    target = errors / f"{'bootstrap' if rank is None else f'rank{rank}'}-{os.getpid()}.json"
    temporary = target.with_suffix(".tmp")
    temporary.write_text(json.dumps(record), encoding="utf-8")
    os.replace(temporary, target)


def _die_with_parent(parent_pid: int) -> None:
    """Exit as soon as the parent dies (E21): PR_SET_PDEATHSIG on Linux, plus a watchdog thread."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="zoo-parent-watchdog", daemon=True).start()


def _unpickle_arguments(workdir: Path) -> dict[str, Any]:
    encoded: dict[str, bytes] = pickle.loads((workdir / _PAYLOAD).read_bytes())  # our own private file
    settings = pickle.loads(encoded["plugin settings"])
    manager = reset_plugin_manager(block=settings["blocked"], autoload=settings["autoload"])
    decoded: dict[str, Any] = {}
    for name, data in encoded.items():
        try:
            decoded[name] = pickle.loads(data)
        except Exception as error:
            raise UnpicklableArgumentError(
                f"{name} could not be re-created in a training worker ({type(error).__name__}: {error}). Its class "
                "is probably defined under `if __name__ == \"__main__\":` or in a notebook, which the workers "
                f"cannot import. {_PICKLE_HINT}"
            ) from None
        if name.startswith("plugin '"):
            plugin_name = name[len("plugin '"):-1]
            plugin = decoded[name]
            manager.register_family_plugin(importlib.import_module(plugin) if isinstance(plugin, str) else plugin, plugin_name)
    return decoded


def _worker_main(local_rank: int, workdir_text: str, world_size: int, port: int, cpu_threads: int, parent_pid: int) -> None:
    """One spawned worker: become rank ``local_rank`` and run the torchrun code path."""
    _die_with_parent(parent_pid)
    workdir = Path(workdir_text)
    os.environ.update({
        "RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port),
    })
    try:
        import torch

        if cpu_threads:
            torch.set_num_threads(cpu_threads)
        arguments = _unpickle_arguments(workdir)
        from zoo_core.facade import LibreYOLO

        libre = LibreYOLO(workdir / _WEIGHTS)  # family, size, classes and builder options from its metadata
        count = sum(1 for name in arguments if name.startswith("callbacks["))
        callbacks = [arguments[f"callbacks[{index}]"] for index in range(count)]
        config: TrainConfig = arguments["config"].model_copy(update={"callbacks": callbacks})
        plan: DevicePlan = arguments["device_plan"]

        def keep_result(result: TrainResult) -> None:
            (workdir / _RESULT).write_bytes(pickle.dumps(result))

        run_rank(
            libre, config, device=plan.torch_device(local_rank), spec=arguments["spec"], batch=arguments["batch"],
            resume_from=arguments["resume_from"], on_result=keep_result,
        )
    except BaseException as error:
        record_worker_error(workdir / _ERRORS, local_rank, error)
        traceback.print_exc()
        # An explicit non-zero exit: torch's process wrapper would treat KeyboardInterrupt as a clean exit.
        sys.exit(1)
