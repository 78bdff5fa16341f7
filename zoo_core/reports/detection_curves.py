"""Precision-recall, precision, recall and F1 curves of a detection validation.

They are read from COCO's evaluation table at IoU 0.5 (torchmetrics' ``extended_summary``):
for every class, the interpolated precision and the detection score at 101 recall levels. The
confidence curves follow from it: at score threshold ``c`` a class reaches the largest recall
whose score is at least ``c``, at that recall's precision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from zoo_core.reports.figures import new_figure, save_figure

__all__ = ["DetectionCurves", "plot_detection_curves"]

_CONFIDENCES = 201
_MOST_CLASSES_DRAWN = 20  # more lines than this are a blur; the mean is always drawn


class DetectionCurves:
    """Per-class curves from a torchmetrics ``MeanAveragePrecision(extended_summary=True)`` result."""

    def __init__(self, values: Mapping[str, object]) -> None:
        precision = torch.as_tensor(values["precision"])[0, :, :, 0, -1].double()  # IoU .5, all areas, 100 detections
        scores = torch.as_tensor(values["scores"])[0, :, :, 0, -1].double()
        classes = torch.as_tensor(values["classes"]).reshape(-1)
        self.recall_levels = torch.linspace(0, 1, precision.shape[0], dtype=torch.float64)
        # -1 marks a class without true boxes (or a recall never reached): such levels count as precision 0.
        self.precision = precision.clamp(min=0).T  # classes × recall levels
        self.scores = scores.T
        self.present = (precision >= 0).any(dim=0)
        self.classes = [int(value) for value in classes.tolist()]
        self.confidences = torch.linspace(0, 1, _CONFIDENCES, dtype=torch.float64)
        reached = self.scores[:, None, :] >= self.confidences[None, :, None]  # class × confidence × recall level
        reached &= self.precision[:, None, :] > 0
        levels = torch.where(reached, torch.arange(self.scores.shape[1]), -1).amax(dim=2)  # the largest recall still reached
        self.recall_at = torch.where(levels >= 0, self.recall_levels[levels.clamp(min=0)], torch.zeros((), dtype=torch.float64))
        self.precision_at = torch.where(levels >= 0, self.precision.gather(1, levels.clamp(min=0)), torch.ones((), dtype=torch.float64))
        total = self.precision_at + self.recall_at
        self.f1_at = torch.where(total > 0, 2 * self.precision_at * self.recall_at / total.clamp(min=1e-12), torch.zeros((), dtype=torch.float64))

    def average_precision(self) -> torch.Tensor:
        """AP at IoU 0.5 per class (the mean of the 101 interpolated precisions)."""
        return self.precision.mean(dim=1)


def plot_detection_curves(values: Mapping[str, object], names: Mapping[int, str], folder: Path) -> list[Path]:
    """Write ``PR_curve.png``, ``P_curve.png``, ``R_curve.png`` and ``F1_curve.png`` into ``folder``."""
    curves = DetectionCurves(values)
    if not curves.classes:
        return []
    kept = [row for row in range(len(curves.classes)) if bool(curves.present[row])]
    label = {row: str(names.get(curves.classes[row], curves.classes[row])) for row in kept}
    ap = curves.average_precision()
    written = []
    figure, axes = new_figure(1, 1, panel_size=(6.0, 5.0))
    axis = axes[0, 0]
    if len(kept) <= _MOST_CLASSES_DRAWN:
        for row in kept:
            axis.plot(curves.recall_levels, curves.precision[row], linewidth=1, label=f"{label[row]} {float(ap[row]):.3f}")
    mean_ap = float(ap[kept].mean()) if kept else 0.0
    axis.plot(curves.recall_levels, curves.precision[kept].mean(dim=0), linewidth=3, color="blue", label=f"all classes {mean_ap:.3f} mAP@0.5")
    _finish(axis, "recall", "precision", "Precision-recall curve")
    written.append(save_figure(figure, folder / "PR_curve.png"))
    for file_name, table, title in (
        ("P_curve.png", curves.precision_at, "Precision"),
        ("R_curve.png", curves.recall_at, "Recall"),
        ("F1_curve.png", curves.f1_at, "F1"),
    ):
        figure, axes = new_figure(1, 1, panel_size=(6.0, 5.0))
        axis = axes[0, 0]
        if len(kept) <= _MOST_CLASSES_DRAWN:
            for row in kept:
                axis.plot(curves.confidences, table[row], linewidth=1, label=label[row])
        mean = table[kept].mean(dim=0)
        best = int(mean.argmax())
        axis.plot(curves.confidences, mean, linewidth=3, color="blue",
                  label=f"all classes {float(mean[best]):.2f} at {float(curves.confidences[best]):.3f}")
        _finish(axis, "confidence", title.lower(), f"{title}-confidence curve")
        written.append(save_figure(figure, folder / file_name))
    return written


def _finish(axis: Any, x_label: str, y_label: str, title: str) -> None:
    axis.set_xlim(0, 1)
    axis.set_ylim(0, 1.02)
    axis.set_xlabel(x_label)
    axis.set_ylabel(y_label)
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="lower left")
