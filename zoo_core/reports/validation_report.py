"""What a validation pass writes besides its metrics: the report a task fills in.

The engine hands a ``ValidationReport`` to ``Task.validate`` for the last validation of a
training run and for ``val()``; the task draws its first batches (truth and prediction), and
its charts (confusion matrix, curves...) through the report. Under DDP every rank gets one,
because the metrics behind the charts are synchronised across ranks, but only rank 0's
(``write=True``) writes files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from zoo_core.reports.drawing import save_image

if TYPE_CHECKING:
    import torch

__all__ = ["ValidationReport", "BATCHES_DRAWN"]

BATCHES_DRAWN = 3  # val_batch0..2 and train_batch0..2, as Ultralytics users know them


@dataclass
class ValidationReport:
    """The folder a validation writes into, the files written so far (``written``) and the numbers behind the charts (``numbers``).

    ``numbers`` (``confusion_matrix``, ``per_class_iou``...) is filled on every rank with the
    synchronised values, so code (and tests) can read what a chart shows.
    """

    folder: Path
    write: bool = True
    batches: int = BATCHES_DRAWN
    written: list[Path] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)

    def draws_batch(self, index: int) -> bool:
        """Whether batch ``index`` of this rank's loader is drawn (the first ``batches``, on the writing rank)."""
        return self.write and index < self.batches

    def image(self, name: str, image: "torch.Tensor") -> None:
        """Save a uint8 ``3×H×W`` image as ``folder/name`` (on the writing rank)."""
        if self.write:
            self.written.append(save_image(image, self.folder / name))

    def charts(self, draw: Callable[[Path], list[Path]], **numbers: Any) -> None:
        """Keep ``numbers`` (on every rank), then run ``draw(folder)`` on the writing rank and record the files it returns."""
        self.numbers.update(numbers)
        if self.write:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.written.extend(draw(self.folder))
