"""Ground truth in the form DETR training needs: per image, normalised ``cx, cy, w, h`` boxes.

zoo's detection batches carry ``targets`` as one ``M×6`` tensor (image index, class, x1, y1, x2,
y2 in input pixels). ``DETRTargets.from_batch`` sorts it by image, normalises by the input size
and keeps the per-image counts on the host (the one device sync of a training step: the
Hungarian matcher and the denoising groups need them there anyway).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zoo_core.detr.geometry import xyxy_to_cxcywh

__all__ = ["DETRTargets"]


@dataclass
class DETRTargets:
    """Ground truth of one batch, packed image after image.

    Attributes:
        labels: ``(T,)`` int64 classes.
        boxes: ``(T, 4)`` normalised ``cx, cy, w, h``.
        counts: boxes per image (host ints, ``len(counts)`` = batch size).
        rows: ``(T,)`` the row of the batch's ``M×6`` targets each box came from (``from_batch``), so that
            per-object data in the batch (instance ``masks``) can follow the packing; None otherwise.
        masks: ``(T, h, w)`` float target masks of the boxes, for segmenters (``with_masks``); None for detectors.
    """

    labels: torch.Tensor
    boxes: torch.Tensor
    counts: list[int]
    rows: torch.Tensor | None = None
    masks: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return len(self.counts)

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def offsets(self) -> list[int]:
        """Start of each image's boxes in the packed tensors (length ``batch_size + 1``)."""
        starts = [0]
        for count in self.counts:
            starts.append(starts[-1] + count)
        return starts

    def image_index(self) -> torch.Tensor:
        """``(T,)`` image index of every box."""
        return torch.repeat_interleave(
            torch.arange(self.batch_size, device=self.labels.device), torch.tensor(self.counts, device=self.labels.device)
        )

    @classmethod
    def from_batch(cls, targets: torch.Tensor, batch_size: int, image_size: tuple[int, int]) -> "DETRTargets":
        """Pack zoo's ``M×6`` pixel targets for ``batch_size`` images of ``image_size = (height, width)``.

        Boxes are clipped to the image; boxes left without area are dropped (their GIoU is undefined).
        """
        height, width = image_size
        targets = targets.detach().to(torch.float32)
        if targets.numel() == 0:
            targets = targets.reshape(0, 6)
        scale = targets.new_tensor([width, height, width, height])
        xyxy = torch.minimum(targets[:, 2:6].clamp(min=0), scale) / scale
        image = targets[:, 0].long()
        keep = (xyxy[:, 2] > xyxy[:, 0]) & (xyxy[:, 3] > xyxy[:, 1]) & (image >= 0) & (image < batch_size)
        # One host transfer for the mask and the counts together.
        order_key = torch.where(keep, image, torch.full_like(image, batch_size))
        counts_all = torch.bincount(order_key, minlength=batch_size + 1).tolist()
        order = torch.argsort(order_key, stable=True)[: sum(counts_all[:batch_size])]
        return cls(labels=targets[order, 1].long(), boxes=xyxy_to_cxcywh(xyxy[order]), counts=counts_all[:batch_size], rows=order)

    @classmethod
    def from_lists(cls, labels: list[torch.Tensor], boxes: list[torch.Tensor]) -> "DETRTargets":
        """Pack per-image ``labels`` and normalised cxcywh ``boxes`` (the format of the official code)."""
        return cls(labels=torch.cat(labels).long(), boxes=torch.cat(boxes).float(), counts=[len(x) for x in labels])

    def with_masks(self, masks: torch.Tensor) -> "DETRTargets":
        """These targets with ``masks`` (T×h×w, one per packed box, in packing order)."""
        if masks.dim() != 3 or len(masks) != self.total:
            raise ValueError(f"targets need one h×w mask per box ({self.total}), got masks of shape {tuple(masks.shape)}")
        return DETRTargets(self.labels, self.boxes, list(self.counts), self.rows, masks)

    def to(self, device: torch.device) -> "DETRTargets":
        def move(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value.to(device)

        return DETRTargets(self.labels.to(device), self.boxes.to(device), list(self.counts), move(self.rows), move(self.masks))
