"""Rotated-box geometry, the OBB metric, YOLO OBB / DOTA data, the shapes OBB scenes and the OBB result."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from zoo_core.data.errors import ProblemReport
from zoo_core.data.obb_format import convert_dota, quadrilateral_to_xywhr, read_obb_labels
from zoo_core.ops.rotated_boxes import (
    canonical_xywhr, corners_to_xywhr, probiou, rotated_box_iou, rotated_nms, xywhr_to_corners, xywhr_to_xyxy,
)
from zoo_core.tasks.metrics import RotatedMeanAveragePrecision


def _random_boxes(count: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    centres = torch.rand(count, 2, generator=generator) * 60
    sides = torch.rand(count, 2, generator=generator) * 40 + 1
    angles = (torch.rand(count, 1, generator=generator) - 0.5) * math.pi
    return torch.cat([centres, sides, angles], dim=1)


def _opencv_iou(first: torch.Tensor, second: torch.Tensor) -> np.ndarray:
    """The reference: OpenCV's rotated-rectangle intersection, one pair at a time."""
    result = np.zeros((len(first), len(second)))
    for i, a in enumerate(first.tolist()):
        for j, b in enumerate(second.tolist()):
            _, points = cv2.rotatedRectangleIntersection(((a[0], a[1]), (a[2], a[3]), math.degrees(a[4])),
                                                          ((b[0], b[1]), (b[2], b[3]), math.degrees(b[4])))
            inter = 0.0 if points is None else cv2.contourArea(cv2.convexHull(points))
            result[i, j] = inter / (a[2] * a[3] + b[2] * b[3] - inter)
    return result


def test_exact_rotated_iou_matches_opencv_for_every_pair() -> None:
    first, second = _random_boxes(25, 0), _random_boxes(20, 1)
    second[:3] = first[:3]
    iou = rotated_box_iou(first, second)
    assert iou.shape == (25, 20)
    assert np.abs(iou.numpy() - _opencv_iou(first, second)).max() < 2e-4
    assert torch.allclose(iou.diagonal()[:3], torch.ones(3))


def test_the_same_rectangle_written_two_ways_has_iou_one() -> None:
    box = torch.tensor([[30.0, 20.0, 40.0, 10.0, 0.3]])
    turned = torch.tensor([[30.0, 20.0, 10.0, 40.0, 0.3 - math.pi / 2]])
    assert rotated_box_iou(box, turned).item() == pytest.approx(1.0, abs=1e-6)
    assert torch.allclose(canonical_xywhr(turned), box, atol=1e-6)


def test_canonical_form_is_long_side_first_in_the_half_open_range() -> None:
    boxes = canonical_xywhr(_random_boxes(50, 2) * torch.tensor([1, 1, 1, 1, 3.0]))
    assert (boxes[:, 2] >= boxes[:, 3]).all()
    assert (boxes[:, 4] >= -math.pi / 2).all() and (boxes[:, 4] < math.pi / 2).all()
    assert canonical_xywhr(torch.tensor([[0.0, 0.0, 4.0, 2.0, math.pi / 2]]))[0, 4].item() == pytest.approx(-math.pi / 2)


def test_corners_round_trip_and_enclosing_box() -> None:
    boxes = canonical_xywhr(_random_boxes(30, 3))
    assert torch.allclose(corners_to_xywhr(xywhr_to_corners(boxes)), boxes, atol=1e-4)
    flipped = xywhr_to_corners(boxes) * torch.tensor([-1.0, 1.0])  # a mirror keeps a rectangle a rectangle
    assert torch.allclose(rotated_box_iou(corners_to_xywhr(flipped), canonical_xywhr(
        torch.cat([-boxes[:, :1], boxes[:, 1:4], -boxes[:, 4:]], dim=1))).diagonal(), torch.ones(30), atol=1e-4)
    axis = xywhr_to_xyxy(torch.tensor([[10.0, 10.0, 4.0, 2.0, 0.0]]))
    assert torch.allclose(axis, torch.tensor([[8.0, 9.0, 12.0, 11.0]]))


def test_probiou_is_near_one_for_equal_boxes_smaller_apart_and_differentiable() -> None:
    boxes = _random_boxes(10, 4).requires_grad_()
    same = probiou(boxes, boxes.detach())
    assert (same > 0.999).all()
    moved = probiou(boxes, boxes.detach() + torch.tensor([5.0, 0, 0, 0, 0]))
    assert (moved < same).all()
    moved.sum().backward()
    assert torch.isfinite(boxes.grad).all() and boxes.grad.abs().sum() > 0
    assert probiou(boxes.detach()[:4], boxes.detach()[:3], pairwise=True).shape == (4, 3)


