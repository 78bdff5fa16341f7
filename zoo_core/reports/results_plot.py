"""``results.png``: the training curves of ``results.csv``.

One panel per training loss, per validation loss and per metric (in that order), epochs on
integer ticks; the ``fitness`` column is drawn once, the learning rate and timings not at all.
"""

from __future__ import annotations

import csv
from pathlib import Path

from zoo_core.reports.figures import new_figure, save_figure

__all__ = ["plot_results", "plotted_columns"]

_NOT_PLOTTED = ("epoch", "seconds", "lr")
_PANEL_ORDER = ("train/", "val/", "metrics/")


def plot_results(csv_path: Path, output: Path | None = None) -> Path | None:
    """Draw every numeric column of ``csv_path`` against the epoch; returns the PNG path (None if no data)."""
    if not csv_path.exists():
        return None
    with csv_path.open(newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    if not rows:
        return None
    from matplotlib.ticker import MaxNLocator

    columns = plotted_columns([key for key in rows[0] if any(_numeric(row[key]) for row in rows)])
    epochs = [int(row["epoch"]) for row in rows]
    count = max(len(columns), 1)
    width = min(count, 5)
    figure, axes = new_figure((count + width - 1) // width, width, panel_size=(3.2, 2.6))
    for axis, column in zip(axes.flat, columns):
        values = [float(row[column]) if _numeric(row[column]) else float("nan") for row in rows]
        axis.plot(epochs, values, marker="o", markersize=3, linewidth=1.5)
        axis.set_title(column, fontsize=9)
        axis.set_xlabel("epoch", fontsize=8)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(columns):]:
        axis.axis("off")
    return save_figure(figure, output or csv_path.with_name("results.png"))


def plotted_columns(numeric_columns: list[str]) -> list[str]:
    """The results.csv columns that get a panel, in panel order: training losses, validation losses, metrics."""
    columns = [name for name in numeric_columns if name not in _NOT_PLOTTED]
    if "fitness" in columns and "metrics/fitness" in columns:  # the same numbers twice
        columns.remove("fitness")
    return sorted(columns, key=lambda name: next((rank for rank, prefix in enumerate(_PANEL_ORDER) if name.startswith(prefix)), len(_PANEL_ORDER)))


def _numeric(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True
