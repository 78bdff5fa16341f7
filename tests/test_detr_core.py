"""The DETR core (``zoo_core.detr``): hand-computed cases, parameter forms, key renaming, LibreYOLO parity helpers.

The families' own files (``tests/test_rtdetr.py``, ``test_dfine.py``, ``test_deim.py``,
``test_rtdetrv4.py``) import the helpers at the end of this module: training-loss parity with
LibreYOLO 1.6 (denoising on, same seed) and the LibreYOLO key sets of every size.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from zoo_core.detr.criterion import SetCriterion, average_box_count, global_optimal_union
from zoo_core.detr.deformable_attention import MultiScaleDeformableAttention, deformable_sampling
from zoo_core.detr.denoising import make_denoising_queries
from zoo_core.detr.distribution import boxes_to_offsets, edge_weighting, expected_offsets, offsets_to_bins, offsets_to_boxes
from zoo_core.detr.fusion_blocks import RepConvBlock
from zoo_core.detr.geometry import cxcywh_to_xyxy, inverse_sigmoid, paired_giou, pairwise_giou, sine_position_grid, xyxy_to_cxcywh
from zoo_core.detr.hybrid_encoder import HybridEncoder, IntraScaleEncoderLayer, csp_rep_fusion, elan_fusion
from zoo_core.detr.losses import distillation_divergence, fine_grained_localization_loss, matchability_aware_loss
from zoo_core.detr.matcher import HungarianMatcher, Match
from zoo_core.detr.postprocess import topk_detections
from zoo_core.detr.targets import DETRTargets


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- geometry
def test_box_conversions_and_giou_by_hand():
    box = torch.tensor([[0.5, 0.5, 0.2, 0.4]])
    assert torch.allclose(cxcywh_to_xyxy(box), torch.tensor([[0.4, 0.3, 0.6, 0.7]]))
    assert torch.allclose(xyxy_to_cxcywh(cxcywh_to_xyxy(box)), box)
    a, b = torch.tensor([[0.0, 0.0, 2.0, 2.0]]), torch.tensor([[1.0, 1.0, 3.0, 3.0]])
    # IoU 1/7, hull 9, union 7 → GIoU = 1/7 − 2/9
    assert pairwise_giou(a, b).item() == pytest.approx(1 / 7 - 2 / 9)
    assert paired_giou(a, b).item() == pytest.approx(1 / 7 - 2 / 9)
    assert inverse_sigmoid(torch.tensor([0.5, 0.0])).tolist() == pytest.approx([0.0, math.log(1e-5)])


def test_sine_position_grid_published_ordering():
    # dim 4: one frequency (ω = 1); token t of an h×w map gets u = t // h, v = t % h.
    grid = sine_position_grid(2, 3, 4)[0]
    for t in range(6):
        u, v = t // 2, t % 2
        assert grid[t].tolist() == pytest.approx([math.sin(u), math.cos(u), math.sin(v), math.cos(v)])


# ----------------------------------------------------------------------------- deformable attention
def _naive_bilinear(image: torch.Tensor, x: float, y: float) -> torch.Tensor:
    """``image`` (C, H, W) at normalised (x, y), align_corners=False, zero outside."""
    channels, height, width = image.shape
    px, py = x * width - 0.5, y * height - 0.5
    x0, y0 = math.floor(px), math.floor(py)
    out = torch.zeros(channels, dtype=image.dtype)
    for dx in (0, 1):
        for dy in (0, 1):
            xi, yi = x0 + dx, y0 + dy
            weight = (1 - abs(px - xi)) * (1 - abs(py - yi))
            if 0 <= xi < width and 0 <= yi < height:
                out += weight * image[:, yi, xi]
    return out


def test_deformable_sampling_matches_naive_per_point_reference():
    torch.manual_seed(0)
    batch, heads, head_dim, queries = 2, 2, 3, 4
    shapes, points = [(4, 5), (2, 3)], (3, 2)
    values = [torch.randn(batch * heads, head_dim, h, w, dtype=torch.float64) for h, w in shapes]
    locations = torch.rand(batch, queries, heads, sum(points), 2, dtype=torch.float64) * 1.4 - 0.2  # some outside
    weights = torch.rand(batch, queries, heads, sum(points), dtype=torch.float64).softmax(-1)
    out = deformable_sampling(values, shapes, locations, weights, points)
    expected = torch.zeros(batch, queries, heads * head_dim, dtype=torch.float64)
    for b in range(batch):
        for q in range(queries):
            for h in range(heads):
                acc = torch.zeros(head_dim, dtype=torch.float64)
                p = 0
                for level, count in enumerate(points):
                    for _ in range(count):
                        x, y = locations[b, q, h, p].tolist()
                        acc += weights[b, q, h, p] * _naive_bilinear(values[level][b * heads + h], x, y)
                        p += 1
                expected[b, q, h * head_dim : (h + 1) * head_dim] = acc
    assert torch.allclose(out, expected, atol=1e-12)


def test_deformable_locations_for_box_and_point_references():
    attention = MultiScaleDeformableAttention(8, 2, (2, 1))
    with torch.no_grad():
        attention.sampling_offsets.weight.zero_()
        attention.sampling_offsets.bias.fill_(1.0)  # every offset (1, 1)
    query = torch.zeros(1, 1, 8)
    box = torch.tensor([[[[0.5, 0.5, 0.2, 0.4]]]])
    loc = attention.sampling_locations(query, box, [(4, 4), (2, 2)])
    # level 0 (2 points): 0.5 + 1 · (1/2) · size · 0.5 ; level 1 (1 point): 0.5 + 1 · 1 · size · 0.5
    assert loc[0, 0, 0, 0].tolist() == pytest.approx([0.55, 0.6])
    assert loc[0, 0, 0, 2].tolist() == pytest.approx([0.6, 0.7])
    centre = torch.tensor([[[[0.5, 0.5], [0.25, 0.25]]]])
    loc = attention.sampling_locations(query, centre, [(4, 8), (2, 2)])
    assert loc[0, 0, 1, 0].tolist() == pytest.approx([0.5 + 1 / 8, 0.5 + 1 / 4])  # offsets in level pixels (w=8, h=4)
    assert loc[0, 0, 1, 2].tolist() == pytest.approx([0.75, 0.75])


def test_deformable_attention_published_initialisation():
    attention = MultiScaleDeformableAttention(16, 4, (2, 2))
    bias = attention.sampling_offsets.bias.detach().reshape(4, 4, 2)
    assert bias[0].tolist() == [[1, 0], [2, 0], [1, 0], [2, 0]]  # head 0 points along +x, radius 1..P per level
    assert bias[1, :, 0].abs().max() < 1e-6 and bias[1, 1, 1] == pytest.approx(2.0)  # head 1 along +y
    out = attention(torch.randn(2, 5, 16), torch.rand(2, 5, 1, 4), torch.randn(2, 16 + 4, 16), [(4, 4), (2, 2)])
    assert out.shape == (2, 5, 16)


# ----------------------------------------------------------------------------- encoder blocks
def test_repconv_fuse_is_exact_in_eval():
    torch.manual_seed(0)
    block = RepConvBlock(4, 6)
    for branch in (block.conv3x3, block.conv1x1):
        branch[1].running_mean.uniform_(-1, 1)
        branch[1].running_var.uniform_(0.5, 2)
    block.eval()
    x = torch.randn(2, 4, 5, 5)
    before = block(x)
    block.fuse()
    assert torch.allclose(block(x), before, atol=1e-5)


@pytest.mark.parametrize("fusion", [csp_rep_fusion(0.5), elan_fusion(0.34, 0.5)])
def test_hybrid_encoder_keeps_level_shapes(fusion):
    encoder = HybridEncoder((8, 16, 32), 32, fusion, ffn_dim=64, num_heads=4)
    maps = [torch.randn(1, c, 16 // 2**i, 16 // 2**i) for i, c in enumerate((8, 16, 32))]
    outputs = encoder(maps)
    assert [tuple(o.shape) for o in outputs] == [(1, 32, 16, 16), (1, 32, 8, 8), (1, 32, 4, 4)]



@pytest.mark.parametrize(("dim", "heads"), [(128, 8), (256, 8)])
@torch.no_grad()
def test_aifi_attention_gives_the_modules_bits_with_weights_trainable_or_frozen(dim, heads):
    """The published encoder's bits (``nn.MultiheadAttention`` with trainable weights) from the layer, and the same
    bits from a frozen copy (the inference form): ATen's kernel for the module's own projection follows
    ``requires_grad``, and a last-bit change there reorders near-tied query scores in the top-k."""
    torch.manual_seed(0)
    layer = IntraScaleEncoderLayer(dim, heads, 2 * dim).eval()
    frozen = copy.deepcopy(layer).requires_grad_(False)
    tokens, position = torch.randn(2, 64, dim), torch.randn(1, 64, dim)
    query = tokens + position
    published = layer.self_attn(query, query, tokens)[0]
    assert torch.equal(layer.self_attention(query, tokens), published)
    assert torch.equal(frozen.self_attention(query, tokens), published)


# ----------------------------------------------------------------------------- targets, matcher
def test_targets_from_batch_sorts_normalises_and_drops_empty_boxes():
    raw = torch.tensor([[1, 2, 0, 0, 50, 100], [0, 5, 10, 20, 30, 60], [0, 1, 10, 10, 10, 40], [1, 3, -10, 90, 30, 120]])
    targets = DETRTargets.from_batch(raw, 3, (100, 200))
    assert targets.counts == [1, 2, 0]
    assert targets.labels.tolist() == [5, 2, 3]
    assert targets.boxes[0].tolist() == pytest.approx([0.1, 0.4, 0.1, 0.4])  # (10,20,30,60) / (200,100,200,100)
    assert targets.boxes[2].tolist() == pytest.approx([0.075, 0.95, 0.15, 0.1])  # clipped to the image


def test_hungarian_matcher_hand_made_case():
    # Two queries, two targets of class 0: query 0 sits on target 1 and query 1 on target 0.
    targets = DETRTargets.from_lists([torch.tensor([0, 0])], [torch.tensor([[0.25, 0.25, 0.2, 0.2], [0.75, 0.75, 0.2, 0.2]])])
    boxes = torch.tensor([[[0.75, 0.75, 0.2, 0.2], [0.26, 0.25, 0.2, 0.2]]])
    logits = torch.zeros(1, 2, 3)
    matcher = HungarianMatcher()
    cost = matcher.cost_matrix(logits, boxes, targets)
    p = 0.5
    focal = 0.25 * (1 - p) ** 2 * -math.log(p + 1e-8) - 0.75 * p**2 * -math.log(1 - p + 1e-8)
    assert cost[0, 0, 1].item() == pytest.approx(2 * focal - 2 * 1.0)  # identical boxes: L1 0, GIoU 1
    (match,) = matcher.match([(logits, boxes)], targets)
    assert match.query.tolist() == [0, 1] and match.target.tolist() == [1, 0]


def test_hungarian_matcher_empty_targets_and_empty_images():
    logits, boxes = torch.randn(2, 5, 3), torch.rand(2, 5, 4)
    none = DETRTargets.from_lists([torch.zeros(0, dtype=torch.long)] * 2, [torch.zeros(0, 4)] * 2)
    matches = HungarianMatcher().match([(logits, boxes), (logits, boxes)], none)
    assert [len(m) for m in matches] == [0, 0]
    some = DETRTargets.from_lists([torch.zeros(0, dtype=torch.long), torch.tensor([1])], [torch.zeros(0, 4), torch.tensor([[0.5, 0.5, 0.1, 0.1]])])
    (match,) = HungarianMatcher().match([(logits, boxes)], some)
    assert match.batch.tolist() == [1] and match.target.tolist() == [0]


# ----------------------------------------------------------------------------- denoising
def test_denoising_groups_mask_and_positive_indices():
    targets = DETRTargets.from_lists([torch.tensor([3, 4]), torch.tensor([5])], [torch.full((2, 4), 0.5), torch.full((1, 4), 0.5)])
    dn = make_denoising_queries(targets, num_classes=10, num_queries=3, num_denoising=4, label_noise_ratio=0.0, box_noise_scale=0.2)
    assert dn.num_groups == 2 and dn.group_size == 4 and dn.num_queries == 8
    # labels: per group [gt0, gt1 | gt0, gt1] (positive, negative), padding = num_classes
    assert dn.labels[0].tolist() == [3, 4, 3, 4] * 2
    assert dn.labels[1].tolist() == [5, 10, 5, 10] * 2
    mask = dn.attention_mask
    assert mask.shape == (11, 11)
    assert mask[8:, :8].all() and not mask[8:, 8:].any()  # matching queries never see denoising ones
    assert not mask[:4, :4].any() and mask[:4, 4:8].all() and mask[4:8, :4].all() and not mask[:8, 8:].any()
    assert sorted(zip(dn.positive_batch.tolist(), dn.positive_query.tolist(), dn.positive_target.tolist())) == [
        (0, 0, 0), (0, 1, 1), (0, 4, 0), (0, 5, 1), (1, 0, 2), (1, 4, 2)
    ]
    # corner noise (scale 0.2 of the half size 0.25 → 0.05): positives below 0.05, negatives in [0.05, 0.1)
    boxes = dn.box_logits.sigmoid()
    corners, truth = cxcywh_to_xyxy(boxes[0]), cxcywh_to_xyxy(torch.full((4,), 0.5))
    shift = (corners - truth).abs()
    assert (shift[[0, 1, 4, 5]] <= 0.05 + 1e-5).all()
    assert (shift[[2, 3, 6, 7]] >= 0.05 - 1e-5).all() and (shift[[2, 3, 6, 7]] <= 0.1 + 1e-5).all()
    assert make_denoising_queries(DETRTargets.from_lists([torch.zeros(0, dtype=torch.long)], [torch.zeros(0, 4)]), 10, 3) is None


# ----------------------------------------------------------------------------- FDR primitives
def test_edge_weighting_by_hand():
    w = edge_weighting(32, torch.tensor([0.5]), torch.tensor([4.0]))
    step = 3 ** (2 / 30)  # (|0.5·4| + 1)^(2/(32−2))
    assert w.shape == (33,)
    assert w[0].item() == pytest.approx(-4.0) and w[32].item() == pytest.approx(4.0) and w[16].item() == 0
    assert w[17].item() == pytest.approx(step - 1) and w[15].item() == pytest.approx(1 - step)
    assert w[31].item() == pytest.approx(step**15 - 1) and step**15 - 1 == pytest.approx(2.0)
    assert torch.all(w[1:] > w[:-1])


def test_offsets_to_bins_by_hand():
    w = torch.tensor([-4.0, -1.0, 0.0, 1.0, 4.0])
    index, right, left = offsets_to_bins(torch.tensor([0.25, 1.0, -5.0, 4.0, 2.5]), w)
    assert index.tolist() == pytest.approx([2, 3, 0, 3.9, 3])
    assert right.tolist() == pytest.approx([0.25, 0.0, 0.0, 1.0, 0.5])
    assert left.tolist() == pytest.approx([0.75, 1.0, 1.0, 0.0, 0.5])


def test_boxes_offsets_round_trip_and_expectation():
    w = edge_weighting(32, torch.tensor([0.5]), torch.tensor([4.0]))
    reference = torch.tensor([[0.5, 0.5, 0.2, 0.2]])
    zero = offsets_to_boxes(reference, torch.zeros(1, 4), torch.tensor([4.0]))
    assert torch.allclose(zero, reference)  # zero offsets: the reference box itself
    target = torch.tensor([[0.35, 0.42, 0.62, 0.6]])
    index, right, left = boxes_to_offsets(reference, target, w, torch.tensor([4.0]))
    offsets = w[index.long()] * left + w[index.long() + 1] * right
    assert torch.allclose(cxcywh_to_xyxy(offsets_to_boxes(reference, offsets[None], torch.tensor([4.0]))), target, atol=1e-6)
    one_hot = torch.full((1, 4 * 33), -1e4)
    one_hot[0, [0, 33 + 16, 66 + 32, 99 + 17]] = 0
    assert expected_offsets(one_hot, w)[0].tolist() == pytest.approx([-4.0, 0.0, 4.0, w[17].item()])


# ----------------------------------------------------------------------------- losses
def test_mal_and_fgl_by_hand():
    logit, iou, gamma = torch.tensor([0.3]), torch.tensor([0.6]), 1.5
    p = torch.sigmoid(logit).item()
    positive = matchability_aware_loss(logit, iou, torch.tensor([True]), gamma=gamma).item()
    target = 0.6**1.5
    assert positive == pytest.approx(-(target * math.log(p) + (1 - target) * math.log(1 - p)))
    negative = matchability_aware_loss(logit, torch.zeros(1), torch.tensor([False]), gamma=gamma).item()
    assert negative == pytest.approx(p**1.5 * -math.log(1 - p))
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    fgl = fine_grained_localization_loss(logits, torch.tensor([1.0]), torch.tensor([0.3]), torch.tensor([0.7]), torch.tensor([2.0]))
    log_p = F.log_softmax(logits, -1)[0]
    assert fgl.item() == pytest.approx(2.0 * -(0.7 * log_p[1] + 0.3 * log_p[2]).item())
    same = torch.randn(3, 5)
    assert distillation_divergence(same, same).abs().max() < 1e-5


def test_global_optimal_union_by_hand():
    def m(b, q, t):
        return Match(torch.tensor(b), torch.tensor(q), torch.tensor(t))

    matches = [m([0, 0, 1], [5, 7, 2], [0, 1, 3]), m([0, 0, 1], [5, 7, 2], [1, 1, 3]), m([0, 1], [5, 9], [1, 2])]
    union = global_optimal_union(matches, num_queries=10, num_targets=4)
    got = sorted(zip(union.batch.tolist(), union.query.tolist(), union.target.tolist()))
    # query (0,5): target 1 twice, 0 once → 1; (0,7): 1; (1,2): 3; (1,9): 2
    assert got == [(0, 5, 1), (0, 7, 1), (1, 2, 3), (1, 9, 2)]
    tie = global_optimal_union([m([0], [1], [2]), m([0], [1], [0])], 4, 3)
    assert tie.target.tolist() == [0]  # ties go to the lowest target index


def test_average_box_count_is_the_mean_over_ranks(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None: tensor.add_(6))  # the other rank holds 6 boxes
    assert average_box_count(2, torch.device("cpu")).item() == 4.0  # (2 + 6) / 2
    assert average_box_count(2, torch.device("cpu"), distributed=False).item() == 2.0
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    assert average_box_count(0, torch.device("cpu")).item() == 1.0


def test_topk_detections_by_hand():
    scores = torch.tensor([[[0.1, 0.9], [0.8, 0.7], [0.2, 0.05]]])
    boxes = torch.arange(12.0).reshape(1, 3, 4)
    (det,) = topk_detections(scores, boxes, conf=0.5, max_det=3)
    assert det["scores"].tolist() == pytest.approx([0.9, 0.8, 0.7])
    assert det["labels"].tolist() == [1, 0, 1] and det["labels"].dtype == torch.int64
    assert det["boxes"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]]
    (few,) = topk_detections(scores, boxes, conf=0.75, max_det=2)
    assert few["scores"].tolist() == pytest.approx([0.9, 0.8])


def test_criterion_runs_on_empty_targets():
    generator = torch.Generator().manual_seed(0)
    layers = [
        {"logits": torch.randn(2, 6, 3, generator=generator, requires_grad=True),
         "boxes": torch.cat([torch.rand(2, 6, 2, generator=generator) * 0.6 + 0.2, torch.full((2, 6, 2), 0.2)], -1)}
        for _ in range(2)
    ]
    outputs = {"layers": layers, "encoder": [], "initial": None, "denoising": None}
    empty = DETRTargets.from_lists([torch.zeros(0, dtype=torch.long)] * 2, [torch.zeros(0, 4)] * 2)
    total, items = SetCriterion(3)(outputs, empty)
    assert torch.isfinite(total) and items["l1"] == 0
    total.backward()  # negatives still train the classifier
    assert layers[0]["logits"].grad.abs().sum() > 0


# ----------------------------------------------------------------------------- parameter forms, input size
def _meta_build(family: str, size: str, **options):
    from zoo_core.plugin_manager import get_plugin_manager

    with torch.device("meta"):
        return get_plugin_manager().build_model(family, size, 80, options)


def test_deployed_count_reproduces_the_official_dfine_n_log():
    # Peterande/storage logs/coco/dfine_n_coco_log.txt prints "Params:3753799" (stats() on model.deploy()).
    model = _meta_build("dfine", "n")
    assert model.published_parameter_count() == 3_753_799
    # LibreYOLO 1.6 counts 3,782,693: its up and reg_scale are frozen parameters, zoo's are saved buffers
    assert sum(p.numel() for p in model.parameters()) == 3_782_693 - 2
    assert {"decoder.up", "decoder.reg_scale"} <= set(model.state_dict()) and all(p.requires_grad for p in model.parameters())


def test_deployed_count_folds_repvgg_blocks_exactly():
    from zoo_core.detr.deploy import folded_norm_savings

    torch.manual_seed(0)
    block = RepConvBlock(4, 6)
    before = sum(p.numel() for p in block.parameters())
    saved = folded_norm_savings([block])
    block.eval()
    block.fuse()
    assert before - saved == sum(p.numel() for p in block.parameters())  # 3x3 kernel + bias


def test_rtdetr_counts_its_trainable_graph():
    model = _meta_build("rtdetr", "r18")
    assert model.published_parameter_count() == sum(p.numel() for p in model.parameters()) == 20_184_464


@pytest.mark.parametrize(("family", "size", "options", "side"), [
    ("rtdetr", "r18", {}, 128), ("dfine", "n", {}, 256), ("dfine", "n", {"num_queries": 20}, 64), ("deim", "s", {}, 128),
])
def test_minimum_input_size_gives_enough_tokens_for_the_queries(family, size, options, side):
    model = _meta_build(family, size, **options)
    assert model.minimum_input_size == side


def test_build_options_are_checked():
    with pytest.raises(ValueError, match="num_denoising"):
        _meta_build("deim", "n", queries=10)
    model = _meta_build("deim", "n", num_queries=10, num_denoising=0)
    assert model.decoder.num_queries == 10 and model.decoder.denoising_embedding is None


# ----------------------------------------------------------------------------- key renaming
def test_key_rules_rename_both_ways_through_key_renamer():
    from zoo_core.detr.key_mapping import KeyRule, add_batch_counters, rename_keys

    rules = [
        KeyRule("encoder.lateral_convs.{k}", "encoder.lateral.{k}", "conv_norm"),
        KeyRule("encoder.input_proj.{i}", "encoder.input_projections.{i}"),
        KeyRule("decoder.up", "decoder.up"),
    ]
    foreign = {
        "encoder.lateral_convs.1.conv.weight": torch.zeros(1),
        "encoder.lateral_convs.1.norm.running_var": torch.ones(1),
        "encoder.input_proj.0.0.weight": torch.zeros(1),
        "decoder.up": torch.zeros(1),
        "decoder.anchors": torch.zeros(1),
        "somewhere.else": torch.zeros(1),
    }
    zoo = rename_keys(foreign, rules, to_zoo=True, drop=[r"^decoder\.anchors$"])
    assert set(zoo) == {"encoder.lateral.1.0.weight", "encoder.lateral.1.1.running_var", "encoder.input_projections.0.0.weight",
                        "decoder.up", "somewhere.else"}
    back = rename_keys(zoo, rules, to_zoo=False)
    assert set(back) == set(foreign) - {"decoder.anchors"}
    assert "encoder.lateral.1.1.num_batches_tracked" in add_batch_counters(dict(zoo))


# ----------------------------------------------------------------------------- helpers of the family files
def libreyolo_key_sets_agree(family: str, size: str) -> None:
    """zoo's keys written for LibreYOLO are exactly a LibreYOLO model's, and read back to zoo's (meta device)."""
    import importlib

    from tests.oracle_cases import build_libreyolo

    convert = importlib.import_module(f"zoo_{family}.convert")
    zoo_keys = {key: torch.zeros(1) for key in _meta_build(family, size).state_dict()}
    reference = build_libreyolo(family, size)
    expected = {key for key in reference.model.state_dict() if not key.endswith(("anchors", "valid_mask", "num_points_scale"))}
    if size in convert.FROZEN_NORM_SIZES:  # LibreYOLO loads these from checkpoints with FrozenBatchNorm2d
        expected = {key for key in expected if not (key.startswith("backbone.") and key.endswith("num_batches_tracked"))}
    written = convert.to_libreyolo(size, zoo_keys)
    assert set(written) == expected
    assert set(convert.from_libreyolo(size, written)) == set(zoo_keys)