def test_rotated_nms_is_greedy_per_class_on_exact_iou() -> None:
    boxes = torch.tensor([[20.0, 20.0, 20.0, 10.0, 0.2], [21.0, 20.0, 20.0, 10.0, 0.2], [60.0, 60.0, 10.0, 5.0, 0.0],
                          [21.0, 20.0, 20.0, 10.0, 0.2]])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95])
    labels = torch.tensor([0, 0, 0, 1])
    assert rotated_nms(boxes, scores, 0.5, labels).tolist() == [3, 0, 2]
    assert rotated_nms(boxes, scores, 0.5).tolist() == [3, 2]
    assert rotated_nms(boxes, scores, 0.5, labels, max_det=2).tolist() == [3, 0]


def _metric_inputs() -> tuple[list[dict], list[dict]]:
    truths, predictions = [], []
    for index in range(7):
        true_boxes = canonical_xywhr(_random_boxes(3, 10 + index))
        labels = torch.tensor([index % 2, 1, 0])
        noisy = true_boxes + torch.randn(3, 5, generator=torch.Generator().manual_seed(index)) * torch.tensor([1.5, 1.5, 1, 1, 0.05])
        extra = _random_boxes(1, 40 + index)
        predictions.append({"boxes": torch.cat([noisy, extra]), "scores": torch.tensor([0.9, 0.8, 0.6, 0.7]),
                            "labels": torch.cat([labels, torch.tensor([0])])})
        truths.append({"boxes": true_boxes, "labels": labels})
    return predictions, truths


def test_obb_map_perfect_predictions_score_one_and_misses_lower_it() -> None:
    _, truths = _metric_inputs()
    perfect = RotatedMeanAveragePrecision()
    perfect.update([{**truth, "scores": torch.ones(len(truth["labels"]))} for truth in truths], truths, range(7))
    values = perfect.compute()
    # 0.995, not 1: the trapezoid over 101 recall points from the (0, 1) sentinel, as Ultralytics' compute_ap integrates.
    assert values["map"].item() == pytest.approx(0.995) and values["map_50"].item() == pytest.approx(0.995)
    predictions, truths = _metric_inputs()
    noisy = RotatedMeanAveragePrecision()
    noisy.update(predictions, truths, range(7))
    values = noisy.compute()
    assert 0.0 < values["map"].item() < values["map_50"].item() <= 1.0


def test_obb_map_of_shards_gathered_equals_one_process() -> None:
    """Two ranks' states joined as ``_sync_dist`` joins them (uneven shards, a padded repeat) give one process's numbers."""
    predictions, truths = _metric_inputs()
    single = RotatedMeanAveragePrecision()
    single.update(predictions, truths, range(7))
    expected = single.compute()
    ranks = [RotatedMeanAveragePrecision(), RotatedMeanAveragePrecision()]
    for position, index in enumerate([0, 2, 4, 6, 0]):  # rank 0's shard, padded by a repeat of its first image
        ranks[0].update([predictions[index]], [truths[index]], [index])
    for index in (5, 3, 1):  # rank 1's shard, out of order
        ranks[1].update([predictions[index]], [truths[index]], [index])
    joined = RotatedMeanAveragePrecision()
    for name in joined._defaults:
        setattr(joined, name, [item for rank in ranks for item in getattr(rank, name)])
    got = joined.compute()
    for key in ("map", "map_50", "map_75"):
        assert got[key].item() == expected[key].item()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_yolo_obb_labels_bad_lines_are_reported_with_their_line(tmp_path: Path) -> None:
    label = _write(tmp_path / "a.txt", "0 0.1 0.1 0.5 0.1 0.5 0.3 0.1 0.3\n1 0.1 0.1 0.5\n3 0.1 0.1 0.5 0.1 0.5 0.3 0.1 0.3\n"
                   "0 0.1 0.1 1.5 0.1 0.5 0.3 0.1 0.3\n")
    report = ProblemReport("test")
    rows = read_obb_labels(label, 2, report)
    assert rows.shape == (1, 9)
    assert report.skipped_lines == 3
    assert any(":2:" in line and "9" in line for line in report.first_skipped_lines)


def test_a_quadrilateral_becomes_its_minimum_area_rectangle() -> None:
    box = torch.tensor([[50.0, 40.0, 30.0, 12.0, 0.4]])
    corners = xywhr_to_corners(box).numpy()
    assert np.allclose(quadrilateral_to_xywhr(corners), box.numpy(), atol=1e-3)


