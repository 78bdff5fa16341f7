"""User callbacks and the built-in loggers. Only rank 0 calls them (E9, docs/architecture.md).

A callback is an object with any of the methods of ``Callback``, or a function given with an
event: ``model.add_callback("on_train_epoch_end", fn)`` (Ultralytics' event names, ``EVENTS``),
which wraps it in a ``FunctionCallback``. A plain function in ``callbacks=[...]`` is refused,
naming ``add_callback``: it says nothing about when it should run. Training workers receive
callbacks by pickling, so define callback classes and functions at module level (E4, E20); the
built-in loggers (``loggers=["csv", "tensorboard"]``) need nothing at all.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any, Callable, Iterable

from zoo_core.engine.train_result import EpochReport, TrainResult
from zoo_core.errors import TrainConfigError, excerpt, warn

__all__ = ["Callback", "FunctionCallback", "EVENTS", "function_callback", "check_callbacks", "CsvLogger",
           "TensorBoardLogger", "BuiltinLogger", "CallbackList", "make_loggers"]

log = logging.getLogger("zoo.train")


class Callback:
    """Base class of training callbacks; override the events you need.

    Each event receives plain data: ``on_train_start(run_dir, config)`` (the config as a dict),
    ``on_optimizer_step(step)`` after every optimizer step, ``on_epoch_end(report)`` with an
    ``EpochReport`` after validation and checkpointing, and ``on_train_end(result)`` with the
    ``TrainResult``.
    """

    def on_train_start(self, run_dir: Path, config: dict[str, Any]) -> None:
        """Called once, after the run directory exists and before the first epoch."""

    def on_optimizer_step(self, step: int) -> None:
        """Called after every optimizer step (``step`` counts from 1 over the whole run)."""

    def on_epoch_end(self, report: EpochReport) -> None:
        """Called after every epoch's validation and checkpoint."""

    def on_train_end(self, result: TrainResult) -> None:
        """Called once when training ends (also after early stopping)."""


# The event names add_callback takes (Ultralytics' and zoo's own), each to the Callback method it runs as.
# Zoo has one end-of-epoch event, after validation and the checkpoint: Ultralytics' on_train_epoch_end
# (before validation there) and on_fit_epoch_end (after it) both run there, with the epoch's EpochReport.
EVENTS: dict[str, str] = {
    "on_train_start": "on_train_start",
    "optimizer_step": "on_optimizer_step",
    "on_optimizer_step": "on_optimizer_step",
    "on_train_epoch_end": "on_epoch_end",
    "on_fit_epoch_end": "on_epoch_end",
    "on_epoch_end": "on_epoch_end",
    "on_train_end": "on_train_end",
}
_METHODS = ("on_train_start", "on_optimizer_step", "on_epoch_end", "on_train_end")


class FunctionCallback(Callback):
    """A function that runs at one event (``function_callback`` makes the subclass for the event).

    The function receives the event's arguments: ``(run_dir, config)``, ``(step)``, ``(report)`` or
    ``(result)``. It pickles to the training workers when the function does (a module-level function).
    """

    def __init__(self, event: str, function: Callable[..., Any]) -> None:
        self.event = event
        self.function = function

    def __repr__(self) -> str:
        return f"add_callback({self.event!r}, {self.function!r})"


class _TrainStartFunction(FunctionCallback):
    def on_train_start(self, run_dir: Path, config: dict[str, Any]) -> None:
        self.function(run_dir, config)


class _OptimizerStepFunction(FunctionCallback):
    def on_optimizer_step(self, step: int) -> None:
        self.function(step)


class _EpochEndFunction(FunctionCallback):
    def on_epoch_end(self, report: EpochReport) -> None:
        self.function(report)


class _TrainEndFunction(FunctionCallback):
    def on_train_end(self, result: TrainResult) -> None:
        self.function(result)


# One class per method, so only the wrapped event is overridden (CallbackList calls per-step listeners only).
_FUNCTION_CLASSES = {"on_train_start": _TrainStartFunction, "on_optimizer_step": _OptimizerStepFunction,
                     "on_epoch_end": _EpochEndFunction, "on_train_end": _TrainEndFunction}


