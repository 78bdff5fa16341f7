"""Pose (``pose``): YOLO pose labels and COCO keypoints, keypoints that stay on their pixels through augmentation
(mosaic, affine, letterbox, flip with ``flip_idx``), points leaving the image unlabelled, OKS keypoint AP with the
layout's sigmas (two ranks equal one process), results (``keypoints.xy/.conf/.data``, drawing, JSON, save_txt).

The scenes here are built by hand (``dot_scenes``): each object is a box whose keypoints are painted as small
dots, keypoint ``k`` in its own colour, so a test can read from the pixels where every keypoint went.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pytest
import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from zoo_core.data.errors import DatasetError, DatasetWarning, ProblemReport
from zoo_core.data.keypoints import COCO_KEYPOINT_SIGMAS, PoseLayout, PoseRecord, parse_pose_layout, parse_pose_line, read_pose_labels
from zoo_core.data.sampling import InferenceShardSampler
from zoo_core.registry import builtin_tasks
from zoo_core.tasks import get_task
from zoo_core.tasks.base import AugmentSettings
from zoo_core.tasks.pose import PoseDataset, PoseTask, keypoint_average_precision, pose_fitness
from zoo_core.tasks.predictions import Keypoints, PoseResult

from . import family_checks as checks
from .doubles import image_key

NAMES = {0: "thing"}
#: keypoint k of every object is painted in DOT_COLOURS[k]; 0 and 1 are a left/right pair, 2 has no side
DOT_COLOURS = ((250, 30, 30), (30, 250, 30), (30, 30, 250))
LAYOUT = PoseLayout(3, 3, (1, 0, 2), (0.1, 0.1, 0.1), ((0, 1), (1, 2)))


def dot_scenes(folder: Path, count: int, *, size: int = 96, seed: int = 0) -> list[PoseRecord]:
    """``count`` dark images, each with two objects whose three keypoints are 5×5 dots of ``DOT_COLOURS``."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for index in range(count):
        pixels = np.full((size, size, 3), 20, dtype=np.uint8)
        pixels[size - 1, : index + 1] = 60  # scenes of equal dots differ here, so the lookup model tells them apart
        rows, points = [], []
        for left in (0.1, 0.55):
            x1, y1 = left + rng.uniform(0, 0.05), rng.uniform(0.15, 0.4)
            x2, y2 = x1 + 0.3, y1 + 0.35
            object_points = np.array([[x1 + 0.05, y1 + 0.05, 2], [x2 - 0.05, y1 + 0.05, 2], [(x1 + x2) / 2, y2 - 0.05, 2]],
                                     dtype=np.float32)
            for (x, y, _), colour in zip(object_points, DOT_COLOURS):
                column, row = int(x * size), int(y * size)
                pixels[row - 2:row + 3, column - 2:column + 3] = colour
            rows.append([0, x1, y1, x2, y2])
            points.append(object_points)
        path = folder / f"scene{index}.png"
        partial = folder / f".scene{index}.{os.getpid()}.png"  # the two ranks of a DDP test write the same scenes
        Image.fromarray(pixels).save(partial)
        os.replace(partial, path)
        records.append(PoseRecord(image=path, height=size, width=size, labels=np.array(rows, dtype=np.float32),
                                  keypoints=np.stack(points), crowd=np.zeros(2, dtype=bool), areas=np.full(2, np.nan)))
    return records


def dot_colour_at(image: torch.Tensor, x: float, y: float) -> int | None:
    """Which of ``DOT_COLOURS`` the pixel under ``(x, y)`` (pixel-edge coordinates) shows, if any."""
    pixel = image[:, int(y), int(x)].int()
    for index, colour in enumerate(DOT_COLOURS):
        if (pixel - torch.tensor(colour)).abs().sum() < 120:
            return index
    return None


