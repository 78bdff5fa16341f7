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

__all__ = ["OrderedMeanAveragePrecision", "PerSampleMean", "RotatedMeanAveragePrecision", "interpolated_average_precision"]


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
        values = super().compute()
        values.update(self._label_counts())
        return values

    def _label_counts(self) -> dict[str, torch.Tensor]:
        """``images`` (distinct images seen), ``class_images`` and ``class_instances`` (2×K: the classes, then the images
        holding a true box of each / its true boxes; crowd regions not counted), for the per-class table."""
        images: dict[int, int] = {}
        instances: dict[int, int] = {}
        crowds = getattr(self, "groundtruth_crowds", None) or [None] * len(self.groundtruth_labels)
        for labels, crowd in zip(self.groundtruth_labels, crowds):
            labels = torch.as_tensor(labels).reshape(-1).long().cpu()
            if crowd is not None and torch.as_tensor(crowd).numel() == labels.numel():
                labels = labels[torch.as_tensor(crowd).reshape(-1).cpu() == 0]
            for cls, count in zip(*torch.unique(labels, return_counts=True)):
                images[int(cls)] = images.get(int(cls), 0) + 1
                instances[int(cls)] = instances.get(int(cls), 0) + int(count)
        classes = sorted(instances)

        def table(counts: dict[int, int]) -> torch.Tensor:
            return torch.tensor([classes, [counts[cls] for cls in classes]], dtype=torch.int64).reshape(2, -1)

        seen = len({int(index) for index in self.sample_index})
        return {"images": torch.tensor(seen), "class_images": table(images), "class_instances": table(instances)}


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


#: The IoU thresholds of mAP50-95 (COCO's ten, 0.50 to 0.95 by 0.05).
IOU_THRESHOLDS = tuple(round(0.5 + 0.05 * step, 2) for step in range(10))


def interpolated_average_precision(recall: torch.Tensor, precision: torch.Tensor) -> float:
    """Area under the precision envelope of one ranked list, sampled at 101 recall points (COCO's and Ultralytics'
    ``compute_ap`` interpolation): sentinels (0, 1) and (recall[-1] + 0.01, 0) are added, precision is made monotone
    from the right, and the envelope is integrated with the trapezoid rule over ``linspace(0, 1, 101)``."""
    import numpy as np

    recall_points = np.concatenate(([0.0], recall.double().cpu().numpy(), [1.0]))
    precision_points = np.concatenate(([1.0], precision.double().cpu().numpy(), [0.0]))
    envelope = np.flip(np.maximum.accumulate(np.flip(precision_points)))
    samples = np.linspace(0.0, 1.0, 101)
    return float(np.trapezoid(np.interp(samples, recall_points, envelope), samples))