def function_callback(event: str, function: Callable[..., Any]) -> FunctionCallback:
    """``function`` as a callback run at ``event`` (a key of ``EVENTS``); ``TrainConfigError`` for anything else."""
    import difflib

    if not isinstance(event, str) or event not in EVENTS:
        close = difflib.get_close_matches(str(event), list(EVENTS), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise TrainConfigError(f"add_callback: unknown event {excerpt(event)}.{hint} Events: {', '.join(EVENTS)}")
    if not callable(function):
        raise TrainConfigError(f"add_callback({event!r}, ...): {excerpt(function)} is not callable; give a function")
    return _FUNCTION_CLASSES[EVENTS[event]](event, function)


def check_callbacks(callbacks: Iterable[Any]) -> None:
    """``TrainConfigError`` for an entry of ``callbacks=`` that no event would ever call (a plain function, say)."""
    for index, callback in enumerate(callbacks):
        if any(callable(getattr(callback, method, None)) for method in _METHODS):
            continue
        if callable(callback):
            raise TrainConfigError(
                f"callbacks[{index}] = {excerpt(callback)} is a plain function, which says nothing about when it should "
                "run, so zoo would never call it. Give it an event: model.add_callback('on_train_epoch_end', fn) "
                f"(events: {', '.join(EVENTS)}), or pass a Callback subclass"
            )
        raise TrainConfigError(
            f"callbacks[{index}] = {excerpt(callback)} has none of the callback methods ({', '.join(_METHODS)}), so zoo "
            "would never call it: subclass zoo_core.engine.callbacks.Callback, or use model.add_callback(event, fn)"
        )


class BuiltinLogger(Callback):
    """Base of the loggers ``loggers=`` names: they run before user callbacks at every event."""


class CsvLogger(BuiltinLogger):
    """Appends each epoch to ``results.csv`` in the run directory (a new column set restarts the header)."""

    def __init__(self) -> None:
        self.path: Path | None = None

    def on_train_start(self, run_dir: Path, config: dict[str, Any]) -> None:
        self.path = run_dir / "results.csv"

    def on_epoch_end(self, report: EpochReport) -> None:
        assert self.path is not None, "on_train_start was not called"
        row = report.row()
        exists = self.path.exists() and self.path.stat().st_size > 0
        with self.path.open("a", newline="", encoding="utf-8") as stream:
            writer = csv.DictWriter(stream, fieldnames=list(row))
            if not exists:
                writer.writeheader()
            writer.writerow(row)


class TensorBoardLogger(BuiltinLogger):
    """Writes losses, metrics and the learning rate to TensorBoard event files in the run directory."""

    def __init__(self) -> None:
        self.writer: Any = None

    def on_train_start(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            warn("loggers=['tensorboard'] needs the tensorboard package (pip install tensorboard); skipping it")
            return
        self.writer = SummaryWriter(log_dir=str(run_dir))

    def on_epoch_end(self, report: EpochReport) -> None:
        if self.writer is None:
            return
        for key, value in report.row().items():
            if key not in ("epoch", "seconds") and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, report.epoch)
        self.writer.flush()

    def on_train_end(self, result: TrainResult) -> None:
        if self.writer is not None:
            self.writer.close()




def make_loggers(names: Iterable[str]) -> list[Callback]:
    """The built-in loggers named in ``loggers=`` (the experiment trackers' module loads only when named)."""
    classes: dict[str, type[BuiltinLogger]] = {"csv": CsvLogger, "tensorboard": TensorBoardLogger}
    names = list(names)
    if {"mlflow", "wandb"} & set(names):
        from zoo_core.engine.experiment_loggers import MlflowLogger, WandbLogger

        classes.update(mlflow=MlflowLogger, wandb=WandbLogger)
    return [classes[name]() for name in names]


class CallbackList:
    """Calls every callback's event in order; a callback that raises stops training with its error."""

    def __init__(self, callbacks: Iterable[Any]) -> None:
        self.callbacks = list(callbacks)
        # Per-step events are frequent: remember once which callbacks listen.
        self.step_listeners = [callback.on_optimizer_step for callback in self.callbacks
                               if callable(getattr(callback, "on_optimizer_step", None))
                               and type(callback).on_optimizer_step is not Callback.on_optimizer_step]

    def fire(self, event: str, *args: Any, before_user: Callable[[], None] | None = None) -> None:
        """Call ``event`` on each callback that defines it: the built-in loggers first, then yours.

        ``before_user`` runs once before the first user callback (the trainer waits there for the
        checkpoint write, so your callbacks always find ``last.pt`` on disk).
        """
        builtin = [callback for callback in self.callbacks if isinstance(callback, BuiltinLogger)]
        user = [callback for callback in self.callbacks if not isinstance(callback, BuiltinLogger)]
        for index, callback in enumerate([*builtin, *user]):
            method = getattr(callback, event, None)
            if not callable(method):
                continue
            if before_user is not None and index >= len(builtin):
                before_user()
                before_user = None
            method(*args)
