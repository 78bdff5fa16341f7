"""The per-class table of a detection validation, as Ultralytics prints it after ``val``.

One row per class that has true boxes in the validated split, and an ``all`` row first:

- ``images``: the images holding at least one true box of the class (``all``: every image validated);
- ``instances``: its true boxes;
- ``P`` and ``R``: precision and recall at one confidence threshold shared by every class, the one at
  which the mean F1 over the classes is highest (Ultralytics' choice). They are read from COCO's
  interpolated precision table at IoU 0.5 (``zoo_core.reports.detection_curves.DetectionCurves``),
  so they are COCO's interpolated precision at the recall reached, not a raw count; the mean F1 is
  not smoothed before its maximum is taken (Ultralytics smooths it with a 0.1-wide box filter), and of
  equal maxima the highest confidence is taken;
- ``mAP50`` and ``mAP50-95``: the class's COCO average precision at IoU 0.5 and over IoU 0.50:0.95.

The ``all`` row holds the means over the listed classes; its mAP50 and mAP50-95 are the metrics
``val`` returns. The numbers come from the metric's ``compute()``, which has gathered every rank's
images (``OrderedMeanAveragePrecision``), so two ranks print the table one process prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

__all__ = ["ClassRow", "ClassTable", "ValidationMetrics", "detection_class_table"]


@dataclass(frozen=True)
class ClassRow:
    """One line of the table (``name`` is ``"all"`` for the summary line, whose ``index`` is -1)."""

    index: int
    name: str
    images: int
    instances: int
    precision: float
    recall: float
    map50: float
    map50_95: float


@dataclass(frozen=True)
class ClassTable:
    """The ``all`` row, the per-class rows (in class order) and the confidence at which P and R are read."""

    all: ClassRow
    classes: tuple[ClassRow, ...]
    confidence: float
    label: str = "Box"

    def rows(self) -> list[dict[str, Any]]:
        """Every row as a plain dict, the ``all`` row first (for JSON, pandas, comparisons)."""
        return [asdict(row) for row in (self.all, *self.classes)]

    def format(self) -> str:
        """The table as text, Ultralytics' layout: ``Class Images Instances Box(P R mAP50 mAP50-95)``."""
        header = ("Class", "Images", "Instances", f"{self.label}(P", "R", "mAP50", "mAP50-95)")
        width = max(22, *(len(row.name) + 2 for row in self.classes)) if self.classes else 22
        lines = [f"{header[0]:>{width}}" + "".join(f"{cell:>11}" for cell in header[1:])]
        for row in (self.all, *self.classes):
            lines.append(f"{row.name:>{width}}{row.images:>11}{row.instances:>11}"
                         + "".join(f"{value:>11.3g}" for value in (row.precision, row.recall, row.map50, row.map50_95)))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


class ValidationMetrics(dict):
    """The metrics dict ``val`` returns (name → float), with the per-class table as ``class_table`` (None where the
    task has none). Being a dict, it is what a plain metrics dict was: printed, compared, saved as JSON."""

    def __init__(self, metrics: Mapping[str, float], class_table: ClassTable | None = None) -> None:
        super().__init__(metrics)
        self.class_table = class_table


def _average_precisions(precision: Any, column: int) -> tuple[float, float]:
    """(AP at IoU 0.5, AP over IoU 0.50:0.95) of column ``column`` of COCO's precision table (T×R×K×A×M)."""
    import torch

    table = torch.as_tensor(precision)[:, :, column, 0, -1].double()  # IoU thresholds × recall levels, all areas, 100 detections
    at50 = table[0][table[0] > -1]
    every = table[table > -1]
    return (float(at50.mean()) if at50.numel() else 0.0, float(every.mean()) if every.numel() else 0.0)


def detection_class_table(values: Mapping[str, Any], names: Mapping[int, str], label: str = "Box") -> ClassTable:
    """The table from ``OrderedMeanAveragePrecision(extended_summary=True).compute()`` (``values``: its dict, which
    carries ``images``, ``class_images`` and ``class_instances``) and the dataset's class ``names``."""
    import torch

    from zoo_core.reports.detection_curves import DetectionCurves

    images = int(values["images"])
    class_images = {int(key): int(value) for key, value in zip(*torch.as_tensor(values["class_images"]).reshape(2, -1).tolist())}
    class_instances = {int(key): int(value) for key, value in zip(*torch.as_tensor(values["class_instances"]).reshape(2, -1).tolist())}
    listed = sorted(cls for cls, count in class_instances.items() if count > 0)
    if not listed or "precision" not in values or torch.as_tensor(values["precision"]).numel() == 0:
        empty = ClassRow(-1, "all", images, sum(class_instances.values()), 0.0, 0.0, 0.0, 0.0)
        return ClassTable(empty, (), 0.0, label)
    curves = DetectionCurves(values)
    column_of = {cls: column for column, cls in enumerate(curves.classes)}
    columns = [column_of[cls] for cls in listed]
    mean_f1 = curves.f1_at[columns].mean(dim=0)
    # Of equal maxima, the highest confidence: COCO's table stops at the largest recall reached, so the false
    # positives below it leave no trace there, and the lowest tied threshold would keep them all.
    best = int(torch.nonzero(mean_f1 >= mean_f1.max() - 1e-12).max())
    rows = []
    for cls, column in zip(listed, columns):
        map50, map50_95 = _average_precisions(values["precision"], column)
        rows.append(ClassRow(cls, str(names.get(cls, cls)), class_images.get(cls, 0), class_instances[cls],
                             float(curves.precision_at[column, best]), float(curves.recall_at[column, best]), map50, map50_95))

    def mean(field: str) -> float:
        return sum(getattr(row, field) for row in rows) / len(rows)

    summary = ClassRow(-1, "all", images, sum(row.instances for row in rows), mean("precision"), mean("recall"),
                       mean("map50"), mean("map50_95"))
    return ClassTable(summary, tuple(rows), float(curves.confidences[best]), label)