def assert_points_on_their_dots(sample: dict, *, flipped: bool = False) -> int:
    """Every labelled keypoint of ``sample`` lies on a dot of its own colour (the mirrored twin's after a flip
    renamed the points through ``flip_idx``); returns how many were checked."""
    checked = 0
    image = sample["image"]
    for object_points in sample["keypoints"]:
        for index, (x, y, visibility) in enumerate(object_points.tolist()):
            if visibility <= 0:
                assert x == 0 and y == 0
                continue
            found = dot_colour_at(image, x, y)
            assert found == index, f"keypoint {index} at {x:.1f}, {y:.1f} lies on {found}"
            checked += 1
    return checked


# --------------------------------------------------------------------------- the task and its data
def test_pose_is_a_declared_task_with_the_contracts_facts():
    assert builtin_tasks()["pose"].implementation == "zoo_core.tasks.pose:PoseTask"
    task = get_task("pose")
    assert isinstance(task, PoseTask) and task.export_outputs == ("boxes", "scores", "keypoints")
    assert task.result_type == "zoo_core.tasks.predictions:PoseResult" and task.fitness_metric == "fitness"


def test_yolo_pose_lines_are_read_and_bad_ones_reported_with_the_reason(tmp_path: Path):
    layout = parse_pose_layout({"kpt_shape": [2, 3], "flip_idx": [1, 0]}, "data.yaml")
    assert layout.sigmas == (0.5, 0.5)  # uniform 1/K for a layout that is not COCO's
    good = parse_pose_line("0 0.5 0.5 0.2 0.4 0.45 0.4 2 0.55 0.4 1".split(), 1, layout)
    box, points = good
    assert box.tolist() == pytest.approx([0, 0.4, 0.3, 0.6, 0.7]) and np.allclose(points, [[0.45, 0.4, 2], [0.55, 0.4, 1]])
    assert "needs 11" in parse_pose_line("0 0.5 0.5 0.2 0.4 0.45 0.4 2".split(), 1, layout)
    assert "visibility" in parse_pose_line("0 0.5 0.5 0.2 0.4 0.45 0.4 3 0.55 0.4 1".split(), 1, layout)
    assert "outside [0, 1]" in parse_pose_line("0 0.5 0.5 0.2 0.4 1.45 0.4 2 0.55 0.4 1".split(), 1, layout)
    two = parse_pose_layout({"kpt_shape": [2, 2]}, "data.yaml")
    assert two.flip_idx is None
    _, points = parse_pose_line("0 0.5 0.5 0.2 0.4 0 0 0.55 0.4".split(), 1, two)
    assert np.allclose(points, [[0, 0, 0], [0.55, 0.4, 2]])  # x y only: 0 0 is "not labelled"
    label = tmp_path / "a.txt"
    label.write_text("0 0.5 0.5 0.2 0.4 0.45 0.4 2 0.55 0.4 1\n0 0.5 0.5 0.2 0.4\n", encoding="utf-8")
    report = ProblemReport("test")
    with pytest.warns(DatasetWarning, match="needs 11"):
        boxes, points = read_pose_labels(label, 1, layout, report)
        report.finish()
    assert boxes.shape == (1, 5) and points.shape == (1, 2, 3) and report.skipped_lines == 1


def test_a_pose_yaml_with_a_bad_layout_names_the_key_and_the_fix():
    with pytest.raises(DatasetError, match="kpt_shape"):
        parse_pose_layout({}, "data.yaml")
    with pytest.raises(DatasetError, match="flip_idx must list 3"):
        parse_pose_layout({"kpt_shape": [3, 3], "flip_idx": [0, 1]}, "data.yaml")
    with pytest.raises(DatasetError, match="kpt_sigmas"):
        parse_pose_layout({"kpt_shape": [2, 3], "kpt_sigmas": [0.1]}, "data.yaml")
    assert parse_pose_layout({"kpt_shape": [17, 3]}, "data.yaml").sigmas == COCO_KEYPOINT_SIGMAS


