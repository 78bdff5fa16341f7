"""SimOTA (zoo_core.assigners.simota, shared by YOLOX, YOLOv7 and PP-PicoDet): hand-made cases, and
LibreYOLO 1.6.0's (= YOLOX's) per-image ``simota_matching`` as a cross-check on random matrices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo_core.assigners.simota import bce_class_cost, centre_prior, inside_boxes, iou_cost, simota_assign


def _batch(*rows):
    return torch.tensor([rows], dtype=torch.float32)


def test_dynamic_k_takes_the_k_cheapest_anchors():
    # IoUs sum to 2.3 -> k = 2; the two cheapest anchors are 2 and 1 (not the best-IoU anchor 0).
    ious = _batch([0.9, 0.8, 0.5, 0.1, 0.0])
    cost = _batch([1.0, 0.5, 0.2, 3.0, 4.0])
    result = simota_assign(cost, ious, torch.ones(1, 1, 5, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool))
    assert result.foreground.tolist() == [[False, True, True, False, False]]
    assert result.gt_index.tolist() == [[0, 0, 0, 0, 0]]
    assert torch.allclose(result.matched_iou, torch.tensor([[0.0, 0.8, 0.5, 0.0, 0.0]]))
    assert int(result.num_foreground) == 2


def test_dynamic_k_is_at_least_one_and_truncates():
    # IoUs sum to 0.3 -> floor 0 -> clamped to 1; 1.99 -> 1.
    for ious_row, expected in (([0.1, 0.1, 0.1], 1), ([0.99, 0.5, 0.5], 1), ([0.99, 0.99, 0.5], 2)):
        result = simota_assign(
            _batch([3.0, 2.0, 1.0]), _batch(ious_row), torch.ones(1, 1, 3, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool)
        )
        assert int(result.num_foreground) == expected


def test_contested_anchor_goes_to_the_cheapest_claimant():
    ious = _batch([0.6, 0.6, 0.0, 0.0], [0.0, 0.7, 0.5, 0.0])  # k = 1 each
    cost = _batch([2.0, 1.0, 9.0, 9.0], [9.0, 0.5, 1.5, 9.0])  # both take anchor 1
    result = simota_assign(cost, ious, torch.ones(1, 1, 4, dtype=torch.bool), torch.ones(1, 2, dtype=torch.bool))
    assert result.foreground.tolist() == [[False, True, False, False]]
    assert int(result.gt_index[0, 1]) == 1
    assert result.matched_iou[0, 1].item() == pytest.approx(0.7)
    # SimOTA does not re-match the loser: ground truth 0 ends without a positive.
    assert int(result.num_foreground) == 1


def test_contested_anchor_can_go_to_a_ground_truth_that_did_not_take_it():
    # As in YOLOX's code, the tie-break is an argmin of the cost over *all* ground truths.
    ious = _batch([0.6, 0.6, 0.0, 0.0], [0.0, 0.7, 0.5, 0.0], [0.0, 0.2, 0.0, 0.9])  # k = 1 each
    cost = _batch([2.0, 1.0, 9.0, 9.0], [9.0, 0.5, 1.5, 9.0], [9.0, 0.1, 9.0, 0.05])
    result = simota_assign(cost, ious, torch.ones(1, 1, 4, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool))
    assert result.foreground.tolist() == [[False, True, False, True]]
    assert result.gt_index[0, [1, 3]].tolist() == [2, 2]
    assert torch.allclose(result.matched_iou[0, [1, 3]], torch.tensor([0.2, 0.9]))


def test_ineligible_anchors_are_never_taken_nor_counted():
    ious = _batch([0.9, 0.9, 0.9, 0.4])
    cost = _batch([0.1, 0.1, 5.0, 1.0])
    eligible = torch.tensor([[[False, False, True, True]]])
    result = simota_assign(cost, ious, eligible, torch.ones(1, 1, dtype=torch.bool))
    # k = floor(0.9 + 0.4) = 1 (anchors 0 and 1 are not counted); the cheapest eligible is 3.
    assert result.foreground.tolist() == [[False, False, False, True]]


def test_nothing_eligible_gives_no_positive():
    result = simota_assign(
        _batch([1.0, 2.0]), _batch([0.5, 0.5]), torch.zeros(1, 1, 2, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool)
    )
    assert not result.foreground.any() and int(result.num_foreground) == 0


def test_padding_and_batch_are_independent():
    # Image 0 has one real box and one padding slot; image 1 has two real boxes.
    ious = torch.tensor([[[0.9, 0.1, 0.0], [0.9, 0.9, 0.9]], [[0.0, 0.8, 0.0], [0.0, 0.0, 0.7]]])
    cost = torch.tensor([[[0.1, 1.0, 2.0], [0.0, 0.0, 0.0]], [[5.0, 0.2, 5.0], [5.0, 5.0, 0.3]]])
    gt_mask = torch.tensor([[True, False], [True, True]])
    result = simota_assign(cost, ious, torch.ones(2, 1, 3, dtype=torch.bool), gt_mask)
    assert result.foreground.tolist() == [[True, False, False], [False, True, True]]
    assert result.gt_index[1].tolist()[1:] == [0, 1]
    assert int(result.num_foreground) == 3
    # Batched equals one image at a time.
    for image in range(2):
        single = simota_assign(
            cost[image : image + 1], ious[image : image + 1], torch.ones(1, 1, 3, dtype=torch.bool), gt_mask[image : image + 1]
        )
        assert torch.equal(single.foreground[0], result.foreground[image])


def test_no_ground_truth():
    result = simota_assign(torch.zeros(2, 0, 5), torch.zeros(2, 0, 5), torch.ones(2, 1, 5, dtype=torch.bool), torch.zeros(2, 0, dtype=torch.bool))
    assert result.foreground.shape == (2, 5) and not result.foreground.any()


def test_bce_class_cost_matches_the_direct_sum():
    torch.manual_seed(0)
    probabilities = torch.rand(2, 7, 5) * 0.98 + 0.01
    probabilities[0, 0, 0] = 0.0  # log clamp at -100, as binary_cross_entropy does
    labels = torch.tensor([[0, 3, 4], [1, 1, 2]])
    cost = bce_class_cost(probabilities, labels)
    direct = torch.stack(
        [
            torch.stack(
                [
                    F.binary_cross_entropy(probabilities[b], F.one_hot(labels[b, g], 5).float().expand(7, 5), reduction="none").sum(-1)
                    for g in range(3)
                ]
            )
            for b in range(2)
        ]
    )
    assert torch.allclose(cost, direct, atol=1e-4)
    assert cost[0, 0, 0].item() > 100.0  # the clamped -log(0) term


def test_iou_cost():
    assert iou_cost(torch.tensor([1.0, 0.0])).tolist() == pytest.approx([0.0, -torch.log(torch.tensor(1e-8)).item()])


def test_centre_prior_and_inside_boxes_hand_case():
    centres = torch.tensor([[4.0, 4.0], [12.0, 4.0], [28.0, 4.0], [20.0, 20.0]])
    strides = torch.tensor([8.0, 8.0, 8.0, 16.0])
    boxes = torch.tensor([[[0.0, 0.0, 20.0, 20.0]]])  # centre (10, 10)
    # window half-width 1.5 * stride: 12 for stride 8, 24 for stride 16
    assert centre_prior(centres, strides, boxes, 1.5).tolist() == [[[True, True, False, True]]]
    # 28 - 10 = 18 < 2.5 * 8 = 20
    assert centre_prior(centres, strides, boxes, 2.5).tolist() == [[[True, True, True, True]]]
    assert inside_boxes(centres, boxes).tolist() == [[[True, True, False, False]]]
    # A centre on the window's side is outside (strict), as in YOLOX.
    assert centre_prior(torch.tensor([[22.0, 10.0]]), torch.tensor([8.0]), boxes, 1.5).tolist() == [[[False]]]


def test_matches_libreyolo_simota_matching_on_random_cases():
    """Cross-check with LibreYOLO 1.6.0's (YOLOX's) per-image loop on random cost/IoU matrices."""
    from libreyolo.models.yolox.nn import YOLOXHead

    head = YOLOXHead(num_classes=3, width=0.25)
    generator = torch.Generator().manual_seed(1)
    for trial in range(20):
        num_gt, num_anchors = int(torch.randint(1, 6, (1,), generator=generator)), int(torch.randint(3, 40, (1,), generator=generator))
        ious = torch.rand(num_gt, num_anchors, generator=generator) ** 2
        cost = torch.rand(num_gt, num_anchors, generator=generator) * 10
        classes = torch.zeros(num_gt)
        fg_mask = torch.ones(num_anchors, dtype=torch.bool)
        num_fg, _, ref_iou, ref_gt = head.simota_matching(cost.clone(), ious.clone(), classes, num_gt, fg_mask)
        ours = simota_assign(cost[None], ious[None], torch.ones(1, 1, num_anchors, dtype=torch.bool), torch.ones(1, num_gt, dtype=torch.bool))
        assert torch.equal(ours.foreground[0], fg_mask), trial
        assert int(ours.num_foreground) == num_fg
        assert torch.equal(ours.gt_index[0][fg_mask], ref_gt)
        assert torch.allclose(ours.matched_iou[0][fg_mask], ref_iou)
