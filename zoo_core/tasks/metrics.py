"""torchmetrics metrics whose distributed result is exactly the single-process result.

Under DDP each rank validates its own shard (``InferenceShardSampler``) and ``compute()``
gathers the states of all ranks. Two things would make that differ from one process:

- torchmetrics' ``MeanAveragePrecision`` gathers its per-image list states element by element,
  which needs the same number of images on every rank (an uneven split such as 5 images over 2
  ranks would hang), and its COCO evaluation breaks score ties by image order;
- a mean of per-image values (PSNR, SSIM) summed in another order differs in the last bits.

So per-image states here carry each sample's dataset index: gathering is done with
``all_gather_object`` (any number of images per rank), and ``compute()`` puts every per-image
state back in dataset order (dropping repeats, should a padding sampler have repeated a sample)
before computing. Count-based metrics (accuracy, IoU from a confusion matrix) need none of this:
torchmetrics sums their integer states exactly.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torchmetrics import Metric
from torchmetrics.detection import MeanAveragePrecision
from torchmetrics.utilities import dim_zero_cat

__all__ = ["OrderedMeanAveragePrecision", "PerSampleMean"]


def _first_occurrence_order(indices: Sequence[int]) -> list[int]:
    """Positions that visit ``indices`` in ascending order, keeping the first of any repeats."""
    seen: dict[int, int] = {}
    for position, index in enumerate(indices):
        seen.setdefault(int(index), position)
    return [seen[index] for index in sorted(seen)]


def _to_cpu(item: Any) -> Any:
    """A per-image state on the CPU for gathering: tensors moved, RLE tuples as they are."""
    return item.detach().cpu() if isinstance(item, torch.Tensor) else item


def _to_device(item: Any, device: torch.device) -> Any:
    """A gathered per-image state back on the metric's device (RLE tuples stay Python objects)."""
    return item.to(device) if isinstance(item, torch.Tensor) else item


class OrderedMeanAveragePrecision(MeanAveragePrecision):
    """COCO box mAP (torchmetrics, COCO's 1/10/100 detections per image) over images put in dataset order.

    ``update(preds, target, indices)``: ``indices`` are the dataset indices of the images. With
    ``iou_type=("bbox", "segm")`` (the segment task) predictions and targets also carry ``masks``
    (n×H×W bool) and targets ``iscrowd``; each mask is held as its COCO RLE from ``update`` on, and
    gathered across ranks as such, so validation memory grows with the objects, not the pixels.
    Metric keys then carry the ``bbox_`` and ``segm_`` prefixes.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("box_format", "xyxy")
        kwargs.setdefault("iou_type", "bbox")
        super().__init__(**kwargs)
        # COCO counts the 100 best detections per image; postprocess may return more (max_det).
        self.warn_on_many_detections = False
        self.add_state("sample_index", default=[], dist_reduce_fx=None)

    def _list_states(self) -> list[str]:
        return [name for name, default in self._defaults.items() if isinstance(default, list)]

    def update(self, preds: list[dict[str, torch.Tensor]], target: list[dict[str, torch.Tensor]], indices: torch.Tensor | Sequence[int]) -> None:  # type: ignore[override]
        """Add a batch of per-image predictions and targets, with the images' dataset indices."""
        indices = [int(index) for index in indices]
        if len(indices) != len(preds):
            raise ValueError(f"got {len(indices)} indices for {len(preds)} images; give one dataset index per image")
        super().update(preds, target)
        self.sample_index.extend(torch.tensor(index) for index in indices)

    def _sync_dist(self, dist_sync_fn: Optional[Callable] = None, process_group: Optional[Any] = None) -> None:
        import torch.distributed as dist

        group = process_group or self.process_group
        names = self._list_states()
        # Mask states are tuples of COCO RLEs (torchmetrics encodes each mask on update): they travel as they are, a few
        # bytes per object, never as dense masks.
        local = {name: [_to_cpu(item) for item in getattr(self, name)] for name in names}
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, local, group=group)
        for name in names:
            setattr(self, name, [_to_device(item, self.device) for part in gathered for item in part[name]])

    def compute(self) -> dict[str, torch.Tensor]:
        """COCO metrics over every image seen (by all ranks), in dataset order."""
        order = _first_occurrence_order([int(index) for index in self.sample_index])
        for name in self._list_states():
            values = getattr(self, name)
            if len(values) == len(order) or len(values) == len(self.sample_index):
                setattr(self, name, [values[position] for position in order] if values else values)
        return super().compute()


class PerSampleMean(Metric):
    """The mean of one value per sample (float64, in dataset order, each sample once).

    ``update(values, indices)``: ``values`` (N) for the samples whose dataset indices are ``indices``.
    Values are kept in float64 (float32 on MPS, which has no float64) and indices as int64.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("values", default=[], dist_reduce_fx="cat")
        self.add_state("indices", default=[], dist_reduce_fx="cat")

    def _value_dtype(self) -> torch.dtype:
        return torch.float32 if self.device.type == "mps" else torch.float64

    def update(self, values: torch.Tensor, indices: torch.Tensor) -> None:
        """Add per-sample ``values`` with their dataset ``indices``."""
        values = values.detach().reshape(-1).to(device=self.device, dtype=self._value_dtype())
        indices = torch.as_tensor(indices, device=self.device).reshape(-1).to(torch.int64)
        if values.numel() != indices.numel():
            raise ValueError(f"got {values.numel()} values for {indices.numel()} indices; give one value per sample")
        self.values.append(values)
        self.indices.append(indices)

    def _sync_dist(self, dist_sync_fn: Optional[Callable] = None, process_group: Optional[Any] = None) -> None:
        # A rank whose shard was empty must still send tensors of the same dtypes as the others
        # (torchmetrics would substitute float32 placeholders, which gloo and NCCL reject).
        if not self.values:
            self.values = [torch.zeros(0, dtype=self._value_dtype(), device=self.device)]
            self.indices = [torch.zeros(0, dtype=torch.int64, device=self.device)]
        super()._sync_dist(dist_sync_fn=dist_sync_fn, process_group=process_group)  # type: ignore[arg-type]

    def compute(self) -> torch.Tensor:
        """The mean over distinct samples, summed in index order (NaN when nothing was added)."""
        values, indices = dim_zero_cat(self.values), dim_zero_cat(self.indices)
        if values.numel() == 0:
            return torch.tensor(float("nan"), dtype=self._value_dtype())
        order = _first_occurrence_order(indices.to(torch.int64).tolist())
        ordered = values[torch.tensor(order, device=values.device)]
        return ordered.sum() / ordered.numel()
