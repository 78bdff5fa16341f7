"""``results.png``: training curves drawn from ``results.csv`` with matplotlib."""

from __future__ import annotations

import csv
from pathlib import Path

__all__ = ["plot_results"]


def plot_results(csv_path: Path, output: Path | None = None) -> Path | None:
    """Draw every numeric column of ``csv_path`` against the epoch; returns the PNG path (None if no data)."""
    if not csv_path.exists():
        return None
    with csv_path.open(newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = [key for key in rows[0] if key not in ("epoch", "seconds") and _numeric(rows[0][key])]
    epochs = [int(row["epoch"]) for row in rows]
    count = max(len(columns), 1)
    width = min(count, 5)
    height = (count + width - 1) // width
    figure, axes = plt.subplots(height, width, figsize=(3.2 * width, 2.6 * height), squeeze=False, tight_layout=True)
    for axis, column in zip(axes.flat, columns):
        values = [float(row[column]) if _numeric(row[column]) else float("nan") for row in rows]
        axis.plot(epochs, values, marker="o", markersize=3, linewidth=1.5)
        axis.set_title(column, fontsize=9)
        axis.set_xlabel("epoch", fontsize=8)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(columns):]:
        axis.axis("off")
    output = output or csv_path.with_name("results.png")
    figure.savefig(output, dpi=120)
    plt.close(figure)
    return output


def _numeric(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True
