"""Centroid detection (``points``): models that find objects as points, not boxes (FOMO).

Data: the detection task's, unchanged — a dataset YAML in the Ultralytics convention or
``"shapes"``, letterboxed samples, the same augmentation and the same batch (``targets`` M×6:
image index, class, x1, y1, x2, y2 in input pixels). A centroid model learns from boxes (FOMO
marks the cell holding each box centre), so labelled box datasets serve as they are.

Model contract (besides ``model(images)`` and ``model.loss(outputs, batch)``, which is required:
there is no task-level loss): ``model.postprocess(outputs, conf, max_det)`` on eval outputs
returns one dict per image with ``points`` (n×2: x, y in input pixels), ``scores`` (n) and
``labels`` (n, int64).

Metric: centroid matching. A predicted point is a true positive when it lies inside (borders
included) a ground-truth box of its class that no higher-scoring point has claimed; each box is
matched at most once (among several free boxes holding the point, the one whose centre is
nearest). Unmatched points are false positives, unmatched boxes false negatives. Counts add up
over the images of the whole set (under DDP: summed exactly over ranks), and ``precision``,
``recall`` and ``f1`` come from the totals; ``f1`` is the fitness. Validation keeps the points
above ``conf`` (0.5 by default, FOMO's threshold), since a point set has no ranking curve to
integrate the way mAP does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

import torch
from torchmetrics import Metric

from zoo_core.data.input_pipeline import fit_to_input
from zoo_core.tasks.base import ModelContractError
from zoo_core.tasks.detect import DetectTask
from zoo_core.tasks.predictions import PointsResult

if TYPE_CHECKING:
    from zoo_core.data.input_pipeline import RatioPad
    from zoo_core.data.images import SourceImage
    from zoo_core.reports.validation_report import ValidationReport

__all__ = [
    "PointsTask",
    "CentroidMatch",
    "CentroidCounts",
    "CentroidMatchCounts",
    "match_centroids",
    "centroid_counts",
    "points_to_original",
]


class CentroidMatch(NamedTuple):
    """Per prediction: ``true_positive`` (bool) and ``matched_box`` (int64 box index, -1 if none)."""

    true_positive: torch.Tensor
    matched_box: torch.Tensor


@dataclass(frozen=True)
class CentroidCounts:
    """True positives, false positives and false negatives (summable over images)."""

    true_positives: int = 0
    false_positives: int = 0
    false_negatives: int = 0

    def __add__(self, other: "CentroidCounts") -> "CentroidCounts":
        return CentroidCounts(
            self.true_positives + other.true_positives,
            self.false_positives + other.false_positives,
            self.false_negatives + other.false_negatives,
        )

    @property
    def precision(self) -> float:
        """TP / (TP + FP); 0 without predictions."""
        predicted = self.true_positives + self.false_positives
        return self.true_positives / predicted if predicted else 0.0

    @property
    def recall(self) -> float:
        """TP / (TP + FN); 0 without ground truth."""
        actual = self.true_positives + self.false_negatives
        return self.true_positives / actual if actual else 0.0

    @property
    def f1(self) -> float:
        """Harmonic mean of precision and recall: 2·TP / (2·TP + FP + FN); 0 when both are empty."""
        denominator = 2 * self.true_positives + self.false_positives + self.false_negatives
        return 2 * self.true_positives / denominator if denominator else 0.0


def match_centroids(
    points: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, gt_boxes: torch.Tensor, gt_labels: torch.Tensor
) -> CentroidMatch:
    """Match one image's predicted points to its ground-truth boxes (see the module docstring).

    Args:
        points: n×2 predicted centres (x, y), in the pixels of ``gt_boxes``.
        scores: n confidences (a higher score claims a box first); labels: n class indices.
        gt_boxes: m×4 xyxy boxes; gt_labels: m class indices.
    """
    if points.dim() != 2 or points.shape[-1] != 2 or gt_boxes.dim() != 2 or gt_boxes.shape[-1] != 4:
        raise ValueError(f"expected points n×2 and gt_boxes m×4, got {tuple(points.shape)} and {tuple(gt_boxes.shape)}")
    if not len(points) == len(scores) == len(labels) or len(gt_boxes) != len(gt_labels):
        raise ValueError("points, scores and labels need one entry per prediction, gt_boxes and gt_labels one per box")
    num_points = len(points)
    true_positive = torch.zeros(num_points, dtype=torch.bool)
    matched_box = torch.full((num_points,), -1, dtype=torch.int64)
    if num_points == 0 or len(gt_boxes) == 0:
        return CentroidMatch(true_positive, matched_box)
    points, gt_boxes = points.detach().cpu().double(), gt_boxes.detach().cpu().double()
    labels, gt_labels = labels.detach().cpu().long(), gt_labels.detach().cpu().long()
    x, y = points[:, :1], points[:, 1:]
    inside = (x >= gt_boxes[:, 0]) & (x <= gt_boxes[:, 2]) & (y >= gt_boxes[:, 1]) & (y <= gt_boxes[:, 3])
    candidate = inside & (labels[:, None] == gt_labels[None, :])  # n×m
    centres = (gt_boxes[:, :2] + gt_boxes[:, 2:]) / 2
    distance = (points[:, None, :] - centres[None, :, :]).norm(dim=-1)
    free = torch.ones(len(gt_boxes), dtype=torch.bool)
    # Greedy by decreasing score; a loop over the (few) points of one image, on the CPU.
    for index in torch.argsort(scores.detach().cpu(), descending=True, stable=True).tolist():
        options = candidate[index] & free
        if options.any():
            box = int(torch.where(options, distance[index], torch.inf).argmin())
            free[box] = False
            true_positive[index] = True
            matched_box[index] = box
    return CentroidMatch(true_positive, matched_box)


def centroid_counts(
    points: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, gt_boxes: torch.Tensor, gt_labels: torch.Tensor
) -> CentroidCounts:
    """TP / FP / FN of one image (``match_centroids``); add the counts of every image of a set."""
    match = match_centroids(points, scores, labels, gt_boxes, gt_labels)
    true_positives = int(match.true_positive.sum())
    return CentroidCounts(true_positives, len(points) - true_positives, len(gt_boxes) - true_positives)


class CentroidMatchCounts(Metric):
    """TP / FP / FN summed over images (int64 states, summed exactly over DDP ranks).

    ``update(counts)`` adds one image's ``CentroidCounts``; ``compute()`` returns the totals
    (int64 tensor: TP, FP, FN) and ``totals()`` the same as ``CentroidCounts``. Sums of integers
    do not depend on order, so a sharded validation equals one process without putting images
    back in dataset order.
    """

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name in ("true_positives", "false_positives", "false_negatives"):
            self.add_state(name, default=torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, counts: CentroidCounts) -> None:  # type: ignore[override]
        """Add one image's counts."""
        self.true_positives += counts.true_positives
        self.false_positives += counts.false_positives
        self.false_negatives += counts.false_negatives

    def compute(self) -> torch.Tensor:
        """TP, FP and FN over every image seen (by all ranks)."""
        return torch.stack((self.true_positives, self.false_positives, self.false_negatives))

    def totals(self) -> CentroidCounts:
        """``compute()`` as ``CentroidCounts`` (precision, recall, F1)."""
        true_positives, false_positives, false_negatives = (int(value) for value in self.compute())
        return CentroidCounts(true_positives, false_positives, false_negatives)


