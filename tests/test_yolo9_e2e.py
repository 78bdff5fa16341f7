"""YOLOv9-E2E (plugins/zoo_yolo9_e2e): LibreYOLO 1.6 parity of keys and outputs, the dual (one-to-many /
one-to-one) assignment and loss, the NMS-free postprocess (and proof that no NMS runs); it learns, trains
on two spawned ranks and draws its predictions.

Every size against LibreYOLO (converted checkpoints both ways) is ``benchmarks/libreyolo_oracle.py yolo9_e2e``.
"""

from __future__ import annotations

import pickle
from functools import partial
from pathlib import Path

import pytest
import torch
import torchvision

import zoo_core.ops.nms
from zoo_core.building import count_parameters
from zoo_core.facade import LibreYOLO
from zoo_core.losses.detection import YOLO_NOMINAL_BATCH_SIZE
from zoo_core.plugin_manager import get_plugin_manager
from zoo_yolo9_e2e.convert import LIBREYOLO_KEYS, convert, from_libreyolo, to_libreyolo
from zoo_yolo9_e2e.model import YOLOv9E2E, top_k_detections

from . import family_checks as checks

# one torch thread: the learning runs' scores must not depend on the worker's thread count (reduction order)
_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)

pytestmark = pytest.mark.timeout(600)

SIZES = ["t", "s", "m", "c"]
# LibreYOLO 1.6.0 LibreYOLO9E2EModel(size, nb_classes=80): no published figure exists (see NOTES.md).
LIBREYOLO_PARAMS = {"t": 2_634_672, "s": 8_728_064, "m": 24_726_464, "c": 31_051_040}


def _build(size: str, num_classes: int = 80, **options) -> YOLOv9E2E:
    return checks.build_family("yolo9_e2e", size, num_classes, **options)


randomise_batch_norms = partial(checks.randomise_batch_norms, "wide", seed=1)


@pytest.mark.parametrize("size", SIZES)
def test_parameter_counts_are_libreyolos(size: str):
    with torch.device("meta"):
        model = _build(size)
    assert count_parameters(model) == LIBREYOLO_PARAMS[size] == get_plugin_manager().family("yolo9_e2e").sizes[size].params
    # both heads have the one shape; dropping the one-to-many head leaves the inference model
    head = count_parameters(model.head)
    assert count_parameters(model.one_to_one_head) == head
    assert count_parameters(model.drop_one_to_many_head()) == LIBREYOLO_PARAMS[size] - head


def test_the_gelan_is_yolo9s():
    manager = get_plugin_manager()
    with torch.device("meta"):
        yolo9, e2e = manager.build_model("yolo9", "t", 80), _build("t")
    assert [key for key in e2e.state_dict() if not key.startswith("one_to_one_head.")] == list(yolo9.state_dict())
    # every size is configured as registry.yaml's yolo9 (LibreYOLO's GELAN widths, m's neck AConv 184), without PGI
    for size, entry in manager.family("yolo9_e2e").sizes.items():
        config = {key: value for key, value in manager.family("yolo9").sizes[size].config.items() if key != "pgi"}
        assert entry.config == config, size


def _libreyolo_model(size: str, num_classes: int = 80):
    from libreyolo.models.yolo9_e2e.nn import LibreYOLO9E2EModel

    torch.manual_seed(0)
    model = LibreYOLO9E2EModel(config=size, nb_classes=num_classes).eval()
    randomise_batch_norms(model)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        # the one-to-one towers start as copies of the one-to-many ones: make them differ, and
        # spread the class scores over (0, 1) (LibreYOLO's prior bias is -10)
        for parameter in (*model.head.one2one_cv2.parameters(), *model.head.one2one_cv3.parameters()):
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
        for tower in (*model.head.cv3, *model.head.one2one_cv3):
            tower[-1].bias.copy_(torch.randn(tower[-1].bias.shape, generator=generator))
    return model