def test_shapes_pose_yolo_labels_and_coco_keypoints_read_the_same_objects(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("ZOO_HOME", str(tmp_path))
    task = get_task("pose")
    data = "shapes:train=4,val=3,size=64"
    yolo = task.prepare(data)
    assert yolo.extra["pose"]["kpt_shape"] == [4, 3] and yolo.extra["pose"]["flip_idx"] == [1, 0, 3, 2]
    assert yolo.extra["model_options"] == {"num_keypoints": 4, "skeleton": [[0, 1], [1, 2], [2, 3], [3, 0]]}
    coco = task.prepare(str(Path(yolo.root) / "coco-pose.yaml"))
    assert coco.extra["pose"] == yolo.extra["pose"] and coco.names == yolo.names
    first, second = task.dataset(yolo, "val", 64, None), task.dataset(coco, "val", 64, None)
    for index in range(len(first)):
        a, b = first[index], second[index]
        assert torch.allclose(a["keypoints"], b["keypoints"], atol=0.01) and torch.equal(a["classes"], b["classes"])
        assert (a["keypoints"][..., 2] > 0).all()  # every shape point is labelled (2 visible, 1 covered)


def test_validation_samples_are_letterboxed_with_their_keypoints(tmp_path: Path):
    records = dot_scenes(tmp_path, 2, size=96)
    task = get_task("pose")
    dataset = PoseDataset(records, NAMES, 64, None, task.input_pipeline, LAYOUT)
    sample = dataset[0]
    assert sample["keypoints"].shape == (2, 3, 3)
    assert assert_points_on_their_dots(sample) == 6
    truth = sample["pose_truths"]
    assert truth["keypoints"][0, 0, 0] == pytest.approx(records[0].keypoints[0, 0, 0] * 96)
    assert truth["areas"][0] == pytest.approx(truth["box_areas"][0] * 0.53)


@pytest.mark.parametrize("mosaic", [0.0, 1.0])
def test_mosaic_and_affine_move_keypoints_with_their_pixels(tmp_path: Path, mosaic: float):
    records = dot_scenes(tmp_path, 6)
    settings = AugmentSettings(mosaic=mosaic, degrees=20.0, translate=0.1, scale=0.3, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    dataset = PoseDataset(records, NAMES, 96, settings, get_task("pose").input_pipeline, LAYOUT)
    torch.manual_seed(0)
    checked = 0
    for index in range(12):
        checked += assert_points_on_their_dots(dataset[index % 6])
    assert checked > 40


def test_a_flip_renames_the_points_through_flip_idx(tmp_path: Path):
    records = dot_scenes(tmp_path, 3)
    settings = AugmentSettings(mosaic=0.0, degrees=0.0, translate=0.0, scale=0.0, fliplr=1.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    flipped = PoseDataset(records, NAMES, 96, settings, get_task("pose").input_pipeline, LAYOUT)[0]
    # after the mirror, the point named 0 (left) sits on what was point 1's dot: its colour is DOT_COLOURS[1]
    for object_points in flipped["keypoints"]:
        assert dot_colour_at(flipped["image"], *object_points[0, :2].tolist()) == 1
        assert dot_colour_at(flipped["image"], *object_points[1, :2].tolist()) == 0
        assert dot_colour_at(flipped["image"], *object_points[2, :2].tolist()) == 2
    unnamed = PoseLayout(3, 3, None, (0.1,) * 3)
    same = PoseDataset(records, NAMES, 96, settings, get_task("pose").input_pipeline, unnamed)[0]
    assert assert_points_on_their_dots(same) == 6  # no flip_idx: no flip, the points keep their names


def test_points_that_leave_the_image_become_unlabelled(tmp_path: Path):
    records = dot_scenes(tmp_path, 2)
    settings = AugmentSettings(mosaic=0.0, degrees=0.0, translate=0.45, scale=0.0, fliplr=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    dataset = PoseDataset(records, NAMES, 96, settings, get_task("pose").input_pipeline, LAYOUT)
    torch.manual_seed(3)
    lost = 0
    for _ in range(20):
        sample = dataset[0]
        assert_points_on_their_dots(sample)
        points = sample["keypoints"]
        lost += int((points[..., 2] == 0).sum())
        labelled = points[points[..., 2] > 0]
        assert ((labelled[:, :2] >= 0) & (labelled[:, :2] < 96)).all()
    assert lost > 0


def test_collate_builds_the_pose_batch_contract(tmp_path: Path):
    task = get_task("pose")
    dataset = PoseDataset(dot_scenes(tmp_path, 2), NAMES, 64, None, task.input_pipeline, LAYOUT)
    batch = task.collate([dataset[0], dataset[1]])
    assert batch["keypoints"].shape == (4, 3, 3) and batch["targets"].shape == (4, 6)
    assert len(batch["pose_truths"]) == 2
    resized = task.resize_batch(task.preprocess(batch, torch.device("cpu")), (32, 32))
    assert torch.allclose(resized["keypoints"][..., :2], batch["keypoints"][..., :2] / 2)
    example = task.example_batch(2, 64, 1)
    assert example["keypoints"].shape[0] == len(example["targets"])


# --------------------------------------------------------------------------- the metric
def _truth(points: np.ndarray, box: list[float]) -> dict[str, Any]:
    box_area = (box[2] - box[0]) * (box[3] - box[1])
    return {"boxes": np.array([box]), "labels": np.array([0]), "keypoints": points[None], "iscrowd": np.array([False]),
            "areas": np.array([box_area * 0.53]), "box_areas": np.array([box_area])}


def _found(points: np.ndarray, box: list[float], score: float = 0.9) -> dict[str, Any]:
    return {"boxes": np.array([box]), "scores": np.array([score]), "labels": np.array([0]), "keypoints": points[None]}


def test_oks_ap_is_one_for_exact_points_and_falls_with_their_error_more_for_tight_sigmas():
    points = np.array([[20.0, 20.0, 2], [40.0, 20.0, 2], [30.0, 45.0, 2]])
    box = [10.0, 10.0, 50.0, 50.0]
    exact = keypoint_average_precision([_truth(points, box)], [_found(points, box)], (0.1, 0.1, 0.1))
    assert exact["pose_mAP50-95"] == pytest.approx(1.0) and exact["mAP50-95"] == pytest.approx(1.0)
    moved = points.copy()
    moved[:, :2] += 2.5
    loose = keypoint_average_precision([_truth(points, box)], [_found(moved, box)], (0.5, 0.5, 0.5))
    tight = keypoint_average_precision([_truth(points, box)], [_found(moved, box)], (0.05, 0.05, 0.05))
    assert tight["pose_mAP50-95"] < loose["pose_mAP50-95"] < 1.0 and loose["mAP50-95"] == pytest.approx(1.0)
    unlabelled = points.copy()
    unlabelled[2] = 0  # a point the truth does not label is not scored
    wrong_third = points.copy()
    wrong_third[2, :2] = [0, 0]
    assert keypoint_average_precision([_truth(unlabelled, box)], [_found(wrong_third, box)], (0.1,) * 3)["pose_mAP50-95"] == pytest.approx(1.0)
    assert keypoint_average_precision([_truth(points, box)], [], (0.1,) * 3)["pose_mAP50"] == 0.0


class LookupPoseModel(nn.Module):
    """The pose contract with prepared answers per input image (looked up by ``image_key``): a test oracle."""

    def __init__(self, table: Mapping[int, dict[str, torch.Tensor]], count: int) -> None:
        super().__init__()
        self.table, self.count = dict(table), count
        self.anchor = nn.Parameter(torch.zeros(1))
        self.skeleton = ((0, 1),)

    def forward(self, images: torch.Tensor) -> dict[str, Any]:
        return {"found": [self.table.get(image_key(image)) for image in images]}

    def postprocess(self, outputs: Mapping[str, Any], conf: float, iou: float, max_det: int, placements: Any = None) -> list[dict]:
        from zoo_core.ops.boxes import boxes_to_original

        results = []
        for position, item in enumerate(outputs["found"]):
            if item is None:
                item = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long),
                        "keypoints": torch.zeros(0, self.count, 3)}
            boxes, points = item["boxes"].clone(), item["keypoints"].clone()
            if placements is not None:
                placement = placements[position]
                (ratio_x, ratio_y), (pad_x, pad_y) = placement.ratio_pad
                boxes = boxes_to_original(boxes, placement.ratio_pad, placement.shape)
                points[..., 0] = (points[..., 0] - pad_x) / ratio_x
                points[..., 1] = (points[..., 1] - pad_y) / ratio_y
            results.append({"boxes": boxes, "scores": item["scores"], "labels": item["labels"], "keypoints": points})
        return results


def lookup_model(task: PoseTask, dataset: PoseDataset, *, noisy: bool) -> LookupPoseModel:
    generator = torch.Generator().manual_seed(5)
    table = {}
    for index in range(len(dataset)):
        batch = task.preprocess(task.collate([dataset[index]]), torch.device("cpu"))
        boxes, labels, points = batch["targets"][:, 2:6], batch["targets"][:, 1].long(), batch["keypoints"].clone()
        scores = torch.ones(len(labels))
        if noisy:
            points[..., :2] += torch.randn(points.shape[:-1] + (2,), generator=generator) * 1.5
            scores = torch.rand(len(labels), generator=generator) * 0.5 + 0.5
        points[..., 2] = 0.9
        table[image_key(batch["images"][0])] = {"boxes": boxes, "scores": scores, "labels": labels, "keypoints": points}
    return LookupPoseModel(table, dataset.layout.count).eval()


METRIC_KEYS = {"mAP50-95", "mAP50", "mAP75", "pose_mAP50-95", "pose_mAP50", "pose_mAP75", "fitness"}


def test_validation_scores_a_perfect_and_a_noisy_pose_model(tmp_path: Path):
    task = get_task("pose")
    dataset = PoseDataset(dot_scenes(tmp_path, 4, size=80), NAMES, 64, None, task.input_pipeline, LAYOUT)
    loader = DataLoader(dataset, batch_size=3, collate_fn=task.collate)
    perfect = task.validate(lookup_model(task, dataset, noisy=False), loader, torch.device("cpu"), NAMES)
    assert set(perfect) == METRIC_KEYS and perfect["pose_mAP50-95"] == pytest.approx(1.0)
    assert perfect["fitness"] == pytest.approx(pose_fitness(perfect["mAP50"], perfect["mAP50-95"], 1.0, 1.0))
    noisy = task.validate(lookup_model(task, dataset, noisy=True), loader, torch.device("cpu"), NAMES)
    assert 0 < noisy["pose_mAP50-95"] < 1


def validate_shard(folder: str, rank: int, world_size: int, samples: int) -> dict[str, float]:
    task = get_task("pose")
    dataset = PoseDataset(dot_scenes(Path(folder) / "val", samples, seed=3), NAMES, 64, None, task.input_pipeline, LAYOUT)
    model = lookup_model(task, dataset, noisy=True)
    loader = DataLoader(dataset, batch_size=2, sampler=InferenceShardSampler(len(dataset), rank, world_size), collate_fn=task.collate)
    return task.validate(model, loader, torch.device("cpu"), NAMES)


def _rank_main(rank: int, world_size: int, port: int, output: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        results = {"5": validate_shard(output, rank, world_size, 5), "1": validate_shard(output, rank, world_size, 1)}
        Path(output, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def test_sharded_validation_on_two_processes_equals_one_process(tmp_path: Path):
    torch.set_num_threads(1)
    single = {"5": validate_shard(str(tmp_path), 0, 1, 5), "1": validate_shard(str(tmp_path), 0, 1, 1)}
    assert 0 < single["5"]["pose_mAP50-95"] < 1
    checks.run_on_two_processes(_rank_main, tmp_path, deadline_s=180, what="validation")
    checks.assert_every_rank_wrote(tmp_path, single)


# --------------------------------------------------------------------------- results
def pose_result() -> PoseResult:
    points = torch.tensor([[[12.0, 8.0, 0.9], [28.0, 8.0, 0.8], [20.0, 22.0, 0.2]],
                           [[42.0, 25.0, 0.9], [52.0, 25.0, 0.9], [47.0, 34.0, 0.95]]])
    return PoseResult(orig_image=torch.full((3, 40, 60), 20, dtype=torch.uint8), path=None, name="scene", names={0: "a", 1: "b"},
                      boxes=torch.tensor([[10.0, 5.0, 30.0, 25.0], [40.0, 20.0, 55.0, 35.0]]), scores=torch.tensor([0.9, 0.6]),
                      labels=torch.tensor([0, 1]), keypoints=points, skeleton=((0, 1), (1, 2)))


def test_keypoints_offer_xy_conf_data_and_normalised_views():
    result = pose_result()
    assert isinstance(result.keypoints, Keypoints) and result.keypoints.data.shape == (2, 3, 3)
    assert result.keypoints.xy[1, 2].tolist() == [47.0, 34.0] and result.keypoints.conf[0].tolist() == pytest.approx([0.9, 0.8, 0.2])
    assert result.keypoints.xyn[0, 1].tolist() == pytest.approx([28 / 60, 8 / 40])
    kept = result.keep_classes([1])
    assert kept.keypoints.data.shape == (1, 3, 3) and kept.keypoints.xy[0, 0].tolist() == [42.0, 25.0]


def test_to_json_and_save_txt_carry_the_points(tmp_path: Path):
    result = pose_result()
    data = json.loads(result.to_json())
    assert data["keypoints"][0][1] == pytest.approx([28.0, 8.0, 0.8])
    path = result.save_txt(tmp_path / "scene.txt", save_conf=True)
    lines = [[float(v) for v in line.split()] for line in path.read_text().splitlines()]
    assert len(lines) == 2 and len(lines[0]) == 5 + 9 + 1
    assert lines[0][5:8] == pytest.approx([12 / 60, 8 / 40, 0.9]) and lines[0][-1] == pytest.approx(0.9)


def test_plot_draws_confident_points_and_the_skeleton_only():
    result = pose_result()
    drawn = torch.from_numpy(result.plot()).permute(2, 0, 1)
    background = result.orig_image
    assert not torch.equal(drawn[:, 8, 20], background[:, 8, 20])  # on the skeleton line between points 0 and 1
    assert torch.equal(drawn[:, 22, 20], background[:, 22, 20])  # point 2 of object 0 has confidence 0.2: not drawn
    assert not torch.equal(drawn[:, 34, 47], background[:, 34, 47])


def test_predict_returns_keypoints_at_the_original_size_with_the_models_skeleton(tmp_path: Path):
    from zoo_core.data.images import SourceImage

    task = get_task("pose")
    dataset = PoseDataset(dot_scenes(tmp_path, 1, size=80), NAMES, 64, None, task.input_pipeline, LAYOUT)
    model = lookup_model(task, dataset, noisy=False)
    image = torch.from_numpy(np.array(Image.open(dataset.records[0].image))).permute(2, 0, 1).contiguous()
    (result,) = task.predict(model, [SourceImage(image=image, path=None, name="scene")], torch.device("cpu"), 64, NAMES)
    assert isinstance(result, PoseResult) and result.skeleton == ((0, 1),)
    expected = dataset.pose_truths(0)["keypoints"]
    assert np.allclose(result.keypoints.xy.numpy(), expected[..., :2], atol=1e-3)
