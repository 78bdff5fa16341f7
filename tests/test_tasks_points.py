"""Centroid detection (``points``): the matching metric on hand-made cases, validation, prediction, DDP.

The task reads detection data unchanged; a prediction is a point, matched to the ground-truth box
that holds it (one match per box, by decreasing score); precision, recall and F1 come from the
totals. Sharded validation over two gloo processes must equal one process (the
``tests/test_tasks_ddp.py`` pattern).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import pytest
import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Subset

from zoo_core.data.input_pipeline import fit_to_input
from zoo_core.registry import InputPipeline
from zoo_core.data.sampling import InferenceShardSampler
from zoo_core.registry import builtin_tasks
from zoo_core.tasks import get_task
from zoo_core.tasks.base import ModelContractError
from zoo_core.tasks.points import CentroidCounts, PointsTask, centroid_counts, match_centroids, points_to_original
from zoo_core.tasks.predictions import PointsResult
from zoo_core.tasks.runner import predict, validate

from .doubles import fake_libre, image_key
from . import family_checks as checks

DATA = "shapes:train=2,val=8,size=64,seed=1"
SAMPLES = 5


# --------------------------------------------------------------------------- the metric, by hand
BOXES = torch.tensor([[0.0, 0, 20, 20], [10, 10, 40, 40], [50, 50, 60, 60]])
BOX_LABELS = torch.tensor([0, 0, 1])


def test_one_match_per_box_and_the_higher_score_claims_first():
    points = torch.tensor([[5.0, 5], [6, 6], [55, 55]])
    scores, labels = torch.tensor([0.6, 0.9, 0.8]), torch.tensor([0, 0, 1])
    match = match_centroids(points, scores, labels, BOXES, BOX_LABELS)
    # (6, 6) scores higher and takes box 0; (5, 5) lies in no other box of class 0: a false positive.
    assert match.true_positive.tolist() == [False, True, True]
    assert match.matched_box.tolist() == [-1, 0, 2]
    counts = centroid_counts(points, scores, labels, BOXES, BOX_LABELS)
    assert counts == CentroidCounts(2, 1, 1)  # box 1 is missed
    assert (counts.precision, counts.recall, counts.f1) == (pytest.approx(2 / 3), pytest.approx(2 / 3), pytest.approx(2 / 3))


def test_of_two_free_boxes_holding_a_point_the_nearest_centre_wins_and_borders_count():
    # (15, 15) is inside box 0 (centre (10, 10)) and box 1 (centre (25, 25)): box 0 is nearer, so the
    # second point, inside both as well, gets box 1.
    match = match_centroids(torch.tensor([[15.0, 15], [18, 18]]), torch.tensor([0.9, 0.5]), torch.tensor([0, 0]), BOXES, BOX_LABELS)
    assert match.matched_box.tolist() == [0, 1]
    corner = match_centroids(torch.tensor([[40.0, 40]]), torch.tensor([1.0]), torch.tensor([0]), BOXES, BOX_LABELS)
    assert corner.matched_box.tolist() == [1]


def test_a_point_in_a_box_of_another_class_is_a_false_positive():
    counts = centroid_counts(torch.tensor([[55.0, 55]]), torch.tensor([0.9]), torch.tensor([0]), BOXES, BOX_LABELS)
    assert counts == CentroidCounts(0, 1, 3) and counts.f1 == 0.0


def test_empty_images_and_counts_summed_over_images():
    assert centroid_counts(torch.zeros(0, 2), torch.zeros(0), torch.zeros(0), BOXES, BOX_LABELS) == CentroidCounts(0, 0, 3)
    assert centroid_counts(torch.tensor([[1.0, 1]]), torch.tensor([0.5]), torch.tensor([0]), torch.zeros(0, 4),
                           torch.zeros(0)) == CentroidCounts(0, 1, 0)
    total = CentroidCounts(3, 1, 0) + CentroidCounts(1, 0, 4)
    assert (total.precision, total.recall, total.f1) == (pytest.approx(0.8), pytest.approx(0.5), pytest.approx(8 / 13))
    assert CentroidCounts().f1 == 0.0
    with pytest.raises(ValueError, match="n×2"):
        match_centroids(torch.zeros(2, 3), torch.zeros(2), torch.zeros(2), BOXES, BOX_LABELS)


def test_points_map_back_through_the_letterbox():
    image = torch.zeros(3, 60, 120, dtype=torch.uint8)
    _, _, ratio_pad = fit_to_input(image, 64, InputPipeline(resize="letterbox", placement="centre"))  # 16 rows above
    mapped = points_to_original(torch.tensor([[32.0, 32.0], [0.0, 0.0]]), ratio_pad, (60, 120))
    assert torch.allclose(mapped, torch.tensor([[60.0, 30.0], [0.0, 0.0]]), atol=1e-4)


# --------------------------------------------------------------------------- the task
def test_points_is_a_task_of_the_registry_the_cli_and_get_task():
    assert builtin_tasks()["points"].implementation == "zoo_core.tasks.points:PointsTask"
    task = get_task("points")
    assert isinstance(task, PointsTask) and task.fitness_metric == "f1" and task.name == "points"
    spec = task.prepare(DATA)  # detection data, unchanged
    assert spec.task == "points" and spec.names == {0: "circle", 1: "square", 2: "triangle", 3: "cross"}
    batch = task.preprocess(task.collate([task.dataset(spec, "val", 64, None)[0]]), torch.device("cpu"))
    assert batch["images"].dtype == torch.float32 and batch["targets"].shape[1] == 6
    with pytest.raises(ModelContractError, match="no task-level loss"):
        task.loss(nn.Identity(), None, batch)


class LookupPointer(nn.Module):
    """Returns points prepared per input image (looked up by ``image_key``): a centroid test oracle."""

    def __init__(self, table: Mapping[int, dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self.table = dict(table)
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images

    def postprocess(self, outputs: torch.Tensor, conf: float = 0.5, max_det: int = 300) -> list[dict[str, torch.Tensor]]:
        empty = {"points": torch.zeros(0, 2), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
        results = []
        for image in outputs:
            found = self.table.get(image_key(image), empty)
            keep = found["scores"] > conf
            results.append({name: value[keep][:max_det] for name, value in found.items()})
        return results


def noisy_pointer(task: Any, dataset: Any) -> LookupPointer:
    """Box centres moved by a few pixels (some out of their box), some labels wrong, plus false points."""
    generator = torch.Generator().manual_seed(7)
    table = {}
    for index in range(len(dataset)):
        batch = task.preprocess(task.collate([dataset[index]]), torch.device("cpu"))
        rows = batch["targets"]
        centres = (rows[:, 2:4] + rows[:, 4:6]) / 2 + torch.randn(len(rows), 2, generator=generator) * 6
        labels = torch.where(torch.rand(len(rows), generator=generator) < 0.2, (rows[:, 1].long() + 1) % 4, rows[:, 1].long())
        table[image_key(batch["images"][0])] = {
            "points": torch.cat([centres, torch.rand(2, 2, generator=generator) * 64]),
            "scores": torch.rand(len(rows) + 2, generator=generator) * 0.5 + 0.5,
            "labels": torch.cat([labels, torch.randint(0, 4, (2,), generator=generator)]),
        }
    return LookupPointer(table)


def validate_shard(rank: int, world_size: int, samples: int = SAMPLES) -> dict[str, float]:
    torch.manual_seed(3)
    task = get_task("points")
    spec = task.prepare(DATA)
    dataset = Subset(task.dataset(spec, "val", 64, None), range(samples))
    model = noisy_pointer(task, dataset).eval()
    loader = DataLoader(dataset, batch_size=2, sampler=InferenceShardSampler(len(dataset), rank, world_size), collate_fn=task.collate)
    return task.validate(model, loader, torch.device("cpu"), spec.names)


def test_validation_scores_a_perfect_and_a_noisy_pointer():
    task = get_task("points")
    spec = task.prepare(DATA)
    dataset = task.dataset(spec, "val", 64, None)
    perfect = {}
    for index in range(len(dataset)):
        batch = task.preprocess(task.collate([dataset[index]]), torch.device("cpu"))
        rows = batch["targets"]
        perfect[image_key(batch["images"][0])] = {
            "points": (rows[:, 2:4] + rows[:, 4:6]) / 2, "scores": torch.ones(len(rows)), "labels": rows[:, 1].long()}
    loader = DataLoader(dataset, batch_size=3, collate_fn=task.collate)
    assert task.validate(LookupPointer(perfect).eval(), loader, torch.device("cpu"), spec.names) == {
        "precision": 1.0, "recall": 1.0, "f1": 1.0}
    noisy = validate_shard(0, 1)
    assert 0 < noisy["f1"] < 1 and 0 < noisy["precision"] < 1 and 0 < noisy["recall"] < 1


def _rank_main(rank: int, world_size: int, port: int, output: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        results = {"5": validate_shard(rank, world_size), "1": validate_shard(rank, world_size, samples=1)}
        Path(output, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def test_sharded_validation_on_two_processes_equals_one_process(tmp_path: Path):
    torch.set_num_threads(1)
    single = {"5": validate_shard(0, 1), "1": validate_shard(0, 1, samples=1)}
    checks.run_on_two_processes(_rank_main, tmp_path, deadline_s=180, what="validation")
    checks.assert_every_rank_wrote(tmp_path, single)


def test_the_runner_validates_and_predicts_points_in_original_pixels(tmp_path: Path):
    task = get_task("points")
    spec = task.prepare(DATA)
    image = torch.zeros(3, 60, 120, dtype=torch.uint8)
    image[:, 20:40, 50:70] = 200
    letterboxed, _, _ = fit_to_input(image, 64, PointsTask.default_input_pipeline)
    table = {image_key(letterboxed.float().div(255)): {
        "points": torch.tensor([[32.0, 32.0], [5.0, 5.0]]), "scores": torch.tensor([0.9, 0.3]), "labels": torch.tensor([1, 0])}}
    libre = fake_libre(LookupPointer(table), "points", spec.names, 64)
    (result,) = predict(libre, image.permute(1, 2, 0).numpy(), conf=0.5, save=True, project=tmp_path)
    assert isinstance(result, PointsResult) and result.task == "points"
    # 120×60 -> 64×32 at the top left: input (32, 32) is original (60, 60)
    assert torch.allclose(result.points, torch.tensor([[60.0, 60.0]]), atol=1e-4) and result.labels.tolist() == [1]
    assert result.summary().endswith("1 square") and result.to_dict()["classes"] == ["square"]
    drawn = result.plot()
    assert drawn.shape == (60, 120, 3) and (drawn != image.permute(1, 2, 0).numpy()).any()
    assert Image.open(result.save_path).size == (120, 60)
    metrics = validate(libre, DATA, batch=4, imgsz=64, device="cpu", workers=0).metrics
    assert set(metrics) == {"precision", "recall", "f1"} and metrics["f1"] == 0.0  # the lookup knows none of the scenes
