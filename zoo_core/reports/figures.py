"""Matplotlib figures drawn without ``pyplot``.

Every chart is a ``Figure`` with the Agg canvas attached directly, so drawing leaves the caller's
matplotlib backend (a notebook's, say) and global state as they were.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["new_figure", "save_figure"]


def new_figure(rows: int = 1, columns: int = 1, panel_size: tuple[float, float] = (4.0, 3.2)) -> tuple["Figure", Any]:
    """A figure with a ``rows×columns`` array of axes (always 2-D) on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(panel_size[0] * columns, panel_size[1] * rows), tight_layout=True)
    FigureCanvasAgg(figure)
    return figure, figure.subplots(rows, columns, squeeze=False)


def save_figure(figure: "Figure", path: Path, dpi: int = 120) -> Path:
    """Write ``figure`` to ``path`` (PNG or JPEG by suffix) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path
