"""The ATSS assigner (zoo_core/assigners/atss.py): hand-computed cases and LibreYOLO 1.6's PP-YOLOE ATSS.

YOLO-NAS's loss uses it as PP-YOLOE's static assigner (``PPYOLOELoss(static=True)``, the
``yolonas`` build option ``static_assigner``); tests/test_yolonas.py checks the loss built on it.
"""

from __future__ import annotations

import math

import pytest
import torch

from zoo_core.assigners.atss import ATSSAssigner, grid_anchor_boxes

# One level of four 10×10 anchor boxes: centres (5, 5), (15, 5), (25, 5), (5, 15).
ANCHORS = torch.tensor([[0.0, 0, 10, 10], [10, 0, 20, 10], [20, 0, 30, 10], [0, 10, 10, 20]])


def _mean_plus_unbiased_std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return mean + math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_the_threshold_is_mean_plus_unbiased_std_of_the_nearest_candidates():
    # Box [0, 0, 16, 10], centre (8, 5): the three nearest anchors are a0 (3 px), a1 (7), a3 (10.4); a2 (17) is out.
    # Their IoUs: a0 100/160 = 0.625, a1 60/200 = 0.3, a3 0 -> threshold 0.3083 + 0.3126 = 0.6209.
    assert _mean_plus_unbiased_std([0.625, 0.3, 0.0]) == pytest.approx(0.620916, abs=1e-6)
    result = ATSSAssigner(num_classes=3, top_k=3)(
        ANCHORS, [4], torch.tensor([[2]]), torch.tensor([[[0.0, 0, 16, 10]]]), torch.tensor([[True]])
    )
    assert result.foreground.tolist() == [[True, False, False, False]]  # only a0 clears 0.6209
    assert result.labels[0, 0].item() == 2 and result.gt_index[0, 0].item() == 0
    assert result.scores[0, 0].tolist() == [0.0, 0.0, 1.0]  # without predictions: the one-hot label
    assert result.scores[0, 1:].abs().sum().item() == 0.0


def test_an_anchor_claimed_twice_goes_to_the_box_it_overlaps_most_and_scores_use_predictions():
    # g0 = [0, 0, 16, 10] takes a0 (IoU 0.625 > 0.6209, as above).
    # g1 = [0, 0, 10, 14], centre (5, 7): nearest a0 (2), a3 (8), a1 (10.2); IoUs 100/140 = 0.7143,
    # 40/200 = 0.2, 0 -> threshold 0.3048 + 0.3685 = 0.6732: it takes a0 as well. a0 overlaps g1 more.
    assert _mean_plus_unbiased_std([100 / 140, 0.2, 0.0]) == pytest.approx(0.673248, abs=1e-6)
    gt_boxes = torch.tensor([[[0.0, 0, 16, 10], [0, 0, 10, 14], [0, 0, 0, 0]], [[0, 0, 0, 0]] * 3])
    gt_labels = torch.tensor([[0, 1, 0], [0, 0, 0]])
    gt_mask = torch.tensor([[True, True, False], [False, False, False]])
    # a0 predicts [0, 0, 10, 12]: IoU 120/140 with g1, its class target.
    pred_boxes = torch.zeros(2, 4, 4)
    pred_boxes[0, 0] = torch.tensor([0.0, 0, 10, 12])
    result = ATSSAssigner(num_classes=2, top_k=3)(ANCHORS, [4], gt_labels, gt_boxes, gt_mask, pred_boxes)
    assert result.foreground.tolist() == [[True, False, False, False], [False] * 4]
    assert result.gt_index[0, 0].item() == 1 and result.labels[0, 0].item() == 1
    assert result.boxes[0, 0].tolist() == [0.0, 0.0, 10.0, 14.0]
    assert result.scores[0, 0, 1].item() == pytest.approx(120 / 140, abs=1e-6)
    assert result.scores[0, 0, 0].item() == 0.0
    assert result.scores[1].abs().sum().item() == 0.0  # an image without boxes has no positives


def test_no_ground_truth_at_all_gives_an_empty_assignment_and_bad_arguments_are_named():
    result = ATSSAssigner(num_classes=2)(ANCHORS, [4], torch.zeros(3, 0), torch.zeros(3, 0, 4), torch.zeros(3, 0, dtype=torch.bool))
    assert result.scores.shape == (3, 4, 2) and not result.foreground.any()
    with pytest.raises(ValueError, match="do not add up"):
        ATSSAssigner(num_classes=1)(ANCHORS, [3], torch.zeros(1, 1), torch.zeros(1, 1, 4), torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="top_k"):
        ATSSAssigner(num_classes=1, top_k=0)
    with pytest.raises(ValueError, match="num_classes"):
        ATSSAssigner(num_classes=0)


def test_grid_anchor_boxes_are_scale_times_stride_squares():
    boxes = grid_anchor_boxes(torch.tensor([[4.0, 4.0], [16.0, 48.0]]), torch.tensor([[8.0], [32.0]]), 5.0)
    assert boxes.tolist() == [[-16.0, -16.0, 24.0, 24.0], [-64.0, -32.0, 96.0, 128.0]]


def test_it_equals_libreyolo_pp_yoloe_atss_on_random_boxes_over_three_levels():
    from libreyolo.models.yolonas.loss import ATSSAssigner as ReferenceATSS
    from libreyolo.models.yolonas.nn import generate_anchors_for_grid_cell

    torch.manual_seed(0)
    features = [torch.zeros(1, 1, h, w) for h, w in ((16, 20), (8, 10), (4, 5))]
    anchor_boxes, anchor_points, level_sizes, strides = generate_anchors_for_grid_cell(features, (8, 16, 32), 5.0, 0.5)
    batch, boxes_per_image, classes = 3, 5, 4
    centres = torch.rand(batch, boxes_per_image, 2) * torch.tensor([160.0, 128.0])
    half = torch.rand(batch, boxes_per_image, 2) * 40 + 4
    gt_boxes = torch.cat((centres - half, centres + half), dim=-1)
    gt_labels = torch.randint(0, classes, (batch, boxes_per_image))
    gt_mask = torch.ones(batch, boxes_per_image, dtype=torch.bool)
    gt_mask[2, 3:] = False
    gt_boxes[2, 3:] = 0
    noise = torch.randn(batch, anchor_points.shape[0], 4) * 5
    pred_boxes = gt_boxes.mean(dim=1, keepdim=True).expand(-1, anchor_points.shape[0], -1) + noise

    assert torch.equal(grid_anchor_boxes(anchor_points, strides, 5.0), anchor_boxes)
    mine = ATSSAssigner(classes, top_k=9)(anchor_boxes, level_sizes, gt_labels, gt_boxes, gt_mask, pred_boxes)
    labels, boxes, scores = ReferenceATSS(topk=9, num_classes=classes)(
        anchor_boxes, level_sizes, gt_labels[..., None], gt_boxes, gt_mask[..., None].float(), classes, pred_bboxes=pred_boxes
    )
    foreground = labels != classes
    assert foreground.sum() > 10
    assert torch.equal(mine.foreground, foreground)
    assert torch.equal(mine.labels[foreground], labels[foreground])
    assert torch.equal(mine.boxes[foreground], boxes[foreground])
    assert torch.allclose(mine.scores, scores, atol=1e-5)