def points_to_original(points: torch.Tensor, ratio_pad: "RatioPad", original_shape: tuple[int, int]) -> torch.Tensor:
    """Map n×2 points from input pixels back to the original image (``fit_to_input``'s geometry), clipped to it."""
    (ratio_x, ratio_y), (pad_left, pad_top) = ratio_pad
    height, width = original_shape
    mapped = points.detach().float().cpu().reshape(-1, 2).clone()
    mapped[:, 0] = ((mapped[:, 0] - pad_left) / ratio_x).clamp(0, width)
    mapped[:, 1] = ((mapped[:, 1] - pad_top) / ratio_y).clamp(0, height)
    return mapped


class PointsTask(DetectTask):
    """Centroid detection on detection data; fitness is the centroid-matching ``f1``.

    ``conf`` and ``max_det`` are what ``validate`` hands to the family's ``postprocess``. Datasets,
    ``collate``, ``preprocess`` and ``example_batch`` are the detection task's.
    """

    name = "points"
    fitness_metric = "f1"
    size_multiple = 1  # a centroid family states its grid's stride in its recipe (FOMO: 8)
    export_outputs = ("logits",)
    thresholds = ("conf", "max_det")
    result_type = "zoo_core.tasks.predictions:PointsResult"
    # Points have classes to keep, but no extent: no YOLO box lines, no crops, no box lines to draw.
    predict_options = frozenset({"classes"})
    trackable = False  # centroids, not boxes: the trackers associate boxes
    supports_single_class = False

    def __init__(self, conf: float = 0.5, max_det: int = 300, **declared: Any) -> None:
        super().__init__(conf=conf, iou=0.0, max_det=max_det, **declared)

    def default_loss(self, outputs: Any, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise ModelContractError(
            "centroid detection has no task-level loss: the family's model must define loss(outputs, batch) -> (loss, items) "
            "(see zoo_core/tasks/points.py)"
        )

    postprocess_contract = ("has no postprocess(outputs, conf, max_det); a centroid family's model must define it and "
                            "return points, scores and labels (zoo_core/tasks/points.py)")

    @staticmethod
    def _points(detection: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if "points" not in detection:
            raise ModelContractError(
                f"postprocess returned {sorted(detection)}; a centroid model returns 'points' (n×2 x, y), 'scores' and "
                "'labels' per image (zoo_core/tasks/points.py)"
            )
        return (
            detection["points"].detach().float().cpu().reshape(-1, 2),
            detection["scores"].detach().float().cpu().reshape(-1),
            detection["labels"].detach().long().cpu().reshape(-1),
        )

    def validate(
        self, model: torch.nn.Module, loader: Any, device: torch.device, names: Mapping[int, str], report: "ValidationReport | None" = None
    ) -> dict[str, float]:
        from zoo_core.data.input_pipeline import boxes_to_original

        postprocess = self._postprocess(model)
        metric = CentroidMatchCounts()
        with torch.inference_mode():
            for batch_index, batch in enumerate(loader):
                batch = self.preprocess(batch, device)
                detections = postprocess(model(batch["images"]), conf=self.conf, max_det=self.max_det)
                targets = batch["targets"].float().cpu()
                if report is not None and report.draws_batch(batch_index):
                    self._draw_points_batch(report, batch_index, batch["images"], targets, detections, names)
                for position, detection in enumerate(detections):
                    shape, ratio_pad = batch["orig_shapes"][position], batch["ratio_pads"][position]
                    points, scores, labels = self._points(detection)
                    rows = targets[targets[:, 0] == position]
                    metric.update(
                        centroid_counts(
                            points_to_original(points, ratio_pad, shape), scores, labels,
                            boxes_to_original(rows[:, 2:6], ratio_pad, shape), rows[:, 1].long(),
                        )
                    )
        totals = metric.totals()
        if report is not None:
            report.numbers["centroid_counts"] = totals
        return {"precision": totals.precision, "recall": totals.recall, "f1": totals.f1}

    def _draw_points_batch(
        self, report: "ValidationReport", index: int, images: torch.Tensor, targets: torch.Tensor,
        detections: list[dict[str, torch.Tensor]], names: Mapping[int, str],
    ) -> None:
        """``val_batch<index>_labels.jpg`` (the true boxes) and ``_pred.jpg`` (each point as a small square with its score)."""
        from zoo_core.reports.drawing import draw_box_batch

        report.image(f"val_batch{index}_labels.jpg", draw_box_batch(images, targets, names))
        half = max(2.0, images.shape[-1] / 64)
        rows = []
        for position, detection in enumerate(detections):
            points, scores, labels = self._points(detection)
            rows.append(torch.cat([
                torch.full((len(points), 1), float(position)), labels.float()[:, None], points - half, points + half, scores[:, None],
            ], dim=1))
        report.image(f"val_batch{index}_pred.jpg", draw_box_batch(images, torch.cat(rows) if rows else torch.zeros(0, 7), names))

    def predict(
        self,
        model: torch.nn.Module,
        sources: "list[SourceImage]",
        device: torch.device,
        image_size: int,
        names: Mapping[int, str],
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
    ) -> list[PointsResult]:
        """Points per image in original-image pixels (``iou`` is not used: suppression is the family's)."""
        del iou
        postprocess = self._postprocess(model)
        results = []
        with torch.inference_mode():
            for source in sources:
                image, _, ratio_pad = fit_to_input(source.image, image_size, self.input_pipeline)
                outputs = model(self.preprocess({"images": image[None]}, device)["images"])
                (detection,) = postprocess(outputs, conf=conf, max_det=max_det)
                points, scores, labels = self._points(detection)
                shape = (int(source.image.shape[-2]), int(source.image.shape[-1]))
                results.append(
                    PointsResult(
                        orig_image=source.image, path=source.path, name=source.name, names=dict(names),
                        points=points_to_original(points, ratio_pad, shape), scores=scores, labels=labels,
                    )
                )
        return results
