"""User callbacks and the built-in loggers. Only rank 0 calls them (E9, docs/architecture.md).

A callback is an object with any of the methods of ``Callback``. Training workers receive
callbacks by pickling, so define callback classes at module level (E4, E20); the built-in
loggers (``loggers=["csv", "tensorboard"]``) need nothing at all.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any, Callable, Iterable

from zoo_core.engine.train_result import EpochReport, TrainResult
from zoo_core.errors import warn

__all__ = ["Callback", "CsvLogger", "TensorBoardLogger", "CallbackList", "make_loggers"]

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


class CsvLogger(Callback):
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


class TensorBoardLogger(Callback):
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


_LOGGERS = {"csv": CsvLogger, "tensorboard": TensorBoardLogger}
_BUILTIN_LOGGERS = tuple(_LOGGERS.values())


def make_loggers(names: Iterable[str]) -> list[Callback]:
    """The built-in loggers named in ``loggers=``."""
    return [_LOGGERS[name]() for name in names]


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
        builtin = [callback for callback in self.callbacks if isinstance(callback, _BUILTIN_LOGGERS)]
        user = [callback for callback in self.callbacks if not isinstance(callback, _BUILTIN_LOGGERS)]
        for index, callback in enumerate([*builtin, *user]):
            method = getattr(callback, event, None)
            if not callable(method):
                continue
            if before_user is not None and index >= len(builtin):
                before_user()
                before_user = None
            method(*args)
