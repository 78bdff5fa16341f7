"""``labels.jpg``: what a detection training set holds, before a single step is taken.

Three panels: instances per class, where box centres fall, and box widths against heights
(both as fractions of the image). Drawn from the YOLO-format labels, not from images.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from zoo_core.reports.drawing import class_colour
from zoo_core.reports.figures import new_figure, save_figure

__all__ = ["plot_detection_labels"]


def plot_detection_labels(labels: Sequence[np.ndarray], names: Mapping[int, str], path: Path) -> Path:
    """Draw ``labels`` (one ``n×5`` array per image: class, centre x, centre y, width, height, normalised) to ``path``."""
    rows = np.concatenate([np.asarray(part, dtype=np.float64).reshape(-1, 5) for part in labels]) if labels else np.zeros((0, 5))
    classes = rows[:, 0].astype(int)
    count = max(len(names), 1)
    figure, axes = new_figure(1, 3, panel_size=(4.2, 3.8))
    histogram, centres, sizes = axes[0]
    instances = np.bincount(classes, minlength=count)[:count] if len(classes) else np.zeros(count, dtype=int)
    colours = [tuple(channel / 255 for channel in class_colour(index)) for index in range(count)]
    histogram.bar(range(count), instances, color=colours)
    histogram.set_title(f"{len(rows)} boxes in {len(labels)} images")
    histogram.set_ylabel("instances")
    if count <= 30:
        histogram.set_xticks(range(count), [str(names.get(index, index)) for index in range(count)], rotation=90, fontsize=7)
    for axis, (x_column, y_column), (x_label, y_label) in (
        (centres, (1, 2), ("x", "y")),
        (sizes, (3, 4), ("width", "height")),
    ):
        if len(rows):
            axis.hist2d(rows[:, x_column], rows[:, y_column], bins=40, range=[[0, 1], [0, 1]], cmap="Blues", cmin=1)
        axis.set_xlim(0, 1)
        axis.set_ylim(0, 1)
        axis.set_xlabel(x_label)
        axis.set_ylabel(y_label)
        axis.set_aspect("equal")
    centres.invert_yaxis()  # image coordinates: y grows downwards
    centres.set_title("box centres")
    sizes.set_title("box sizes")
    return save_figure(figure, path)
