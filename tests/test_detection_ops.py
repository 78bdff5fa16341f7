"""Shared detection pieces: box IoUs, anchors and DFL decoding, the task-aligned assigner, the
detection loss and the NMS postprocess, each against hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.ops import box_iou, complete_box_iou, distance_box_iou, generalized_box_iou

from zoo_core.assigners.task_aligned import TaskAlignedAssigner
from zoo_core.losses.detection import (
    TaskAlignedDetectionLoss,
    distribution_focal_loss,
    pad_targets_per_image,
)
from zoo_core.nn.detection_head import (
    DecoupledDetectionHead,
    decode_dense_predictions,
    distribution_to_distances,
    make_anchor_points,
)
from zoo_core.ops.boxes import aligned_box_iou, boxes_to_distances, distances_to_boxes
from zoo_core.ops.nms import dense_detections_nms


def _ciou_by_hand(box1: tuple[float, ...], box2: tuple[float, ...]) -> float:
    """CIoU from its definition (Zheng et al., 2020), in plain floats."""
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = box1, box2
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    iou = inter / union
    diagonal = (max(ax2, bx2) - min(ax1, bx1)) ** 2 + (max(ay2, by2) - min(ay1, by1)) ** 2
    centres = ((ax1 + ax2 - bx1 - bx2) / 2) ** 2 + ((ay1 + ay2 - by1 - by2) / 2) ** 2
    v = 4 / math.pi**2 * (math.atan((bx2 - bx1) / (by2 - by1)) - math.atan((ax2 - ax1) / (ay2 - ay1))) ** 2
    alpha = v / (1 - iou + v)
    return iou - centres / diagonal - alpha * v


# ------------------------------------------------------------------------------------ IoUs
def test_iou_variants_of_two_overlapping_squares_match_hand_computation():
    a = torch.tensor([0.0, 0.0, 2.0, 2.0])
    b = torch.tensor([1.0, 1.0, 3.0, 3.0])
    # intersection 1, union 7, enclosing box 3×3 (area 9, squared diagonal 18), centres √2 apart
    assert aligned_box_iou(a, b, "iou").item() == pytest.approx(1 / 7, abs=1e-6)
    assert aligned_box_iou(a, b, "giou").item() == pytest.approx(1 / 7 - 2 / 9, abs=1e-6)
    assert aligned_box_iou(a, b, "diou").item() == pytest.approx(1 / 7 - 2 / 18, abs=1e-6)
    # same aspect ratio: CIoU's aspect term vanishes
    assert aligned_box_iou(a, b, "ciou").item() == pytest.approx(1 / 7 - 2 / 18, abs=1e-6)


def test_ciou_penalises_a_different_aspect_ratio_as_defined():
    wide, square = (0.0, 0.0, 4.0, 2.0), (0.0, 0.0, 2.0, 2.0)
    # IoU 1/2, centres 1 apart, enclosing diagonal² 20, v = 4/π²·(atan 2 − atan 1)²
    v = 4 / math.pi**2 * (math.atan(2.0) - math.atan(1.0)) ** 2
    expected = 0.5 - 1 / 20 - v / (0.5 + v) * v
    assert _ciou_by_hand(wide, square) == pytest.approx(expected)
    assert aligned_box_iou(torch.tensor(wide), torch.tensor(square), "ciou").item() == pytest.approx(expected, abs=1e-6)


def test_aligned_ious_equal_torchvision_pairwise_diagonals_and_broadcast():
    torch.manual_seed(0)
    corners = torch.rand(2, 7, 2) * 50
    sizes = torch.rand(2, 7, 2) * 30 + 1
    boxes1, boxes2 = torch.cat((corners[0], corners[0] + sizes[0]), 1), torch.cat((corners[1], corners[1] + sizes[1]), 1)
    pairwise_functions = {"iou": box_iou, "giou": generalized_box_iou, "diou": distance_box_iou, "ciou": complete_box_iou}
    for kind, pairwise in pairwise_functions.items():
        expected = pairwise(boxes1, boxes2)
        assert torch.allclose(aligned_box_iou(boxes1, boxes2, kind), expected.diagonal(), atol=1e-5), kind
        # every box of set 1 against every box of set 2 by broadcasting: the full N×M matrix
        assert torch.allclose(aligned_box_iou(boxes1[:, None], boxes2[None], kind), expected, atol=1e-5), kind


def test_iou_of_empty_boxes_is_finite_and_bad_input_is_rejected():
    empty = torch.tensor([5.0, 5.0, 5.0, 5.0])
    for kind in ("iou", "giou", "diou", "ciou"):
        assert torch.isfinite(aligned_box_iou(empty, empty, kind)).all()
    with pytest.raises(ValueError, match="unknown IoU kind"):
        aligned_box_iou(empty, empty, "siou")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dimension of 4"):
        aligned_box_iou(torch.zeros(3), torch.zeros(3))


# ------------------------------------------------------------------------ anchors and DFL
def test_anchor_points_enumerate_cell_centres_level_by_level_row_major():
    points, strides = make_anchor_points([(2, 3), (1, 1)], [8, 16])
    assert points.tolist() == [[4, 4], [12, 4], [20, 4], [4, 12], [12, 12], [20, 12], [8, 8]]
    assert strides.squeeze(1).tolist() == [8, 8, 8, 8, 8, 8, 16]
    with pytest.raises(ValueError, match="one stride per level"):
        make_anchor_points([(2, 2)], [8, 16])


def test_boxes_and_distances_round_trip_and_clamp():
    anchors = torch.tensor([[10.0, 10.0], [30.0, 5.0]])
    boxes = torch.tensor([[4.0, 2.0, 16.0, 30.0], [20.0, 0.0, 50.0, 25.0]])
    distances = boxes_to_distances(boxes, anchors)
    assert distances.tolist() == [[6, 8, 6, 20], [10, 5, 20, 20]]
    assert torch.equal(distances_to_boxes(distances, anchors), boxes)
    assert boxes_to_distances(boxes, anchors, max_distance=15).max().item() == 15
    outside = boxes_to_distances(torch.tensor([[40.0, 40.0, 50.0, 50.0]]), anchors[:1])
    assert outside.tolist() == [[0, 0, 40, 40]]  # an anchor outside its box regresses to zero


def _two_bin_logits(distances: torch.Tensor, reg_max: int) -> torch.Tensor:
    """Logits of the distribution putting all mass on the two bins bracketing each distance."""
    left = distances.floor().long().clamp(max=reg_max - 2)
    right_mass = distances - left
    probabilities = torch.zeros(*distances.shape, reg_max)
    probabilities.scatter_(-1, left[..., None], (1 - right_mass)[..., None])
    probabilities.scatter_(-1, (left + 1)[..., None], right_mass[..., None])
    return (probabilities + 1e-12).log().flatten(-2)


def test_dfl_decode_round_trips_distances_and_boxes():
    reg_max = 16
    distances = torch.tensor([[0.0, 3.25, 14.99, 7.5], [1.0, 0.5, 9.75, 12.0]])
    logits = _two_bin_logits(distances, reg_max)
    assert torch.allclose(distribution_to_distances(logits, reg_max), distances, atol=1e-4)
    # through the head's decoding: distances in strides → pixel boxes → distances again
    anchors, strides = torch.tensor([[20.0, 20.0], [100.0, 60.0]]), torch.tensor([[8.0], [16.0]])
    outputs = {
        "box_logits": logits[None],
        "class_logits": torch.zeros(1, 2, 3),
        "anchor_points": anchors,
        "anchor_strides": strides,
    }
    boxes, scores = decode_dense_predictions(outputs, reg_max)
    assert torch.allclose(boxes_to_distances(boxes[0], anchors) / strides, distances, atol=1e-4)
    assert torch.allclose(scores, torch.full((1, 2, 3), 0.5))
    with pytest.raises(ValueError, match="reg_max=8"):
        distribution_to_distances(logits, 8)


def test_distribution_focal_loss_by_hand():
    reg_max = 16
    uniform = torch.zeros(1, 4, reg_max)
    # any target under uniform logits: cross-entropy log(R) towards both bins
    any_target = torch.tensor([[2.0, 3.5, 0.0, 14.99]])
    assert distribution_focal_loss(uniform, any_target).item() == pytest.approx(math.log(reg_max), abs=1e-5)
    target = torch.tensor([[2.25, 7.0, 0.5, 11.75]])
    ideal = _two_bin_logits(target, reg_max).reshape(1, 4, reg_max)
    # at the two-bin distribution the loss is the entropy of the split: minimal over distributions
    entropy = [-(p * math.log(p) + (1 - p) * math.log(1 - p)) if 0 < p < 1 else 0.0 for p in (0.25, 0.0, 0.5, 0.75)]
    assert distribution_focal_loss(ideal, target).item() == pytest.approx(sum(entropy) / 4, abs=1e-4)
    torch.manual_seed(0)
    perturbed = ideal + 0.3 * torch.randn(1, 4, reg_max)
    assert distribution_focal_loss(perturbed, target).item() > distribution_focal_loss(ideal, target).item()


def test_head_shapes_bias_prior_and_eval_decoding():
    torch.manual_seed(0)
    head = DecoupledDetectionHead(3, [16, 24, 32], [8, 16, 32], reg_max=16, box_groups=4)
    assert head.class_branches[0][-1].bias[0].item() == pytest.approx(math.log(5 / 3 / (640 / 8) ** 2))
    assert torch.all(head.box_branches[2][-1].bias == 1.0)
    features = [torch.randn(2, c, 64 // s, 64 // s) for c, s in ((16, 8), (24, 16), (32, 32))]
    train_outputs = head(features)
    assert train_outputs["box_logits"].shape == (2, 84, 64) and train_outputs["class_logits"].shape == (2, 84, 3)
    assert "boxes" not in train_outputs
    head.eval()
    eval_outputs = head(features)
    boxes, scores = decode_dense_predictions(eval_outputs, 16)
    assert torch.equal(eval_outputs["boxes"], boxes) and torch.equal(eval_outputs["scores"], scores)
    assert eval_outputs["boxes"].shape == (2, 84, 4)


# ------------------------------------------------------------------------------ assigner
def _grid_anchors() -> torch.Tensor:
    """The 16 cell centres of a 32×32 image at stride 8; anchor index = 4·row + column."""
    points, _ = make_anchor_points([(4, 4)], [8])
    return points


FAR_AWAY = (200.0, 200.0, 201.0, 201.0)


def test_task_aligned_assigner_on_a_hand_made_case():
    anchors = _grid_anchors()
    box_a, box_b = (0.0, 0.0, 16.0, 16.0), (8.0, 8.0, 32.0, 32.0)
    # A contains anchors 0, 1, 4, 5; B contains 5, 6, 7, 9, 10, 11, 13, 14, 15 (anchor 5 is in both).
    predictions = {index: FAR_AWAY for index in range(16)}
    predictions.update(
        {
            0: box_a,  # CIoU 1 with A
            5: (4.0, 4.0, 18.0, 18.0),  # CIoU 0.440 with A, 0.045 with B
            1: (0.0, 0.0, 16.0, 8.0),  # CIoU 0.466 with A
            4: (0.0, 0.0, 8.0, 8.0),  # CIoU 0.1875 with A
            15: box_b,  # CIoU 1 with B
            10: (8.0, 8.0, 30.0, 30.0),  # CIoU 0.839 with B
        }
    )
    pred_boxes = torch.tensor([predictions[index] for index in range(16)])[None]
    pred_scores = torch.full((1, 16, 2), 0.5)
    gt_boxes = torch.tensor([[box_a, box_b, (0.0, 0.0, 32.0, 32.0)]])  # third row is padding
    gt_labels = torch.tensor([[0, 1, 1]])
    gt_mask = torch.tensor([[True, True, False]])

    result = TaskAlignedAssigner(num_classes=2, top_k=3)(pred_scores, pred_boxes, anchors, gt_labels, gt_boxes, gt_mask)

    # A's top 3 by alignment: 0, 1, 5 (not 4); B's: 15, 10, 5 (the rest predict nothing near B).
    # Anchor 5 overlaps A more than B, so A keeps it.
    assert result.foreground[0].nonzero().squeeze(1).tolist() == [0, 1, 5, 10, 15]
    assert result.gt_index[0, [0, 1, 5, 10, 15]].tolist() == [0, 0, 0, 1, 1]
    assert result.labels[0, [0, 1, 5, 10, 15]].tolist() == [0, 0, 0, 1, 1]
    assert torch.equal(result.boxes[0, 10], torch.tensor(box_b)) and torch.equal(result.boxes[0, 5], torch.tensor(box_a))
    # soft targets: alignment rescaled so each box's best anchor gets that box's best IoU (here 1)
    ciou_5a = _ciou_by_hand(box_a, predictions[5])
    ciou_10b = _ciou_by_hand(box_b, predictions[10])
    # by hand: IoU 144/308 minus centre term 18/648 (same aspect); IoU 484/576 minus 2/1152
    assert ciou_5a == pytest.approx(144 / 308 - 18 / 648) and ciou_10b == pytest.approx(484 / 576 - 2 / 1152)
    assert result.scores[0, 0].tolist() == pytest.approx([1.0, 0.0], abs=1e-5)
    assert result.scores[0, 5].tolist() == pytest.approx([ciou_5a**6, 0.0], abs=1e-5)
    assert result.scores[0, 10].tolist() == pytest.approx([0.0, ciou_10b**6], abs=1e-5)
    assert result.scores[0, 15].tolist() == pytest.approx([0.0, 1.0], abs=1e-5)
    background = ~result.foreground[0]
    assert torch.all(result.scores[0][background] == 0)


def test_assigner_prefers_the_confident_class_and_handles_empty_images():
    anchors = _grid_anchors()
    box = (0.0, 0.0, 16.0, 16.0)
    pred_boxes = torch.tensor([box] * 16)[None].repeat(2, 1, 1)  # every anchor predicts the box
    pred_scores = torch.full((2, 16, 2), 0.1)
    pred_scores[0, 4, 1] = 0.9  # anchor 4 is the one confident about class 1
    gt_boxes = torch.tensor([[box], [box]])
    gt_labels, gt_mask = torch.tensor([[1], [1]]), torch.tensor([[True], [False]])
    result = TaskAlignedAssigner(num_classes=2, top_k=1)(pred_scores, pred_boxes, anchors, gt_labels, gt_boxes, gt_mask)
    assert result.foreground[0].nonzero().squeeze(1).tolist() == [4]
    assert not result.foreground[1].any() and result.scores[1].sum() == 0  # the image whose only box is padding
    no_boxes = (torch.zeros(2, 0), torch.zeros(2, 0, 4), torch.zeros(2, 0, dtype=torch.bool))
    none = TaskAlignedAssigner(num_classes=2)(pred_scores, pred_boxes, anchors, *no_boxes)
    assert not none.foreground.any() and none.scores.shape == (2, 16, 2)


# ---------------------------------------------------------------------------------- loss
def test_targets_are_padded_per_image():
    targets = torch.tensor([[1, 2, 0, 0, 5, 5], [0, 1, 1, 1, 2, 2], [1, 0, 3, 3, 4, 4.0]])
    labels, boxes, mask = pad_targets_per_image(targets, batch_size=3)
    assert labels.tolist() == [[1, 0], [2, 0], [0, 0]]
    assert mask.tolist() == [[True, False], [True, True], [False, False]]
    assert boxes[1].tolist() == [[0, 0, 5, 5], [3, 3, 4, 4]]
    assert pad_targets_per_image(torch.zeros(0, 6), 2)[0].shape == (2, 0)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        pad_targets_per_image(targets, batch_size=1)
    with pytest.raises(ValueError, match="M×6"):
        pad_targets_per_image(torch.zeros(3, 5), 2)


def test_loss_is_near_zero_for_box_terms_when_predictions_are_exact():
    anchors = _grid_anchors()
    strides = torch.full((16, 1), 8.0)
    box = torch.tensor([0.0, 0.0, 16.0, 16.0])
    exact = _two_bin_logits(boxes_to_distances(box.expand(16, 4), anchors) / 8, 16)
    outputs = {
        "box_logits": exact[None].requires_grad_(),
        "class_logits": torch.full((1, 16, 2), -8.0).requires_grad_(),
        "anchor_points": anchors,
        "anchor_strides": strides,
    }
    criterion = TaskAlignedDetectionLoss(num_classes=2, reg_max=16)
    terms = criterion(outputs, torch.tensor([[0, 1, 0, 0, 16, 16.0]]), batch_size=1)
    assert terms.box.item() == pytest.approx(0.0, abs=1e-4)
    assert terms.dfl.item() < 0.7  # the entropy of the two-bin targets, nothing more
    assert terms.cls.item() > 0.5  # every class logit is far from the soft targets
    terms.total().backward()
    assert outputs["class_logits"].grad is not None and outputs["box_logits"].grad is not None
    # the same image twice: every term is a mean over the batch's soft targets, not a sum
    doubled_outputs = {**outputs, "box_logits": exact[None].repeat(2, 1, 1), "class_logits": torch.full((2, 16, 2), -8.0)}
    doubled = criterion(doubled_outputs, torch.tensor([[0, 1, 0, 0, 16, 16.0], [1, 1, 0, 0, 16, 16.0]]), batch_size=2)
    assert [term.item() for term in doubled] == pytest.approx([term.item() for term in terms], abs=1e-5)
    with pytest.raises(ValueError, match=r"target classes must lie in \[0, 2\)"):
        criterion(outputs, torch.tensor([[0, 2, 0, 0, 16, 16.0]]), batch_size=1)


# ----------------------------------------------------------------------------------- NMS
def _nms_case() -> tuple[torch.Tensor, torch.Tensor]:
    boxes = torch.tensor([[[0, 0, 10, 10], [1, 1, 10, 10], [1, 1, 10, 10], [50, 50, 60, 60]]], dtype=torch.float32)
    scores = torch.tensor([[[0.9, 0.0], [0.8, 0.0], [0.0, 0.7], [0.1, 0.0]]])
    return boxes, scores


def test_nms_suppresses_within_a_class_only_and_filters_by_confidence():
    boxes, scores = _nms_case()
    (result,) = dense_detections_nms(boxes, scores, conf=0.25, iou=0.7, max_det=10)
    # box 1 overlaps box 0 (IoU 0.81) in class 0: suppressed; box 2 is class 1: kept; box 3 below conf
    assert result["boxes"].tolist() == [[0, 0, 10, 10], [1, 1, 10, 10]]
    assert result["labels"].tolist() == [0, 1] and result["labels"].dtype == torch.int64
    assert result["scores"].tolist() == pytest.approx([0.9, 0.7])
    (only_best,) = dense_detections_nms(boxes, scores, conf=0.25, iou=0.7, max_det=1)
    assert only_best["scores"].tolist() == pytest.approx([0.9])
    (loose,) = dense_detections_nms(boxes, scores, conf=0.25, iou=0.9, max_det=10)
    assert len(loose["boxes"]) == 3  # IoU 0.81 is under a 0.9 threshold


def test_multi_label_nms_keeps_one_candidate_per_anchor_and_class():
    boxes, scores = _nms_case()
    scores[0, 0, 1] = 0.75  # box 0 is also class 1, more confidently than box 2
    (single,) = dense_detections_nms(boxes, scores, conf=0.25, iou=0.7, max_det=10)
    assert single["labels"].tolist() == [0, 1] and single["scores"].tolist() == pytest.approx([0.9, 0.7])
    (multi,) = dense_detections_nms(boxes, scores, conf=0.25, iou=0.7, max_det=10, multi_label=True)
    assert multi["labels"].tolist() == [0, 1] and multi["scores"].tolist() == pytest.approx([0.9, 0.75])
    assert multi["boxes"].tolist() == [[0, 0, 10, 10], [0, 0, 10, 10]]


def test_nms_on_an_empty_image_and_bad_arguments():
    (result,) = dense_detections_nms(torch.zeros(1, 5, 4), torch.zeros(1, 5, 3), conf=0.5, iou=0.5, max_det=5)
    assert result["boxes"].shape == (0, 4) and result["scores"].shape == (0,) and result["labels"].shape == (0,)
    boxes, scores = _nms_case()
    with pytest.raises(ValueError, match="conf=1.5"):
        dense_detections_nms(boxes, scores, conf=1.5, iou=0.5, max_det=5)
    with pytest.raises(ValueError, match="max_det=0"):
        dense_detections_nms(boxes, scores, conf=0.5, iou=0.5, max_det=0)
    with pytest.raises(ValueError, match="same anchors"):
        dense_detections_nms(boxes, scores[:, :2], conf=0.5, iou=0.5, max_det=5)
