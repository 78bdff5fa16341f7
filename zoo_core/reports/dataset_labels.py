"""``labels.jpg``: what a detection training set holds, before a single step is taken.

Three panels: instances per class, where box centres fall (x, y) and box widths against heights,
both as fractions of the image. Drawn from the labels the dataset holds (corners ``x1 y1 x2 y2``,
normalised), not from images; the centres and sizes are computed from those corners here.

A panel must be readable for ten boxes and for a hundred thousand: up to ``SCATTER_LIMIT`` boxes
each is a dot whose opacity falls with the count (so overlaps darken), beyond that the panel is a
2-D histogram on a logarithmic colour scale whose lightest colour is still a clear blue (on the
plain ``Blues`` map a bin holding one box is drawn almost white).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from zoo_core.reports.drawing import class_colour
from zoo_core.reports.figures import new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["SCATTER_LIMIT", "LabelStatistics", "label_statistics", "detection_labels_figure", "plot_detection_labels"]

SCATTER_LIMIT = 5000
"""Up to this many boxes the centre and size panels draw one dot per box; beyond it, a 2-D histogram."""


@dataclass
class LabelStatistics:
    """The numbers ``labels.jpg`` plots, one row per box: ``classes`` (n), ``centres`` and ``sizes`` (n×2, normalised)."""

    classes: np.ndarray
    centres: np.ndarray
    sizes: np.ndarray


def label_statistics(labels: Sequence[np.ndarray]) -> LabelStatistics:
    """Classes, centres ``(x, y)`` and sizes ``(w, h)`` of ``labels`` (one ``n×5`` array per image: class, x1, y1, x2, y2)."""
    rows = np.concatenate([np.asarray(part, dtype=np.float64).reshape(-1, 5) for part in labels]) if labels else np.zeros((0, 5))
    corners_low, corners_high = rows[:, 1:3], rows[:, 3:5]
    return LabelStatistics(classes=rows[:, 0].astype(int), centres=(corners_low + corners_high) / 2, sizes=corners_high - corners_low)


def _readable_blues():
    """``Blues`` without its near-white lower third, so the emptiest non-empty bin still shows."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    return ListedColormap(colormaps["Blues"](np.linspace(0.35, 1.0, 256)), name="zoo_blues")


def _density_panel(figure: "Figure", axis, points: np.ndarray) -> None:
    """One dot per point (opacity by count) or, for many points, a log-scaled 2-D histogram with a colour bar."""
    from matplotlib.colors import LogNorm

    if len(points) == 0:
        return
    if len(points) <= SCATTER_LIMIT:
        # Fully opaque for a few dots; fainter as they multiply so a crowd reads as density, never below 0.1.
        alpha = float(np.clip(20.0 / np.sqrt(len(points)), 0.1, 1.0))
        axis.scatter(points[:, 0], points[:, 1], s=6, color="#1f4e9c", alpha=alpha, linewidths=0)
        return
    _, _, _, mesh = axis.hist2d(points[:, 0], points[:, 1], bins=50, range=[[0, 1], [0, 1]], cmap=_readable_blues(),
                                norm=LogNorm(vmin=1), cmin=1)
    figure.colorbar(mesh, ax=axis, label="boxes")


def detection_labels_figure(labels: Sequence[np.ndarray], names: Mapping[int, str]) -> "Figure":
    """The ``labels.jpg`` figure of ``labels`` (one ``n×5`` array per image: class, x1, y1, x2, y2, normalised)."""
    statistics = label_statistics(labels)
    count = max(len(names), 1)
    figure, axes = new_figure(1, 3, panel_size=(4.2, 3.8))
    histogram, centres, sizes = axes[0]
    classes = statistics.classes
    instances = np.bincount(classes, minlength=count)[:count] if len(classes) else np.zeros(count, dtype=int)
    colours = [tuple(channel / 255 for channel in class_colour(index)) for index in range(count)]
    histogram.bar(range(count), instances, color=colours)
    histogram.set_title(f"{len(classes)} boxes in {len(labels)} images")
    histogram.set_ylabel("instances")
    if count <= 30:
        histogram.set_xticks(range(count), [str(names.get(index, index)) for index in range(count)], rotation=90, fontsize=7)
    for axis, points, (x_label, y_label) in ((centres, statistics.centres, ("x", "y")),
                                             (sizes, statistics.sizes, ("width", "height"))):
        _density_panel(figure, axis, points)
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1)
        axis.set_xlabel(x_label)
        axis.set_ylabel(y_label)
        axis.set_aspect("equal")
    centres.invert_yaxis()  # image coordinates: y grows downwards
    centres.set_title("box centres")
    sizes.set_title("box sizes")
    return figure


def plot_detection_labels(labels: Sequence[np.ndarray], names: Mapping[int, str], path: Path) -> Path:
    """Draw ``labels`` (one ``n×5`` array per image: class, x1, y1, x2, y2, normalised) to ``path``."""
    return save_figure(detection_labels_figure(labels, names), path)