def _check_oracle(size: str, side: int, num_classes: int = 80) -> float:
    reference = _libreyolo_model(size, num_classes)
    model = _build(size, num_classes).eval()
    converted = from_libreyolo(reference.state_dict())
    assert converted.options == {}
    model.load_state_dict(converted.state_dict, strict=True)
    checks.assert_state_dicts_equal(to_libreyolo(size, model.state_dict()), reference.state_dict())
    images = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        predictions = reference(images)["predictions"]  # N×(4+C)×A: one-to-one boxes and scores before top-k
        outputs = model(images)
    boxes, scores = predictions[:, :4].transpose(1, 2), predictions[:, 4:].transpose(1, 2)
    return checks.assert_same_boxes_and_scores(outputs, boxes, scores, least_box=100)


def test_yolo9_e2e_t_reproduces_libreyolo():
    _check_oracle("t", 96)


def test_converted_checkpoints_load_in_libreyolo_and_back(tmp_path):
    from libreyolo.models.yolo9_e2e.model import LibreYOLO9E2E

    torch.manual_seed(1)
    model = _build("t", 3).eval()
    randomise_batch_norms(model)
    path = checks.write_libreyolo_checkpoint(tmp_path / "LibreYOLO9E2Et.pt", "yolo9_e2e", "t",
                                             to_libreyolo("t", model.state_dict()))
    loaded = LibreYOLO9E2E(str(path), size="t", nb_classes=3, device="cpu")
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        predictions = loaded.model.eval()(images)["predictions"]
        outputs = model(images)
    torch.testing.assert_close(outputs["boxes"], predictions[:, :4].transpose(1, 2), atol=1e-4, rtol=0)
    torch.testing.assert_close(outputs["scores"], predictions[:, 4:].transpose(1, 2), atol=1e-5, rtol=0)
    checks.assert_holds_the_weights_of(from_libreyolo(torch.load(path, weights_only=True)["model"]).state_dict, model)


def test_key_mapping_examples_and_the_hook_dispatch():
    to_zoo, from_zoo = LIBREYOLO_KEYS.key_to_zoo, LIBREYOLO_KEYS.key_from_zoo
    assert to_zoo("backbone.elan1.cv2.conv.weight") == "backbone.p2_block.first_branch.0.weight"
    assert to_zoo("backbone.elan2.cv2.0.m.0.cv1.conv2.bn.running_var") == (
        "backbone.blocks.0.first_branch.0.bottlenecks.0.rep_conv.pointwise.1.running_var"
    )
    assert to_zoo("backbone.spp.cv5.conv.weight") == "neck.top_down.spp.aggregate.0.weight"
    assert to_zoo("head.one2one_cv3.2.2.bias") == "one_to_one_head.class_branches.2.2.bias"
    assert to_zoo("head.one2one_cv2.0.1.bn.weight") == "one_to_one_head.box_branches.0.1.1.weight"
    assert from_zoo("one_to_one_head.box_branches.1.0.0.weight") == "head.one2one_cv2.1.0.conv.weight"
    assert from_zoo("head.box_branches.1.0.0.weight") == "head.cv2.1.0.conv.weight"
    legacy = from_libreyolo({"detect.cv2.0.2.bias": torch.zeros(1), "head.dfl.conv.weight": torch.zeros(1)})
    assert list(legacy.state_dict) == ["head.box_branches.0.2.bias"]
    assert convert("t", {}, "upstream", "zoo") is None
    assert convert("t", {}, "zoo", "upstream") is None
    assert set(convert("t", {"head.cv2.0.2.bias": torch.zeros(1)}, "libreyolo", "zoo").state_dict) == {"head.box_branches.0.2.bias"}
    assert convert("t", {"head.box_branches.0.2.bias": torch.zeros(1)}, "zoo", "libreyolo") == {"head.cv2.0.2.bias": torch.zeros(1)}


