"""The detect task's ``postprocess`` of a dense detector (one box and C class scores per anchor).

Every dense family (YOLOv7, YOLOX, YOLOv9, RTMDet, PP-PicoDet, YOLO-NAS) postprocesses alike: the
boxes and scores its eval-mode ``forward`` already decoded, or else its own ``decode`` of the raw
outputs, then per-class NMS in the reference order (``dense_detections_nms``: candidates, boxes
mapped back to the original image and clipped, NMS). What differs is the decoder and the published
candidate selection (one class per anchor or every class above the threshold, caps per level or
in all), so a family mixes ``DenseDetectionPostprocess`` into its model, implements
``decode(outputs)`` and states its ``nms_defaults``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import torch

from zoo_core.ops.boxes import ImagePlacement
from zoo_core.ops.nms import dense_detections_nms

__all__ = ["DenseNMSDefaults", "DenseDetectionPostprocess"]


@dataclass(frozen=True)
class DenseNMSDefaults:
    """A family's ``postprocess`` defaults (the arguments of ``dense_detections_nms``).

    ``conf``, ``iou`` and ``max_det`` apply when a caller leaves them out (the tasks always pass
    theirs); the candidate selection is the published postprocess's: ``multi_label``,
    ``max_candidates`` (None keeps ``dense_detections_nms``'s own cap) and ``per_level_candidates``
    (PicoDet's and RTMDet's caps per feature level; the model's outputs then carry
    ``anchor_strides``, from which the levels are read).
    """

    conf: float = 0.25
    iou: float = 0.65
    max_det: int = 300
    multi_label: bool = False
    max_candidates: int | None = None
    per_level_candidates: int | None = None


class DenseDetectionPostprocess(abc.ABC):
    """Mixin for a dense detector ``nn.Module``: ``postprocess`` from the family's ``decode`` and ``nms_defaults``."""

    #: The family's thresholds and candidate selection; an argument of ``postprocess`` left at None takes its value from here.
    nms_defaults: ClassVar[DenseNMSDefaults] = DenseNMSDefaults()

    @abc.abstractmethod
    def decode(self, outputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(boxes N×A×4 xyxy in input pixels, scores N×A×C probabilities)`` from the raw outputs."""

    def dense_candidates(self, outputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The boxes and scores NMS chooses from: eval-mode outputs carry them decoded, training outputs are decoded here."""
        if "boxes" in outputs and "scores" in outputs:
            return outputs["boxes"], outputs["scores"]
        return self.decode(outputs)

    @torch.no_grad()
    def postprocess(
        self,
        outputs: Mapping[str, Any],
        conf: float | None = None,
        iou: float | None = None,
        max_det: int | None = None,
        *,
        multi_label: bool | None = None,
        placements: Sequence[ImagePlacement] | None = None,
        return_anchor_indices: bool = False,
    ) -> list[dict[str, torch.Tensor]]:
        """Detections per image: ``boxes`` (n×4 xyxy), ``scores``, ``labels`` (int64).

        The boxes are in input pixels, or with ``placements`` (one per image) in original-image
        pixels, mapped back before NMS. Arguments left at None take the family's ``nms_defaults``.
        ``return_anchor_indices`` adds each detection's anchor (``anchor_indices``), from which a
        segmenter reads its mask parameters.
        """
        defaults = self.nms_defaults
        boxes, scores = self.dense_candidates(outputs)
        selection: dict[str, Any] = {} if defaults.max_candidates is None else {"max_candidates": defaults.max_candidates}
        if defaults.per_level_candidates is not None:
            strides = outputs["anchor_strides"].reshape(-1)
            selection["levels"] = torch.unique_consecutive(strides, return_inverse=True)[1]
            selection["per_level_candidates"] = defaults.per_level_candidates
        return dense_detections_nms(
            boxes,
            scores,
            defaults.conf if conf is None else conf,
            defaults.iou if iou is None else iou,
            defaults.max_det if max_det is None else max_det,
            multi_label=defaults.multi_label if multi_label is None else multi_label,
            placements=placements,
            return_anchor_indices=return_anchor_indices,
            **selection,
        )
