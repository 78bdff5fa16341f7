"""Sharded validation over two real gloo processes equals single-process validation, for every task.

Each rank validates its ``InferenceShardSampler`` shard of 5 samples (3 and 2: an uneven split,
with a different number of batches per rank), then of 1 sample (rank 1 gets none); the
torchmetrics states are synchronised in ``compute()``, so both ranks must return exactly the
numbers one process computes (detection's per-class table too: images, instances, P, R, mAP per class).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_multiprocessing
from torch.utils.data import DataLoader, Subset

from zoo_core.data.sampling import InferenceShardSampler
from zoo_core.engine.distributed import find_free_port
from zoo_core.reports.validation_report import ValidationReport
from zoo_core.tasks import get_task

from .doubles import LookupDetector, TinyClassifier, TinyRestorer, TinySegmenter, image_key

DATA = "shapes:train=2,val=8,size=64,seed=1"
TASKS = ("detect", "classify", "semantic", "restore")
SAMPLES = 5
IMAGE_SIZE = {"detect": 64, "classify": 32, "semantic": 64, "restore": 32}


def noisy_detector(task: Any, dataset: Any) -> LookupDetector:
    """Ground truth moved by a few pixels with scores that do not follow quality, plus false positives."""
    generator = torch.Generator().manual_seed(7)
    table = {}
    for index in range(len(dataset)):
        batch = task.preprocess(task.collate([dataset[index]]), torch.device("cpu"))
        rows = batch["targets"]
        boxes = rows[:, 2:6] + torch.randn(len(rows), 4, generator=generator) * 3
        false_boxes = torch.rand(2, 2, generator=generator) * 40
        false_boxes = torch.cat([false_boxes, false_boxes + 12], dim=1)
        table[image_key(batch["images"][0])] = {
            "boxes": torch.cat([boxes, false_boxes]),
            "scores": torch.rand(len(rows) + 2, generator=generator),
            "labels": torch.cat([rows[:, 1].long(), torch.randint(0, 4, (2,), generator=generator)]),
        }
    return LookupDetector(table)


def build_case(task_name: str, samples: int) -> tuple[Any, Any, Any, torch.nn.Module]:
    """The task, its spec, the first ``samples`` validation samples and a deterministic model."""
    torch.manual_seed(3)
    task = get_task(task_name)
    spec = task.prepare(DATA)
    dataset = Subset(task.dataset(spec, "val", IMAGE_SIZE[task_name], None), range(samples))
    if task_name == "detect":
        model: torch.nn.Module = noisy_detector(task, dataset)
    elif task_name == "classify":
        model = TinyClassifier(len(spec.names))
    elif task_name == "semantic":
        model = TinySegmenter(len(spec.names))
    else:
        model = TinyRestorer()
    return task, spec, dataset, model.eval()


def validate_shard(task_name: str, rank: int, world_size: int, samples: int = SAMPLES, report_to: Path | None = None) -> dict[str, Any]:
    """The shard's metrics; with ``report_to``, also the numbers behind the report's charts (as lists)."""
    task, spec, dataset, model = build_case(task_name, samples)
    loader = DataLoader(dataset, batch_size=2, sampler=InferenceShardSampler(len(dataset), rank, world_size), collate_fn=task.collate)
    report = ValidationReport(report_to / task_name, write=rank == 0) if report_to is not None else None
    found = task.validate(model, loader, torch.device("cpu"), spec.names, report=report)
    metrics: dict[str, Any] = dict(found)
    if getattr(found, "class_table", None) is not None:  # detection's per-class table (P, R, mAP per class) too
        metrics["class_table"] = found.class_table.rows()
    if report is not None:
        metrics.update({name: value.tolist() for name, value in report.numbers.items()})
    return metrics


def _rank_main(rank: int, world_size: int, port: int, output: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        results = {task_name: validate_shard(task_name, rank, world_size) for task_name in TASKS}
        # one sample over two ranks: rank 1 has nothing to validate and must still sync
        results.update({f"{task_name}/1": validate_shard(task_name, rank, world_size, samples=1) for task_name in TASKS})
        # the report's confusion matrices and per-class scores are summed over ranks too
        results.update({f"{task_name}/report": validate_shard(task_name, rank, world_size, report_to=Path(output, f"report{rank}"))
                        for task_name in TASKS})
        Path(output, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def test_sharded_validation_on_two_processes_equals_one_process(tmp_path: Path):
    torch.set_num_threads(1)
    single = {task_name: validate_shard(task_name, 0, 1) for task_name in TASKS}
    single.update({f"{task_name}/1": validate_shard(task_name, 0, 1, samples=1) for task_name in TASKS})
    single.update({f"{task_name}/report": validate_shard(task_name, 0, 1, report_to=tmp_path / "single") for task_name in TASKS})
    assert sum(map(sum, single["detect/report"]["confusion_matrix"])) > 0 and "per_class_iou" in single["semantic/report"]
    # the numbers must be informative, or equality would prove little
    assert 0 < single["detect"]["mAP50"] < 1 and 0 < single["semantic"]["mIoU"] < 1
    assert 0 < single["restore"]["psnr"] < 100 and 0 < single["classify"]["top5"]
    table = single["detect"]["class_table"]
    assert len(table) > 2 and table[0]["name"] == "all" and 0 < table[0]["precision"] < 1 and 0 < table[0]["recall"] <= 1

    context = torch_multiprocessing.start_processes(
        _rank_main, args=(2, find_free_port(), str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 180
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail("the two validation processes did not finish in 180 s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    assert (tmp_path / "report0" / "detect" / "confusion_matrix.png").is_file()
    assert not (tmp_path / "report1").exists(), "only rank 0 writes the report"
    for rank in range(2):
        shard_results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert shard_results.keys() == single.keys()
        for case in single:
            assert shard_results[case] == single[case], f"rank {rank}, {case}"


def test_shards_of_five_over_two_ranks_are_uneven():
    assert [len(InferenceShardSampler(SAMPLES, rank, 2)) for rank in range(2)] == [3, 2]
    assert os.environ.get("WORLD_SIZE") is None  # the isolation fixture cleared any torchrun variables