def test_files_fine_tuned_from_coco_keep_their_class_tower_width():
    from libreyolo.models.yolo9_e2e.nn import LibreYOLO9E2EModel

    # a COCO model whose class convs were swapped for 3 classes: towers stay 80 wide (zoo's default for 3 is 64)
    torch.manual_seed(0)
    reference = LibreYOLO9E2EModel(config="t", nb_classes=80).eval()
    for tower in (*reference.head.cv3, *reference.head.one2one_cv3):
        tower[-1] = torch.nn.Conv2d(80, 3, 1)
    reference.head.nc, reference.head.no = 3, 3 + 4 * reference.head.reg_max
    converted = from_libreyolo(reference.state_dict())
    assert converted.options == {"class_channels": 80}
    model = _build("t", 3, **converted.options).eval()
    model.load_state_dict(converted.state_dict, strict=True)
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(images)["scores"], reference(images)["predictions"][:, 4:].transpose(1, 2))
    uneven = dict(reference.state_dict())
    uneven["head.one2one_cv3.0.0.conv.weight"] = uneven["head.one2one_cv3.0.0.conv.weight"][:64]
    with pytest.raises(ValueError, match="differ in width"):
        from_libreyolo(uneven)


def test_training_outputs_and_the_detached_one_to_one_branch():
    torch.manual_seed(0)
    model = _build("t", 3).train()
    batch = checks.synthetic_batch()
    outputs = model(batch["images"])
    assert {"box_logits", "class_logits", "one_to_one"} <= set(outputs)
    # the one-to-one loss alone reaches its own head but not the backbone or neck
    terms = model.one_to_one_loss(outputs["one_to_one"], batch["targets"], 2)
    model.zero_grad()
    (terms.box + terms.cls + terms.dfl).backward()
    assert all(parameter.grad is None for parameter in model.backbone.parameters())
    assert all(parameter.grad is None for parameter in model.head.parameters())
    assert any(parameter.grad is not None and parameter.grad.abs().sum() > 0 for parameter in model.one_to_one_head.parameters())


def test_one_to_one_assignment_takes_one_anchor_per_box():
    torch.manual_seed(0)
    model = _build("t", 3).train()
    batch = checks.synthetic_batch()
    outputs = model(batch["images"])
    from zoo_core.losses.detection import pad_targets_per_image
    from zoo_core.nn.detection_head import decode_dense_predictions

    labels, boxes, mask = pad_targets_per_image(batch["targets"], 2)

    def positives(head_outputs, assigner):
        pred_boxes, scores = decode_dense_predictions(head_outputs, model.reg_max)
        return assigner(scores.detach(), pred_boxes.detach(), head_outputs["anchor_points"], labels, boxes, mask)

    one = positives(outputs["one_to_one"], model.one_to_one_loss.assigner)
    many = positives(outputs, model.one_to_many_loss.assigner)
    assert model.one_to_one_loss.assigner.top_k == 1 and model.one_to_many_loss.assigner.top_k == 10
    assert one.foreground.sum(dim=1).tolist() == mask.sum(dim=1).tolist()  # one anchor per ground truth
    assert many.foreground.sum() > one.foreground.sum()


