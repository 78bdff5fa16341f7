"""RTMDet (plugins/zoo_rtmdet): LibreYOLO 1.6 parity of keys, outputs and loss, mmdetection's layout, the
shared-conv / separate-BN head, the recipe; it learns, trains on two spawned ranks and draws its predictions.

Every size against LibreYOLO (converted checkpoints both ways) is ``benchmarks/libreyolo_oracle.py rtmdet``;
the published parameter counts are checked by ``tests/test_model_params.py``.
"""

from __future__ import annotations

import pickle
from functools import partial
from pathlib import Path

import pytest
import torch

from zoo_core.building import count_parameters
from zoo_core.engine.config import TrainConfig
from zoo_core.facade import LibreYOLO
from zoo_core.plugin_manager import get_plugin_manager
from zoo_rtmdet.convert import convert, from_libreyolo, from_upstream, to_libreyolo
from zoo_rtmdet.model import RTMDetSpec

from . import family_checks as checks

# one torch thread: the learning runs' scores must not depend on the worker's thread count (reduction order)
_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)

pytestmark = pytest.mark.timeout(600)

SIZES = ["t", "s", "m", "l", "x"]
# LibreYOLO 1.6.0 LibreRTMDetModel(size, nc=80): sum of parameters (its shared convs counted once).
LIBREYOLO_PARAMS = {"t": 4_896_168, "s": 8_886_924, "m": 24_709_188, "l": 52_315_804, "x": 94_855_572}
# mmdetection configs/rtmdet/README.md, Params(M).
README_PARAMS = {"t": 4.8e6, "s": 8.89e6, "m": 24.71e6, "l": 52.3e6, "x": 94.86e6}
BGR_MEAN = torch.tensor([103.53, 116.28, 123.675]).view(1, 3, 1, 1)
BGR_STD = torch.tensor([57.375, 57.12, 58.395]).view(1, 3, 1, 1)


def _build(size: str, num_classes: int = 80, **options) -> torch.nn.Module:
    return checks.build_family("rtmdet", size, num_classes, **options)


randomise_batch_norms = partial(checks.randomise_batch_norms, "wide", seed=1)


@pytest.mark.parametrize("size", SIZES)
def test_parameter_counts_are_libreyolos_and_the_published_ones(size: str):
    with torch.device("meta"):
        model = _build(size)
    params = count_parameters(model)
    assert params == LIBREYOLO_PARAMS[size]
    # within 0.05% of the README, except RTMDet-t whose "4.8M" is a truncation of 4.9M (2.0% below its config's count)
    assert abs(params - README_PARAMS[size]) / README_PARAMS[size] <= (0.021 if size == "t" else 0.0005)


def _libreyolo_model(size: str, num_classes: int = 80):
    from libreyolo.models.rtmdet.nn import LibreRTMDetModel

    torch.manual_seed(0)
    model = LibreRTMDetModel(size=size, nc=num_classes).eval()
    randomise_batch_norms(model)
    with torch.no_grad():  # non-trivial predictions: distances of tens of pixels, scores spread over (0, 1)
        for conv in model.head.rtm_reg:
            conv.weight.mul_(30)
        for conv in model.head.rtm_cls:
            conv.weight.mul_(100)
            conv.bias.zero_()
    return model


