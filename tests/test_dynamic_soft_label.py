"""zoo_core.assigners.dynamic_soft_label (RTMDet's assigner): hand-computed cases and a per-image reference.

The reference below is a plain, loop-based transcription of the algorithm as RTMDet describes it
(arXiv:2212.07784 §3.3; mmdetection's DynamicSoftLabelAssigner): one image at a time, candidates
restricted to the anchors inside some ground truth, cost summed over every class, one top-k per
ground truth. The batched assigner must agree with it exactly on random padded batches.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from zoo_core.assigners.dynamic_soft_label import DynamicSoftLabelAssigner
LOG2 = math.log(2.0)


def _iou_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Plain IoU (rows of ``a`` against rows of ``b``), the definition the assigner follows."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).prod(-1)
    return inter / (area_a[:, None] + area_b[None] - inter)


def _reference(logits, pred_boxes, points, strides, labels, boxes, top_k=13, iou_weight=3.0, radius=3.0):
    """One image: returns (foreground A bool, gt index A, quality A)."""
    num_anchors, num_classes = logits.shape
    num_gt = len(boxes)
    foreground = torch.zeros(num_anchors, dtype=torch.bool)
    gt_index = torch.zeros(num_anchors, dtype=torch.long)
    quality = torch.zeros(num_anchors)
    if num_gt == 0:
        return foreground, gt_index, quality
    inside = torch.stack([(points[:, 0] > b[0]) & (points[:, 1] > b[1]) & (points[:, 0] < b[2]) & (points[:, 1] < b[3]) for b in boxes], 1)
    valid = inside.any(1)
    if not valid.any():
        return foreground, gt_index, quality
    idx = valid.nonzero().squeeze(1)
    ious = _iou_matrix(pred_boxes[idx], boxes).clamp(min=0)  # V×G
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    dist = (points[idx, None, :] - centres[None]).norm(dim=-1) / strides[idx, None]
    cost = torch.zeros(len(idx), num_gt)
    for v in range(len(idx)):
        for g in range(num_gt):
            soft = torch.zeros(num_classes)
            soft[labels[g]] = ious[v, g]
            x = logits[idx[v]]
            cls_cost = (F.binary_cross_entropy_with_logits(x, soft, reduction="none") * (soft - x.sigmoid()).abs() ** 2).sum()
            cost[v, g] = cls_cost - math.log(ious[v, g] + 1e-7) * iou_weight + 10 ** (dist[v, g] - radius)
    k_all = torch.topk(ious, min(top_k, len(idx)), dim=0).values.sum(0).int().clamp(min=1)
    match = torch.zeros(len(idx), num_gt, dtype=torch.bool)
    for g in range(num_gt):
        match[torch.topk(cost[:, g], int(k_all[g]), largest=False).indices, g] = True
    for v in range(len(idx)):
        if match[v].sum() > 1:
            match[v] = False
            match[v, cost[v].argmin()] = True
    for v in range(len(idx)):
        if match[v].any():
            g = int(match[v].float().argmax())
            foreground[idx[v]] = True
            gt_index[idx[v]] = g
            quality[idx[v]] = ious[v, g]
    return foreground, gt_index, quality


def _points(side: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    cells = torch.arange(side // stride, dtype=torch.float32) * stride
    y, x = torch.meshgrid(cells, cells, indexing="ij")
    points = torch.stack((x, y), -1).reshape(-1, 2)
    return points, torch.full((len(points), 1), float(stride))


def test_single_box_takes_its_cheapest_candidate_with_hand_computed_costs():
    # One 12×12 box centred at (8, 8); anchors at (4, 4), (8, 8), (12, 12) inside it, (20, 20) outside.
    points = torch.tensor([[4.0, 4.0], [8.0, 8.0], [12.0, 12.0], [20.0, 20.0]])
    strides = torch.full((4, 1), 8.0)
    gt = torch.tensor([[[2.0, 2.0, 14.0, 14.0]]])
    pred = torch.tensor([[[2.0, 2.0, 14.0, 14.0], [2.0, 2.0, 8.0, 14.0], [2.0, 2.0, 14.0, 5.0], [16.0, 16.0, 24.0, 24.0]]])
    logits = torch.zeros(1, 4, 2)  # every probability 0.5
    assigner = DynamicSoftLabelAssigner(num_classes=2)
    cost, ious, candidate = assigner.cost_matrix(
        logits, pred, points, strides, torch.tensor([[0]]), gt, torch.tensor([[True]])
    )
    assert candidate[0, 0].tolist() == [True, True, True, False]
    assert ious[0, 0, :3].tolist() == pytest.approx([1.0, 0.5, 0.25], abs=1e-6)
    # With logit 0, BCE(0, t) = log 2 for any t: the label class costs log2·(IoU − ½)², the other log2·¼.
    centre_off = 10 ** (math.hypot(4, 4) / 8 - 3)
    expected = [
        LOG2 * 0.25 + LOG2 * 0.25 + 0.0 + centre_off,
        LOG2 * 0.0 + LOG2 * 0.25 - 3 * math.log(0.5) + 10**-3,
        LOG2 * 0.0625 + LOG2 * 0.25 - 3 * math.log(0.25) + centre_off,
    ]
    assert cost[0, 0, :3].tolist() == pytest.approx(expected, abs=1e-5)
    assert math.isinf(cost[0, 0, 3])
    # dynamic k = int(1 + 0.5 + 0.25) = 1: the exact box (cost 0.352) wins.
    result = assigner(logits, pred, points, strides, torch.tensor([[0]]), gt, torch.tensor([[True]]))
    assert result.foreground[0].tolist() == [True, False, False, False]
    assert result.quality[0, 0].item() == pytest.approx(1.0, abs=1e-6)
    assert result.scores[0, 0].tolist() == pytest.approx([1.0, 0.0], abs=1e-6)
    assert result.boxes[0, 0].tolist() == [2.0, 2.0, 14.0, 14.0]
    assert result.labels[0, 0].item() == 0


def test_dynamic_k_is_the_integer_part_of_the_summed_top_ious():
    # Five candidates predicting boxes of IoU 0.9, 0.8, 0.7, 0.3, 0.2 with the ground truth: k = int(2.9) = 2.
    points = torch.tensor([[10.0, 10.0], [11.0, 10.0], [12.0, 10.0], [13.0, 10.0], [14.0, 10.0]])
    strides = torch.full((5, 1), 8.0)
    gt = torch.tensor([[[0.0, 0.0, 20.0, 20.0]]])
    widths = torch.tensor([18.0, 16.0, 14.0, 6.0, 4.0])  # IoU = width / 20 (full height)
    pred = torch.stack((torch.zeros(5), torch.zeros(5), widths, torch.full((5,), 20.0)), -1)[None]
    logits = torch.zeros(1, 5, 1)
    result = DynamicSoftLabelAssigner(1)(logits, pred, points, strides, torch.tensor([[0]]), gt, torch.tensor([[True]]))
    assert result.foreground[0].tolist() == [True, True, False, False, False]
    assert result.quality[0].tolist() == pytest.approx([0.9, 0.8, 0, 0, 0], abs=1e-5)
    # top_k caps the summed IoUs: with top_k=1 only the best IoU counts, so k = int(0.9) -> 1.
    capped = DynamicSoftLabelAssigner(1, top_k=1)(logits, pred, points, strides, torch.tensor([[0]]), gt, torch.tensor([[True]]))
    assert capped.foreground[0].tolist() == [True, False, False, False, False]


def test_an_anchor_claimed_twice_keeps_the_cheaper_ground_truth():
    # Two nested boxes of different classes; the only candidate anchor's prediction fits the inner one.
    points = torch.tensor([[10.0, 10.0], [40.0, 40.0]])
    strides = torch.full((2, 1), 8.0)
    gt = torch.tensor([[[0.0, 0.0, 20.0, 20.0], [0.0, 0.0, 30.0, 30.0]]])
    pred = torch.tensor([[[0.0, 0.0, 20.0, 20.0], [35.0, 35.0, 45.0, 45.0]]])
    logits = torch.zeros(1, 2, 2)
    result = DynamicSoftLabelAssigner(2)(logits, pred, points, strides, torch.tensor([[0, 1]]), gt, torch.tensor([[True, True]]))
    assert result.foreground[0].tolist() == [True, False]
    assert result.gt_index[0, 0].item() == 0 and result.labels[0, 0].item() == 0
    assert result.scores[0, 0].tolist() == pytest.approx([1.0, 0.0], abs=1e-6)


def test_padding_empty_images_and_boxes_without_candidates():
    points, strides = _points(32, 8)
    assigner = DynamicSoftLabelAssigner(3)
    logits = torch.randn(2, len(points), 3)
    pred = torch.rand(2, len(points), 4) * 32
    pred[..., 2:] += pred[..., :2]
    # image 0: one real box and one padded slot; image 1: only padding.
    gt = torch.tensor([[[4.0, 4.0, 28.0, 28.0], [0.0, 0.0, 32.0, 32.0]], [[0.0, 0.0, 32.0, 32.0], [0.0, 0.0, 32.0, 32.0]]])
    mask = torch.tensor([[True, False], [False, False]])
    labels = torch.tensor([[2, 1], [0, 0]])
    result = assigner(logits, pred, points, strides, labels, gt, mask)
    assert result.foreground[0].any() and not result.foreground[1].any()
    assert (result.gt_index[0][result.foreground[0]] == 0).all()
    assert (result.labels[0][result.foreground[0]] == 2).all()
    assert result.scores[1].abs().sum() == 0 and result.quality[1].abs().sum() == 0
    # a box between the anchor points has no candidate at all
    tiny = torch.tensor([[[1.0, 1.0, 3.0, 3.0]]])
    none = assigner(logits[:1], pred[:1], points, strides, torch.tensor([[0]]), tiny, torch.tensor([[True]]))
    assert not none.foreground.any()
    # no ground truth in the batch
    empty = assigner(logits, pred, points, strides, torch.zeros(2, 0), torch.zeros(2, 0, 4), torch.zeros(2, 0, dtype=torch.bool))
    assert not empty.foreground.any() and empty.scores.shape == logits.shape


@pytest.mark.parametrize("seed", range(6))
def test_batched_assignment_equals_the_per_image_reference(seed: int):
    generator = torch.Generator().manual_seed(seed)
    side, num_classes = 64, 4
    points, strides = zip(*(_points(side, stride) for stride in (8, 16, 32)))
    points, strides = torch.cat(points), torch.cat(strides)
    batch, max_gt = 3, 5
    counts = torch.randint(0, max_gt + 1, (batch,), generator=generator)
    counts[0] = max_gt
    xy = torch.rand(batch, max_gt, 2, generator=generator) * side * 0.7
    wh = torch.rand(batch, max_gt, 2, generator=generator) * side * 0.5 + 4
    gt = torch.cat((xy, (xy + wh).clamp(max=side)), -1)
    mask = torch.arange(max_gt)[None] < counts[:, None]
    labels = torch.randint(0, num_classes, (batch, max_gt), generator=generator)
    logits = torch.randn(batch, len(points), num_classes, generator=generator) * 2
    centre = points[None] + torch.randn(batch, len(points), 2, generator=generator) * 4
    half = torch.rand(batch, len(points), 2, generator=generator) * 20 + 2
    pred = torch.cat((centre - half, centre + half), -1)
    result = DynamicSoftLabelAssigner(num_classes)(logits, pred, points, strides, labels, gt, mask)
    for image in range(batch):
        count = int(counts[image])
        foreground, gt_index, quality = _reference(
            logits[image], pred[image], points, strides[:, 0], labels[image, :count], gt[image, :count]
        )
        assert torch.equal(result.foreground[image], foreground)
        assert torch.equal(result.gt_index[image][foreground], gt_index[foreground])
        torch.testing.assert_close(result.quality[image], quality, atol=1e-5, rtol=0)
        expected_scores = F.one_hot(labels[image][result.gt_index[image]], num_classes) * quality[:, None]
        torch.testing.assert_close(result.scores[image], expected_scores, atol=1e-5, rtol=0)
    assert result.foreground.sum() > 0
