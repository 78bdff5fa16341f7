"""A bar chart of one score per class (semantic segmentation's per-class IoU)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

from zoo_core.reports.drawing import class_colour
from zoo_core.reports.figures import new_figure, save_figure

__all__ = ["plot_class_scores"]


def plot_class_scores(scores: torch.Tensor, names: Mapping[int, str], path: Path, score_name: str) -> Path:
    """Draw ``scores`` (one per class, in class order) as bars named by ``names``."""
    values = scores.detach().float().cpu().tolist()
    count = len(values)
    figure, axes = new_figure(1, 1, panel_size=(min(3.0 + 0.4 * count, 16.0), 4.0))
    axis = axes[0, 0]
    colours = [tuple(channel / 255 for channel in class_colour(index)) for index in range(count)]
    axis.bar(range(count), values, color=colours)
    axis.set_xticks(range(count), [str(names.get(index, index)) for index in range(count)], rotation=90 if count > 8 else 0, fontsize=8)
    axis.set_ylim(0, 1)
    axis.set_ylabel(score_name)
    axis.set_title(f"{score_name} per class")
    return save_figure(figure, path)
