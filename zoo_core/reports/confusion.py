"""Confusion matrices: detection's (with a background row and column) and their two drawings.

The matrix is indexed ``[predicted, true]``. Detection adds a last ``background`` class: a true
box no prediction matched counts in the background row (missed), a prediction that matched no
true box in the background column (false alarm). ``DetectionConfusionMatrix`` is a torchmetrics
``Metric`` whose state is summed over ranks, so a sharded validation draws the whole set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import torch
from torchmetrics import Metric

from zoo_core.reports.figures import new_figure, save_figure

__all__ = ["DetectionConfusionMatrix", "plot_confusion_matrix"]


class DetectionConfusionMatrix(Metric):
    """Counts of (predicted class, true class) over matched boxes, plus misses and false alarms.

    A prediction counts when its score is at least ``conf``; predictions and true boxes are
    matched one to one, greedily by IoU (highest first), when their IoU exceeds ``iou`` whatever
    their classes: a match of two different classes is a confusion.
    """

    full_state_update = False

    def __init__(self, num_classes: int, conf: float = 0.25, iou: float = 0.45, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.num_classes, self.conf, self.iou = num_classes, conf, iou
        self.add_state("matrix", default=torch.zeros(num_classes + 1, num_classes + 1, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predictions: Sequence[Mapping[str, torch.Tensor]], truths: Sequence[Mapping[str, torch.Tensor]]) -> None:
        """Add images: ``predictions`` with ``boxes``/``scores``/``labels``, ``truths`` with ``boxes``/``labels`` (same coordinates)."""
        from torchvision.ops import box_iou

        background = self.num_classes
        for prediction, truth in zip(predictions, truths):
            keep = prediction["scores"] >= self.conf
            predicted_boxes, predicted = prediction["boxes"][keep].float(), prediction["labels"][keep].long().cpu()
            true_boxes, true = truth["boxes"].float(), truth["labels"].long().cpu()
            matched_predictions: list[int] = []
            matched_truths: list[int] = []
            if len(predicted) and len(true):
                overlaps = box_iou(true_boxes, predicted_boxes.to(true_boxes.device)).cpu()
                pairs = (overlaps > self.iou).nonzero().tolist()
                pairs.sort(key=lambda pair: -float(overlaps[pair[0], pair[1]]))
                used_truths: set[int] = set()
                used_predictions: set[int] = set()
                for truth_index, prediction_index in pairs:
                    if truth_index in used_truths or prediction_index in used_predictions:
                        continue
                    used_truths.add(truth_index)
                    used_predictions.add(prediction_index)
                    matched_truths.append(truth_index)
                    matched_predictions.append(prediction_index)
            rows = [int(predicted[index]) for index in matched_predictions]
            columns = [int(true[index]) for index in matched_truths]
            missed = [int(label) for index, label in enumerate(true.tolist()) if index not in set(matched_truths)]
            false_alarms = [int(label) for index, label in enumerate(predicted.tolist()) if index not in set(matched_predictions)]
            rows += [background] * len(missed) + false_alarms
            columns += missed + [background] * len(false_alarms)
            if rows:
                cells = torch.tensor([rows, columns], dtype=torch.long, device=self.matrix.device)
                self.matrix.index_put_((cells[0], cells[1]), torch.ones(len(rows), dtype=torch.long, device=self.matrix.device), accumulate=True)

    def compute(self) -> torch.Tensor:
        """The ``(classes + 1)²`` count matrix, ``[predicted, true]``, background last."""
        return self.matrix.clone()


def plot_confusion_matrix(matrix: torch.Tensor, names: Mapping[int, str], folder: Path, background: bool = False) -> list[Path]:
    """Write ``confusion_matrix.png`` (counts) and ``confusion_matrix_normalized.png`` (each true class's column sums to 1).

    ``matrix`` is ``[predicted, true]``; with ``background`` its last row and column are the background class.
    """
    counts = matrix.detach().cpu().double()
    labels = [str(names.get(index, index)) for index in range(len(names))] + (["background"] if background else [])
    column_sums = counts.sum(dim=0, keepdim=True)
    normalised = torch.where(column_sums > 0, counts / column_sums.clamp(min=1), torch.zeros_like(counts))
    return [
        _draw(counts, labels, folder / "confusion_matrix.png", "Confusion matrix", integer=True),
        _draw(normalised, labels, folder / "confusion_matrix_normalized.png", "Confusion matrix (normalised per true class)", integer=False),
    ]


def _draw(values: torch.Tensor, labels: list[str], path: Path, title: str, integer: bool) -> Path:
    count = len(labels)
    side = min(4.0 + 0.45 * count, 16.0)
    figure, axes = new_figure(1, 1, panel_size=(side * 1.15, side))
    axis = axes[0, 0]
    image = axis.imshow(values.numpy(), cmap="Blues", vmin=0.0)
    figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04)
    if count <= 30:  # beyond that the numbers would not be legible
        peak = float(values.max()) or 1.0
        for row in range(count):
            for column in range(count):
                value = float(values[row, column])
                if value:
                    text = f"{int(value)}" if integer else f"{value:.2f}"
                    axis.text(column, row, text, ha="center", va="center", fontsize=7, color="white" if value > 0.5 * peak else "black")
    ticks = range(count) if count <= 60 else []
    axis.set_xticks(list(ticks), [labels[index] for index in ticks], rotation=90, fontsize=7)
    axis.set_yticks(list(ticks), [labels[index] for index in ticks], fontsize=7)
    axis.set_xlabel("true")
    axis.set_ylabel("predicted")
    axis.set_title(title)
    return save_figure(figure, path)
