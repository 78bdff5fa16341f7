"""What ``train()`` returns, the same for one device, spawn and torchrun."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TrainResult", "EpochReport"]


@dataclass
class EpochReport:
    """One epoch's numbers (a row of results.csv); what callbacks receive after each epoch."""

    epoch: int  # 1-based
    epochs: int
    losses: dict[str, float]
    metrics: dict[str, float]
    learning_rate: float
    fitness: float | None
    is_best: bool
    seconds: float
    run_dir: Path
    val_losses: dict[str, float] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """Flat ``{column: value}`` for results.csv."""
        return {
            "epoch": self.epoch,
            **{f"train/{name}": value for name, value in self.losses.items()},
            **{f"val/{name}": value for name, value in self.val_losses.items()},
            **{f"metrics/{name}": value for name, value in self.metrics.items()},
            "lr": self.learning_rate,
            "fitness": self.fitness if self.fitness is not None else "",
            "seconds": round(self.seconds, 3),
        }


@dataclass
class TrainResult:
    """The outcome of a training run.

    ``metrics`` are the validation metrics of the best epoch (of the last epoch when validation
    is off); ``history`` holds every epoch's report as a results.csv row.
    """

    run_dir: Path
    best: Path
    last: Path
    metrics: dict[str, float]
    best_fitness: float | None
    best_epoch: int | None
    epochs_completed: int
    stopped_early: bool
    world_size: int
    batch: int
    accumulate: int
    history: list[dict[str, Any]] = field(default_factory=list)