def test_convert_dota_writes_a_yolo_obb_dataset(tmp_path: Path) -> None:
    from PIL import Image

    source = tmp_path / "dota"
    for split in ("train", "val"):
        (source / split / "images").mkdir(parents=True)
        Image.new("RGB", (200, 100)).save(source / split / "images" / "P0001.png")
        _write(source / split / "labelTxt" / "P0001.txt", "imagesource:GoogleEarth\ngsd:0.5\n"
               "10 10 50 10 50 30 10 30 plane 0\n100 20 150 20 150 80 100 80 ship 1\n1 2 3\n")
    done = convert_dota(source, tmp_path / "out")
    assert done.names == {0: "plane", 1: "ship"}
    assert done.objects == {"train": 2, "val": 2} and done.skipped_lines == 2
    line = (tmp_path / "out" / "labels" / "train" / "P0001.txt").read_text().splitlines()[0]
    assert line == "0 0.050000 0.100000 0.250000 0.100000 0.250000 0.300000 0.050000 0.300000"
    assert (source / "train" / "labelTxt" / "P0001.txt").is_file()  # the source is untouched
    skipped = convert_dota(source, tmp_path / "easy", skip_difficult=True)
    assert skipped.objects == {"train": 1, "val": 1}


def test_shapes_obb_scenes_are_rectangles_their_labels_describe() -> None:
    from zoo_core.data.shapes import render_obb_scene

    scene = render_obb_scene(np.random.default_rng([0, 0, 3, 7]), 96)
    again = render_obb_scene(np.random.default_rng([0, 0, 3, 7]), 96)
    assert np.array_equal(scene.image, again.image) and scene.classes
    for quad in scene.corners:
        box = corners_to_xywhr(torch.as_tensor(quad, dtype=torch.float32))
        assert torch.allclose(xywhr_to_corners(box), torch.as_tensor(quad, dtype=torch.float32), atol=1e-3) or \
            rotated_box_iou(box[None], torch.as_tensor(quadrilateral_to_xywhr(quad[None]))).item() > 0.999
        assert (quad >= 0).all() and (quad <= 96).all()


def test_oriented_box_result_views_json_and_yolo_obb_lines(tmp_path: Path) -> None:
    from zoo_core.tasks.predictions import OrientedBoxResult

    image = torch.zeros(3, 100, 200, dtype=torch.uint8)
    result = OrientedBoxResult(orig_image=image, path=None, name="x", names={0: "plane", 1: "ship"},
                               obb=torch.tensor([[100.0, 50.0, 40.0, 20.0, 0.0]]), scores=torch.tensor([0.9]),
                               labels=torch.tensor([1]))
    assert torch.allclose(result.obb.xywhr, torch.tensor([[100.0, 50.0, 40.0, 20.0, 0.0]]))
    assert result.obb.xyxyxyxy.shape == (1, 4, 2) and result.obb.cls.tolist() == [1.0] and result.obb.conf.tolist() == pytest.approx([0.9])
    assert result.yolo_lines() == ["1 0.6 0.6 0.4 0.6 0.4 0.4 0.6 0.4"]
    assert result.save_txt(tmp_path / "x.txt", save_conf=True).read_text() == "1 0.6 0.6 0.4 0.6 0.4 0.4 0.6 0.4 0.9\n"
    assert '"corners"' in result.to_json() and result.summary() == "x: 1 ship"
    drawn = result.plot()
    assert drawn.shape == (100, 200, 3) and drawn.any()
    assert len(result.keep_classes([0]).labels) == 0


def test_zoo_convert_dota_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    from zoo_core.cli import main

    source = tmp_path / "dota"
    for split in ("train", "val"):
        (source / split / "images").mkdir(parents=True)
        Image.new("RGB", (100, 100)).save(source / split / "images" / "a.png")
        _write(source / split / "labelTxt" / "a.txt", "10 10 50 10 50 30 10 30 ship 0\n")
    assert main(["convert-dota", str(source), str(tmp_path / "out"), "--names", "plane,ship"]) == 0
    assert "data.yaml" in capsys.readouterr().out
    assert (tmp_path / "out" / "labels" / "val" / "a.txt").read_text().startswith("1 0.1")
    assert main(["convert-dota", str(tmp_path / "missing"), str(tmp_path / "x")]) == 2
    assert "not a DOTA folder" in capsys.readouterr().err


def _shard_map(rank: int, world_size: int) -> dict[str, float]:
    """OBB mAP over the images of ``rank``'s shard (every ``world_size``-th image: 4 and 3 of 7 on two ranks)."""
    predictions, truths = _metric_inputs()
    metric = RotatedMeanAveragePrecision()
    mine = list(range(rank, len(predictions), world_size))
    metric.update([predictions[index] for index in mine], [truths[index] for index in mine], mine)
    values = metric.compute()
    return {key: float(values[key]) for key in ("map", "map_50", "map_75")}


def _metric_rank_main(rank: int, world_size: int, port: int, output: str) -> None:
    import json

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        Path(output, f"rank{rank}.json").write_text(json.dumps(_shard_map(rank, world_size)))
    finally:
        dist.destroy_process_group()


def test_obb_map_on_two_gloo_processes_equals_one_process(tmp_path: Path) -> None:
    from . import family_checks as checks

    single = _shard_map(0, 1)
    checks.run_on_two_processes(_metric_rank_main, tmp_path, deadline_s=120, what="OBB validation")
    checks.assert_every_rank_wrote(tmp_path, single)