class RotatedMeanAveragePrecision(Metric):
    """Oriented-box mAP50 and mAP50-95 (DOTA/Ultralytics semantics) over images put in dataset order.

    ``update(preds, target, indices)``: per image, ``preds`` dicts of ``boxes`` (n×5 ``cx, cy, w, h, angle``),
    ``scores`` and ``labels``, ``target`` dicts of ``boxes`` and ``labels``. At each IoU threshold (0.50 to 0.95)
    the detections of one image and class, best score first, each claim the unclaimed ground truth of highest
    exact rotated IoU (``zoo_core.ops.rotated_boxes.rotated_box_iou``) at or above the threshold; a class's AP is
    ``interpolated_average_precision`` of its detections ranked by score over all images (ties in dataset order);
    mAP is the mean over the classes that have ground truth (a class only predicted adds nothing, as in Ultralytics).
    The per-image states travel with their dataset indices (``all_gather_object``), so a sharded validation computes
    exactly what one process does.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name in ("pred_boxes", "pred_scores", "pred_labels", "true_boxes", "true_labels", "sample_index"):
            self.add_state(name, default=[], dist_reduce_fx=None)

    def update(self, preds: list[dict[str, torch.Tensor]], target: list[dict[str, torch.Tensor]],  # type: ignore[override]
               indices: torch.Tensor | Sequence[int]) -> None:
        """Add a batch of per-image predictions and targets, with the images' dataset indices."""
        indices = [int(index) for index in indices]
        if not len(indices) == len(preds) == len(target):
            raise ValueError(f"got {len(indices)} indices for {len(preds)} predictions and {len(target)} targets; "
                             "give one dataset index, one prediction and one target per image")
        for prediction, truth, index in zip(preds, target, indices):
            self.pred_boxes.append(prediction["boxes"].detach().float().cpu().reshape(-1, 5))
            self.pred_scores.append(prediction["scores"].detach().float().cpu().reshape(-1))
            self.pred_labels.append(prediction["labels"].detach().long().cpu().reshape(-1))
            self.true_boxes.append(truth["boxes"].detach().float().cpu().reshape(-1, 5))
            self.true_labels.append(truth["labels"].detach().long().cpu().reshape(-1))
            self.sample_index.append(torch.tensor(index))

    def _sync_dist(self, dist_sync_fn: Optional[Callable] = None, process_group: Optional[Any] = None) -> None:
        import torch.distributed as dist

        group = process_group or self.process_group
        names = list(self._defaults)
        local = {name: [item.detach().cpu() for item in getattr(self, name)] for name in names}
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, local, group=group)
        for name in names:
            setattr(self, name, [item for part in gathered for item in part[name]])

    @staticmethod
    def _match(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, true_boxes: torch.Tensor,
               true_labels: torch.Tensor) -> torch.Tensor:
        """``n×10`` bool: whether each detection of one image is a true positive at each IoU threshold."""
        from zoo_core.ops.rotated_boxes import rotated_box_iou

        hits = torch.zeros((len(boxes), len(IOU_THRESHOLDS)), dtype=torch.bool)
        if not len(boxes) or not len(true_boxes):
            return hits
        iou = rotated_box_iou(boxes.double(), true_boxes.double())
        iou = torch.where(labels[:, None] == true_labels[None], iou, torch.full_like(iou, -1.0))
        order = torch.argsort(scores, descending=True, stable=True).tolist()
        for column, threshold in enumerate(IOU_THRESHOLDS):
            claimed = torch.zeros(len(true_boxes), dtype=torch.bool)
            for position in order:
                candidates = torch.where(claimed, torch.full_like(iou[position], -1.0), iou[position])
                best = int(torch.argmax(candidates))
                if candidates[best] >= threshold - 1e-12:
                    claimed[best] = True
                    hits[position, column] = True
        return hits

    def compute(self) -> dict[str, torch.Tensor]:
        """``map`` (mAP50-95), ``map_50``, ``map_75`` and ``map_per_class`` (50-95) over every image, in dataset order."""
        order = _first_occurrence_order([int(index) for index in self.sample_index])
        all_scores, all_labels, all_hits, true_counts = [], [], [], torch.zeros(0, dtype=torch.long)
        for position in order:
            boxes, scores, labels = self.pred_boxes[position], self.pred_scores[position], self.pred_labels[position]
            true_boxes, true_labels = self.true_boxes[position], self.true_labels[position]
            all_hits.append(self._match(boxes, scores, labels, true_boxes, true_labels))
            all_scores.append(scores)
            all_labels.append(labels)
            if len(true_labels):
                counts = torch.bincount(true_labels, minlength=len(true_counts))
                if len(counts) > len(true_counts):
                    true_counts = torch.cat([true_counts, torch.zeros(len(counts) - len(true_counts), dtype=torch.long)])
                true_counts = true_counts + counts
        scores = torch.cat(all_scores) if all_scores else torch.zeros(0)
        labels = torch.cat(all_labels) if all_labels else torch.zeros(0, dtype=torch.long)
        hits = torch.cat(all_hits) if all_hits else torch.zeros((0, len(IOU_THRESHOLDS)), dtype=torch.bool)
        classes = [int(index) for index in torch.nonzero(true_counts).reshape(-1)]
        if not classes:
            empty = torch.tensor(-1.0)
            return {"map": empty, "map_50": empty, "map_75": empty, "map_per_class": torch.zeros(0)}
        table = torch.zeros((len(classes), len(IOU_THRESHOLDS)), dtype=torch.float64)
        for row, class_id in enumerate(classes):
            mine = labels == class_id
            ranked = torch.argsort(scores[mine], descending=True, stable=True)
            class_hits = hits[mine][ranked].double()
            true_positives = class_hits.cumsum(0)
            false_positives = (1 - class_hits).cumsum(0)
            for column in range(len(IOU_THRESHOLDS)):
                if not len(class_hits):
                    continue
                recall = true_positives[:, column] / float(true_counts[class_id])
                precision = true_positives[:, column] / (true_positives[:, column] + false_positives[:, column])
                table[row, column] = interpolated_average_precision(recall, precision)
        return {
            "map": table.mean().float(),
            "map_50": table[:, 0].mean().float(),
            "map_75": table[:, 5].mean().float(),
            "map_per_class": table.mean(dim=1).float(),
            "classes": torch.tensor(classes),
        }