def _libreyolo_decoded(model, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LibreYOLO's boxes and scores before NMS (its postprocess's decode), for RGB images in [0, 1]."""
    from libreyolo.postprocess.rtmdet import _distance2bbox, _make_grid_priors

    with torch.no_grad():
        cls_scores, bbox_preds = model(((images * 255).flip(1) - BGR_MEAN) / BGR_STD)  # its BGR normalisation
    points = _make_grid_priors(list(cls_scores), [8, 16, 32])
    scores = torch.cat([level.flatten(2) for level in cls_scores], 2).transpose(1, 2).sigmoid()
    boxes = _distance2bbox(points, torch.cat([level.flatten(2) for level in bbox_preds], 2).transpose(1, 2))
    return boxes, scores


def _check_oracle(size: str, side: int, num_classes: int = 80) -> float:
    reference = _libreyolo_model(size, num_classes)
    model = _build(size, num_classes).eval()
    model.load_state_dict(from_libreyolo(reference.state_dict()), strict=True)
    # zoo -> LibreYOLO reproduces LibreYOLO's own state dict, key for key and bit for bit
    checks.assert_state_dicts_equal(to_libreyolo(size, model.state_dict()), reference.state_dict())
    images = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(5))
    boxes, scores = _libreyolo_decoded(reference, images)
    with torch.no_grad():
        outputs = model(images)
    return checks.assert_same_boxes_and_scores(outputs, boxes, scores, least_box=50)


def test_rtmdet_t_reproduces_libreyolo():
    _check_oracle("t", 96)


def test_converted_checkpoints_load_in_libreyolo_and_back(tmp_path):
    from libreyolo.models.rtmdet.model import LibreRTMDet

    torch.manual_seed(1)
    model = _build("t", 3).eval()
    randomise_batch_norms(model)
    path = checks.write_libreyolo_checkpoint(tmp_path / "LibreRTMDett.pt", "rtmdet", "t",
                                             to_libreyolo("t", model.state_dict()))
    loaded = LibreRTMDet(str(path), size="t", nb_classes=3, device="cpu")
    assert loaded.nb_classes == 3
    images = torch.rand(1, 3, 64, 64)
    boxes, scores = _libreyolo_decoded(loaded.model.eval(), images)
    with torch.no_grad():
        outputs = model(images)
    torch.testing.assert_close(outputs["boxes"], boxes, atol=1e-4, rtol=0)
    torch.testing.assert_close(outputs["scores"], scores, atol=1e-5, rtol=0)
    # and the file's state dict converts back to zoo's exactly
    checks.assert_holds_the_weights_of(from_libreyolo(torch.load(path, weights_only=True)["model"]), model)


def test_upstream_mmdetection_layout_and_the_hook_dispatch():
    reference = _libreyolo_model("t", 3)
    libreyolo_state = reference.state_dict()
    upstream = {("bbox_head." + key[5:] if key.startswith("head.") else key): value for key, value in libreyolo_state.items()}
    upstream["data_preprocessor.mean"] = torch.tensor([103.53, 116.28, 123.675])
    from_mm = from_upstream(upstream)
    direct = from_libreyolo(libreyolo_state)
    checks.assert_state_dicts_equal(from_mm, direct)
    assert convert("t", upstream, "upstream", "zoo").keys() == direct.keys()
    assert convert("t", libreyolo_state, "upstream", "zoo") is None  # not an mmdetection layout
    assert convert("t", upstream, "elsewhere", "zoo") is None
    back = convert("t", direct, "zoo", "libreyolo")
    checks.assert_state_dicts_equal(back, libreyolo_state)
    with pytest.raises(ValueError, match="RTMDet-Ins"):
        from_libreyolo({**libreyolo_state, "head.rtm_kernel.0.weight": torch.zeros(1)})
    # BGR -> RGB: the first conv's input channels are reversed, nothing else changes
    assert torch.equal(direct["backbone.stem.0.0.weight"], libreyolo_state["backbone.stem.0.conv.weight"].flip(1))
    # unshared tower convs are refused
    broken = dict(libreyolo_state)
    broken["head.cls_convs.1.0.conv.weight"] = broken["head.cls_convs.1.0.conv.weight"] + 1
    with pytest.raises(ValueError, match="must be shared"):
        from_libreyolo(broken)


def test_head_convs_are_shared_and_norms_are_per_level():
    model = _build("t", 3)
    head = model.head
    assert len(head.cls_convs) == len(head.reg_convs) == 2
    assert len(head.cls_norms) == len(head.reg_norms) == len(head.cls_preds) == 3
    keys = model.state_dict().keys()
    assert "head.cls_convs.0.weight" in keys and not any(key.startswith("head.cls_convs.1.0") for key in keys)


def test_loss_is_normalised_by_the_positives_and_reaches_every_parameter():
    torch.manual_seed(0)
    model = _build("t", 3).train()
    with torch.no_grad():  # boxes of 2 strides per side: the positives' IoU sum (the normaliser) exceeds its clamp at 1
        for conv in model.head.reg_preds:
            conv.bias.fill_(2.0)
    batch = checks.synthetic_batch()
    loss, items = model.loss(model(batch["images"]), batch)
    assert set(items) == {"cls", "box"} and all(not value.requires_grad for value in items.values())
    assert loss.item() == pytest.approx(items["cls"].item() + items["box"].item(), rel=1e-6)
    # the same two images twice: twice the positives, twice the summed terms, the same loss
    doubled = {
        "images": torch.cat((batch["images"], batch["images"])),
        "targets": torch.cat((batch["targets"], batch["targets"] + torch.tensor([2.0, 0, 0, 0, 0, 0]))),
    }
    doubled_loss, _ = model.loss(model(doubled["images"]), doubled)
    assert doubled_loss.item() == pytest.approx(loss.item(), rel=1e-4)
    # a batch without boxes still back-propagates into every parameter (DDP needs every gradient)
    empty = {"images": batch["images"], "targets": torch.zeros(0, 6)}
    empty_loss, empty_items = model.loss(model(empty["images"]), empty)
    model.zero_grad()
    empty_loss.backward()
    assert empty_items["box"].item() == 0.0 and empty_loss.item() > 0
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_postprocess_contract_and_pickling():
    torch.manual_seed(0)
    model = _build("t", 3).eval()
    with torch.no_grad():
        outputs = model(torch.rand(2, 3, 64, 64))
    assert outputs["boxes"].shape == (2, 84, 4) and outputs["scores"].shape == (2, 84, 3)
    detections = model.postprocess(outputs, conf=0.0, iou=0.65, max_det=10)
    assert len(detections) == 2
    for detection in detections:
        assert detection["boxes"].shape[1:] == (4,) and detection["labels"].dtype == torch.int64
        assert len(detection["boxes"]) == len(detection["scores"]) == len(detection["labels"]) <= 10
    # the raw outputs alone (no decoded boxes) give the same detections
    raw = {key: outputs[key] for key in ("class_logits", "box_distances", "anchor_points", "anchor_strides")}
    again = model.postprocess(raw, conf=0.0, iou=0.65, max_det=10)
    assert all(torch.equal(a["boxes"], b["boxes"]) for a, b in zip(detections, again))
    restored = pickle.loads(pickle.dumps(model))
    with torch.no_grad():
        assert torch.equal(restored(torch.ones(1, 3, 64, 64))["scores"], model(torch.ones(1, 3, 64, 64))["scores"])


def test_bad_configs_and_inputs_are_reported():
    config = dict(get_plugin_manager().family("rtmdet").sizes["t"].config)
    with pytest.raises(ValueError, match="missing keys \\['neck_blocks'\\]"):
        RTMDetSpec.from_config({key: value for key, value in config.items() if key != "neck_blocks"})
    with pytest.raises(ValueError, match="'stages' must list 4"):
        RTMDetSpec.from_config({**config, "stages": [[48, 1]]})
    with pytest.raises(ValueError, match="multiples of 32"):
        _build("t", 3)(torch.rand(1, 3, 60, 64))
    with pytest.raises(ValueError, match="no build options"):
        _build("t", 3, pgi=True)


def test_loss_equals_libreyolos_on_random_head_outputs():
    from libreyolo.models.rtmdet.loss import RTMDetLoss as LibreYOLOLoss

    from zoo_core.nn.detection_head import make_anchor_points
    from zoo_rtmdet.loss import RTMDetLoss

    generator = torch.Generator().manual_seed(0)
    batch, classes, side, boxes_per_image = 2, 5, 128, 6
    sizes = [(side // stride, side // stride) for stride in (8, 16, 32)]
    points, strides = make_anchor_points(sizes, (8, 16, 32), offset=0.0)
    logits = torch.randn(batch, len(points), classes, generator=generator) - 2
    distances = torch.rand(batch, len(points), 4, generator=generator) * 3 * strides
    corner = torch.rand(batch, boxes_per_image, 2, generator=generator) * side * 0.7
    size = torch.rand(batch, boxes_per_image, 2, generator=generator) * 50 + 8
    boxes = torch.cat((corner, (corner + size).clamp(max=side)), -1)
    labels = torch.randint(0, classes, (batch, boxes_per_image), generator=generator)
    targets = torch.cat(
        [torch.cat((torch.full((boxes_per_image, 1), float(i)), labels[i, :, None].float(), boxes[i]), 1) for i in range(batch)]
    )
    outputs = {"class_logits": logits, "box_distances": distances, "anchor_points": points, "anchor_strides": strides}
    terms = RTMDetLoss(classes)(outputs, targets, batch)

    def level_maps(values: torch.Tensor, channels: int) -> list[torch.Tensor]:
        maps, start = [], 0
        for height, width in sizes:
            maps.append(values[:, start : start + height * width].transpose(1, 2).reshape(batch, channels, height, width))
            start += height * width
        return maps

    reference = LibreYOLOLoss(classes, distributed_normalize=False)(
        level_maps(logits, classes), level_maps(distances, 4), list(boxes), list(labels)
    )
    assert terms.cls.item() == pytest.approx(reference["loss_cls"].item(), rel=1e-5)
    assert terms.box.item() == pytest.approx(reference["loss_bbox"].item(), rel=1e-5)
    assert terms.cls.item() > 1 and terms.box.item() > 0.1


def test_the_recipe_is_the_published_one():
    manager = get_plugin_manager()
    recipe = manager.training_recipe("rtmdet", "l")
    defaults = recipe.config_defaults
    assert (defaults["optimizer"], defaults["lr0"], defaults["weight_decay"], defaults["momentum"], defaults["beta2"]) == (
        "AdamW", 0.004, 0.05, 0.9, 0.999)
    assert (defaults["lr_schedule"], defaults["flat_epochs"], defaults["lrf"], defaults["warmup_iters"]) == ("flat_cosine", 150, 0.05, 1000)
    assert (defaults["epochs"], defaults["ema_decay"], defaults["ema_tau"], defaults["close_mosaic"]) == (300, 0.9998, 2000.0, 20)
    assert defaults["nbs"] is None and defaults["scale"] == 0.9 and manager.family("rtmdet").sync_bn is True
    assert manager.training_recipe("rtmdet", "t").config_defaults["scale"] == 0.5  # rtmdet_tiny: RandomResize (0.5, 2.0)
    # no weight decay on norms and biases (norm_decay_mult 0, bias_decay_mult 0)
    model = _build("t", 3)
    config = TrainConfig.build({"data": "shapes", "epochs": 300}, defaults=defaults)
    optimizer = recipe.build_optimizer(model, config, iterations=1000, images_per_step=256)
    decayed = {id(parameter) for group in optimizer.param_groups if group["weight_decay"] > 0 for parameter in group["params"]}
    assert decayed and all(parameter.dim() > 1 for parameter in model.parameters() if id(parameter) in decayed)
    assert {group["weight_decay"] for group in optimizer.param_groups} == {0.0, 0.05}
    # flat until epoch 150, then a cosine that reaches 0.05 lr at the last epoch (not where mosaic stops)
    schedule = recipe.lr_schedule(config, 10, optimizer)
    assert schedule.factor(1000 + 100) == pytest.approx(1.0)
    assert schedule.factor(10 * 280) > 0.05 + 1e-3
    assert schedule.factor(10 * 300 - 1) == pytest.approx(0.05, abs=1e-3)


def test_rtmdet_t_overfits_a_fixed_sample_and_draws_its_predictions(tmp_path: Path, learning):
    """RTMDet-t on 8 scenes of 96 px, 60 full-batch AdamW steps without warm-up.

    mmdetection's head init regresses distances of 0 × stride (RTMDet-t has no ``exp``), so every
    predicted box starts empty, the soft (IoU) class targets start at 0, and the first hundred
    steps only open the boxes; the run starts the distance biases at 2 (boxes of 2 strides per
    side), which the published 300 epochs do not need.
    """
    def open_the_boxes(model: LibreYOLO) -> None:
        with torch.no_grad():
            for conv in model.model.head.reg_preds:
                conv.bias.fill_(2.0)

    model, metrics, images = checks.overfit_fixed_sample(
        tmp_path, "rtmdet-t", "detect", images=8, size=96, batch=8, prepare=open_the_boxes, val_options={"plots": False},
        epochs=60, nbs=8, optimizer="AdamW", lr0=0.003, warmup_iters=0, mosaic=0.0, close_mosaic=0, seed=learning.seed)
    # RTMDet's scores are IoU-aware (soft targets): after this short run the true boxes score over 0.9
    # and a stray box of another class can reach 0.26 (seen with the class head drawn first), so the
    # drawing is checked at 0.5, not at the edge of those strays.
    learning.expect(metrics, {"mAP50": 0.7}, checks={"drawing": checks.detector_draws_its_predictions(model, images, conf=0.5, size=96)})


def test_rtmdet_t_trains_one_epoch_on_two_spawned_cpu_ranks():
    model, result = checks.train_on_two_spawned_cpu_ranks("rtmdet-t", num_train=4, num_val=2, metric="mAP50-95", imgsz=32)
    checks.assert_caller_holds_rank_zeros_best(model, result)