def training_loss_parity(family: str, size: str, side: int) -> tuple[float, float]:
    """LibreYOLO's training loss (its trainer's criterion, denoising on) and zoo's recipe step on the same weights and seed."""
    import importlib

    from tests.oracle_cases import ORACLE_CASES, build_libreyolo, example_targets

    from zoo_core.facade import LibreYOLO

    case = ORACLE_CASES[family]
    reference = build_libreyolo(family, size)
    model = LibreYOLO(f"{family}-{size}", num_classes=case.num_classes)
    convert = importlib.import_module(f"zoo_{family}.convert")
    model.model.load_state_dict(convert.from_libreyolo(size, reference.model.state_dict()))
    recipe = model._manager.training_recipe(family, size)
    images = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(5))
    targets = example_targets(side)
    reference.model.train()
    model.model.train()
    torch.manual_seed(3)
    expected = case.libreyolo_train_step(reference.model, images, targets)
    torch.manual_seed(3)
    got, _ = recipe.forward_train(model.model, case.zoo_batch(images, targets))
    return float(expected.detach()), float(got.detach())




def learns_a_fixed_sample(tmp_path, name: str, learning, *, steps: int, lr0: float, imgsz: int = 64, images: int = 4,
                          batch: int = 4, repeats: int = 5, options: dict | None = None, queries: int = 20,
                          denoising: int = 20, conf: float = 0.3, minimum_map50: float = 0.8) -> dict[str, float]:
    """Train ``name`` on ``images`` fixed shapes scenes, validate on them (mAP50 >= ``minimum_map50``), and draw one prediction.

    ``learning`` (tests/learning.py) seeds the model and the run, and checks the scores.

    The family's published recipe, but for what a run of a few dozen steps cannot use: no warm-up,
    no EMA, no augmentation (the sample is learnt as it is), a higher base rate, and few matching
    and denoising queries (build options ``num_queries``/``num_denoising``, published 300/100, or
    ``options``) so that a 64-pixel input has enough encoder tokens and the decoder stays cheap.
    Each epoch shows every image ``repeats`` times (``steps`` optimizer steps in all, at ``batch``):
    fewer epochs, fewer checkpoints written. The drawn prediction at ``conf`` must be non-empty and
    hold only classes of the scene (over seeds and thread counts a short run sometimes leaves one
    true class just under ``conf``, which mAP50 already measures; a class drawn that is not in the
    scene is what this check is for). DETRs trained with IoU-aware class targets (VFL, MAL, IA-BCE) score a
    correct box near its IoU (0.4-0.8 after a short run), so 0.3 rather than YOLO's 0.5.
    """
    import time
    from pathlib import Path

    import yaml
    from PIL import Image

    from tests.family_checks import repeated_sample
    from tests.test_family_learning import OVERFIT, sample_on_itself
    from zoo_core.facade import LibreYOLO

    data = sample_on_itself(tmp_path, "detect", images=images, size=imgsz)
    train_data = repeated_sample(data, repeats, tmp_path / "repeated") if repeats > 1 else data
    epochs = steps * batch // (images * repeats)
    model = LibreYOLO(name, options=options if options is not None else {"num_queries": queries, "num_denoising": denoising},
                      seed=learning.seed)
    started, cpu = time.perf_counter(), time.process_time()
    model.train(data=str(train_data), epochs=epochs, batch=batch, imgsz=imgsz, nbs=batch, lr0=lr0, warmup_iters=0, ema=False,
                mosaic=0.0, close_mosaic=0, seed=learning.seed, **OVERFIT)
    trained = time.perf_counter()
    metrics = model.val(data=str(data), batch=batch, imgsz=imgsz, workers=0)
    first = Path(yaml.safe_load(data.read_text())["path"]) / "images/train/000000.png"
    (result,) = model.predict(str(first), save=True, conf=conf)
    print(f"{name} on its {images} training scenes at {imgsz} px after {epochs * images * repeats // batch} steps: {metrics} "
          f"(train {trained - started:.1f} s, val {time.perf_counter() - trained:.1f} s, process CPU {time.process_time() - cpu:.1f} s); "
          f"drawn: {list(zip(result.labels.tolist(), [round(v, 2) for v in result.scores.tolist()]))}")
    truth = {int(line.split()[0]) for line in Path(str(first).replace("images", "labels").replace(".png", ".txt")).read_text().splitlines()}
    drawn_classes = set(result.labels.tolist())
    drawn = (bool(drawn_classes) and drawn_classes <= truth and result.save_path is not None
             and Image.open(result.save_path).size == Image.open(first).size)
    learning.expect(metrics, {"mAP50": minimum_map50}, checks={"drawing": drawn})
    return metrics


def spawned_ranks_train_one_epoch(name: str, imgsz: int = 64) -> None:
    """One epoch of ``name`` (10 matching, 10 denoising queries) on two spawned CPU ranks returns metrics and rank 0's weights."""
    import math

    from zoo_core.data.shapes import shapes
    from zoo_core.facade import LibreYOLO

    model = LibreYOLO(name, options={"num_queries": 10, "num_denoising": 10})
    result = model.train(data=shapes(num_train=4, num_val=2, image_size=64, seed=1), device="cpu,cpu", epochs=1, batch=4,
                         imgsz=imgsz, workers=0, nbs=4, plots=False, verbose=False)
    assert result.world_size == 2 and result.epochs_completed == 1
    assert math.isfinite(result.metrics["mAP50-95"])
    best = torch.load(result.best, map_location="cpu", weights_only=True)["model"]
    assert all(torch.equal(best[key], value.to(best[key].dtype)) for key, value in model.model.state_dict().items()), "caller lacks rank 0's best"