def test_loss_sums_both_heads_and_reaches_every_parameter():
    torch.manual_seed(0)
    model = _build("t", 3).train()
    images = torch.rand(2, 3, 64, 64)
    # Each branch's soft-target sum (its normaliser) must exceed 1, where YOLO's loss clamps it; the
    # one-to-one branch has one positive per box, so: many boxes, and heads predicting boxes of 2 bins
    # per side (32 px at stride 8, the boxes' size) so that the positives' IoUs are high.
    with torch.no_grad():
        for head in (model.head, model.one_to_one_head):
            for branch in head.box_branches:
                branch[-1].bias.view(4, -1)[:, 2] = 10.0
    corners = [(x, y) for x in (0, 16, 32) for y in (0, 16, 32)]
    targets = torch.tensor(
        [[image, (x + y) % 3, x, y, x + 32, y + 32] for image in (0, 1) for x, y in corners], dtype=torch.float32
    )
    outputs = model(images)
    loss, items = model.loss(outputs, {"images": images, "targets": targets})
    many = model.one_to_many_loss(outputs, targets, 2).weighted(model.loss_gains)
    one = model.one_to_one_loss(outputs["one_to_one"], targets, 2).weighted(model.loss_gains)
    assert loss.item() == pytest.approx((many.total() + one.total()).item() * YOLO_NOMINAL_BATCH_SIZE, rel=1e-5)
    assert items["cls"].item() == pytest.approx((many.cls + one.cls).item(), rel=1e-5)
    doubled_images = torch.cat((images, images))
    doubled_targets = torch.cat((targets, targets + torch.tensor([2.0, 0, 0, 0, 0, 0])))
    doubled, _ = model.loss(model(doubled_images), {"images": doubled_images, "targets": doubled_targets})
    assert doubled.item() == pytest.approx(loss.item(), rel=1e-4)
    empty, empty_items = model.loss(model(images), {"images": images, "targets": torch.zeros(0, 6)})
    model.zero_grad()
    empty.backward()
    assert empty_items["box"].item() == 0.0 and empty.item() > 0
    assert all(parameter.grad is not None for parameter in model.parameters())
    with pytest.raises(ValueError, match="train-mode outputs"):
        model.loss(model.eval()(images), {"images": images, "targets": targets})


def test_top_k_postprocess_by_hand():
    # 1 image, 4 anchors, 2 classes
    boxes = torch.arange(16, dtype=torch.float32).reshape(1, 4, 4)
    scores = torch.tensor([[[0.1, 0.9], [0.8, 0.7], [0.05, 0.02], [0.3, 0.6]]])
    (detections,) = top_k_detections(boxes, scores, conf=0.25, max_det=3)
    # stage 1: anchors 0 (0.9), 1 (0.8), 3 (0.6); stage 2: 0.9 (a0, c1), 0.8 (a1, c0), 0.7 (a1, c1)
    assert detections["scores"].tolist() == pytest.approx([0.9, 0.8, 0.7])
    assert detections["labels"].tolist() == [1, 0, 1]
    assert torch.equal(detections["boxes"], boxes[0, [0, 1, 1]])
    (strict,) = top_k_detections(boxes, scores, conf=0.75, max_det=3)
    assert strict["labels"].tolist() == [1, 0]
    with pytest.raises(ValueError, match="max_det"):
        top_k_detections(boxes, scores, conf=0.1, max_det=0)


def test_postprocess_contract_fuse_and_pickling():
    torch.manual_seed(0)
    model = _build("t", 3).eval()
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        outputs = model(images)
    assert "one_to_one" not in outputs and outputs["scores"].shape == (2, 84, 3)
    detections = model.postprocess(outputs, conf=0.0, iou=0.7, max_det=10)
    assert [len(d["boxes"]) for d in detections] == [10, 10]
    assert all(d["labels"].dtype == torch.int64 for d in detections)
    restored = pickle.loads(pickle.dumps(model))
    fused = pickle.loads(pickle.dumps(model)).fuse()
    assert fused.head is None and not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    with torch.no_grad():
        assert torch.equal(restored(images)["scores"], outputs["scores"])
        torch.testing.assert_close(fused(images)["boxes"], outputs["boxes"], atol=1e-3, rtol=1e-4)


def test_bad_options_are_reported():
    with pytest.raises(ValueError, match="does not take the option"):
        _build("t", 3, pgi=True)
    with pytest.raises(ValueError, match="class_channels must be a positive integer"):
        _build("t", 3, class_channels=0)
    with pytest.raises(ValueError, match="'bn_momentum' must be a number in \\(0, 1\\]"):
        _build("t", 3, bn_momentum="fast")
    assert {module.momentum for module in _build("t", 3, bn_momentum=0.1).modules() if isinstance(module, torch.nn.BatchNorm2d)} == {0.1}
    with pytest.raises(ValueError, match="multiples of 32"):
        _build("t", 3)(torch.rand(1, 3, 64, 40))


def test_predictions_take_the_one_to_one_head_without_any_nms(monkeypatch):
    def no_nms(*args, **kwargs):
        raise AssertionError("yolo9_e2e must not run NMS")

    for module, name in ((zoo_core.ops.nms, "dense_detections_nms"), (zoo_core.ops.nms, "batched_nms"),
                         (torchvision.ops, "batched_nms"), (torchvision.ops, "nms"), (torchvision.ops.boxes, "batched_nms"),
                         (torchvision.ops.boxes, "nms")):
        monkeypatch.setattr(module, name, no_nms)
    torch.manual_seed(0)
    model = LibreYOLO("yolo9_e2e-t", num_classes=3)
    (result,) = model.predict((torch.rand(64, 64, 3) * 255).to(torch.uint8).numpy(), conf=0.0, max_det=7)
    assert len(result.labels) == 7  # top-k of the one-to-one scores: overlapping boxes are kept
    network = model.model.eval()
    with torch.no_grad():
        outputs = network(torch.rand(1, 3, 64, 64))
    expected = top_k_detections(outputs["boxes"], outputs["scores"], conf=0.0, max_det=7)[0]
    assert torch.equal(network.postprocess(outputs, conf=0.0, iou=0.0, max_det=7)[0]["scores"], expected["scores"])


def test_the_recipe_is_yolo9s_published_one():
    manager = get_plugin_manager()
    defaults = manager.training_recipe("yolo9_e2e", "t").config_defaults
    yolo9 = manager.training_recipe("yolo9", "t").config_defaults
    assert {key: defaults[key] for key in yolo9} == yolo9
    assert (defaults["optimizer"], defaults["lr0"], defaults["lrf"], defaults["momentum"], defaults["close_mosaic"]) == (
        "SGD", 0.01, 0.01, 0.937, 15)
    assert manager.family("yolo9_e2e").sync_bn is True and manager.family("yolo9_e2e").spawn is True


def test_yolo9_e2e_t_overfits_a_fixed_sample_and_draws_its_predictions(tmp_path: Path, learning):
    """YOLOv9-E2E-t on 4 scenes of 64 px, 240 AdamW steps at batch 4 in 24 epochs (each scene 10 times per
    epoch: fewer checkpoint writes) after a 3-step warm-up, scored on its one-to-one head.

    160 steps scored mAP50 from 0.54 to 1.0 over seeds and thread counts: a run that short on the
    one-to-one head was luck, not margin. The threshold is 80 % of the worst score of this longer run
    over seeds and thread counts (benchmarks/learning_margins.py (docs/performance.md has its table)).

    The published BatchNorm momentum 0.03 leaves the running statistics of an 80-step run far
    behind the weights: the run builds the model with torch's 0.1 (build option ``bn_momentum``).
    """
    model, metrics, images = checks.overfit_fixed_sample(
        tmp_path, "yolo9_e2e-t", "detect", images=4, size=64, batch=4, options={"bn_momentum": 0.1},
        val_options={"plots": False}, epochs=24, repeats=10, nbs=4, optimizer="AdamW", lr0=0.005, warmup_iters=3, mosaic=0.0,
        close_mosaic=0, seed=learning.seed)
    learning.expect(metrics, {"mAP50": 0.65}, checks={"drawing": checks.detector_draws_its_predictions(model, images, conf=0.25, size=64)})


def test_yolo9_e2e_t_trains_one_epoch_on_two_spawned_cpu_ranks():
    model, result = checks.train_on_two_spawned_cpu_ranks("yolo9_e2e-t", num_train=4, num_val=2, metric="mAP50-95", imgsz=32,
                                                          nbs=4)
    checks.assert_caller_holds_rank_zeros_best(model, result)
