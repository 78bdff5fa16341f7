"""YOLO-NAS (plugins/zoo_yolonas): QARepVGG fusion, LibreYOLO 1.6 parity of outputs, keys and loss, the recipe, learning.

Every size against LibreYOLO (converted checkpoints both ways) is ``benchmarks/libreyolo_oracle.py yolonas``;
the registry-parametrized tests (parameter counts, oracle, export) cover the smallest size too.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from zoo_core.engine.config import TrainConfig
from zoo_core.engine.recipe import RunInfo
from zoo_core.plugin_manager import get_plugin_manager
from zoo_yolonas.convert import convert, from_libreyolo, to_libreyolo
from zoo_yolonas.model import QARepVGGBlock, YoloNasSpec, count_published_parameters
from zoo_yolonas.recipe import ThresholdEMA, YoloNasRecipe

from . import family_checks as checks

# one torch thread: the learning runs' scores must not depend on the worker's thread count (reduction order)
_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)

pytestmark = pytest.mark.timeout(600)

TARGETS = torch.tensor(
    [[0, 1, 10.0, 20, 60, 90], [0, 3, 50, 40, 150, 120], [1, 0, 5, 5, 40, 30], [1, 4, 70, 60, 130, 125], [1, 2, 20, 30, 45, 70]]
)


def _yolonas(size: str = "s", num_classes: int = 80, **options) -> torch.nn.Module:
    return checks.build_family("yolonas", size, num_classes, **options)


randomise_batch_norms = partial(checks.randomise_batch_norms, "uniform")


def _oracle_pair(num_classes: int = 5, seed: int = 0):
    from libreyolo.models.yolonas.nn import LibreYOLONASModel

    torch.manual_seed(seed)
    reference = randomise_batch_norms(LibreYOLONASModel(config="s", nb_classes=num_classes), seed).eval()
    model = _yolonas("s", num_classes).eval()
    model.load_state_dict(convert("s", reference.state_dict(), "libreyolo", "zoo"), strict=True)
    return reference, model


def _centre_size(targets: torch.Tensor) -> torch.Tensor:
    return torch.cat((targets[:, :2], (targets[:, 2:4] + targets[:, 4:6]) / 2, targets[:, 4:6] - targets[:, 2:4]), dim=1)


def test_config_and_option_errors_name_the_key():
    config = dict(get_plugin_manager().family("yolonas").sizes["s"].config)
    with pytest.raises(ValueError, match="'stages' must be a list of 4 rows"):
        YoloNasSpec.from_config({**config, "stages": config["stages"][:3]})
    with pytest.raises(ValueError, match="does not take the option"):
        _yolonas(pgi=True)
    with pytest.raises(ValueError, match="static_assigner"):
        _yolonas(static_assigner="yes")
    with pytest.raises(ValueError, match="bn_momentum"):
        _yolonas(bn_momentum=0)
    assert {m.momentum for m in _yolonas("s", 2, bn_momentum=0.3).modules() if isinstance(m, torch.nn.BatchNorm2d)} == {0.3}
    with pytest.raises(ValueError, match="multiples of 32"):
        _yolonas("s", 3)(torch.rand(1, 3, 50, 64))


def test_published_counts_are_the_reparameterised_models_of_every_size():
    # Deci's 12.18M / 31.92M / 42.02M = LibreYOLO 1.6 LibreYOLONASModel(size).fuse_reparam(full_fusion=False)
    with torch.device("meta"):
        counts = {size: count_published_parameters(_yolonas(size)) for size in ("s", "m", "l")}
    assert counts == {"s": 12_184_240, "m": 31_922_098, "l": 42_017_784}


def test_qarepvgg_fuse_computes_the_training_graph():
    torch.manual_seed(0)
    for identity, stride in ((True, 1), (False, 2)):
        block = randomise_batch_norms(QARepVGGBlock(8, 8, stride, identity=identity)).eval()
        x = torch.randn(2, 8, 9, 11)
        with torch.no_grad():
            expected = block(x)
            block.fuse()
            assert float((block(x) - expected).abs().max()) < 1e-5
        assert [name for name, _ in block.named_parameters()] == ["fused.weight", "fused.bias"]


def test_the_fused_model_keeps_its_outputs_and_its_published_count():
    torch.manual_seed(0)
    model = randomise_batch_norms(_yolonas("s", 3)).eval()
    published = model.published_parameter_count()
    x = torch.rand(1, 3, 64, 96)
    before, after = checks.outputs_before_and_after_fuse(model, x)
    assert float((before["class_logits"] - after["class_logits"]).abs().max()) < 1e-4
    assert float((before["boxes"] - after["boxes"]).abs().max()) < 1e-3  # pixels of a 96-wide input, float rounding
    # fused: the post-BatchNorms are folded too, so a little below the re-parameterised count
    assert published - 20_000 < sum(p.numel() for p in model.parameters()) < published


def test_outputs_equal_libreyolo_with_random_batch_norms():
    reference, model = _oracle_pair()
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        (boxes, scores), _ = reference(x)
        out = model(x)
    assert float((out["boxes"] - boxes).abs().max()) <= 1e-4
    assert float((out["scores"] - scores).abs().max()) <= 1e-4


def test_keys_convert_both_ways_and_libreyolo_rebuilds_the_merged_branch():
    reference, model = _oracle_pair(7)
    back = to_libreyolo("s", model.state_dict())
    expected = reference.state_dict()
    assert back.keys() == expected.keys()
    assert all(torch.equal(back[key], value) for key, value in expected.items() if ".rbr_reparam." not in key)
    # rbr_reparam (unused by LibreYOLO's training graph) holds the merged branches: its partial fusion agrees
    fresh = _libreyolo_nas_s(7)
    fresh.load_state_dict(back, strict=True)
    block = fresh.eval().backbone.stage1.blocks.bottlenecks[0].cv1
    block.partial_fusion()
    assert torch.allclose(block.rbr_reparam.weight, back["backbone.stage1.blocks.bottlenecks.0.cv1.rbr_reparam.weight"], atol=1e-5)
    assert convert("s", model.state_dict(), "zoo", "libreyolo").keys() == back.keys()
    assert convert("s", expected, "libreyolo", "zoo").keys() == model.state_dict().keys()
    with pytest.raises(KeyError, match="matches no YOLO-NAS module"):
        from_libreyolo({"backbone.stage9.foo.weight": torch.zeros(1)})


def _libreyolo_nas_s(num_classes: int) -> torch.nn.Module:
    from libreyolo.models.yolonas.nn import LibreYOLONASModel

    return LibreYOLONASModel(config="s", nb_classes=num_classes)


@pytest.mark.parametrize("static", [True, False], ids=["atss", "task-aligned"])
def test_loss_terms_equal_libreyolo_with_either_assigner(static: bool):
    """Same assignment (ATSS, or PP-YOLOE's task-aligned form: plain IoU, contested anchors by IoU), so
    PPYoloELoss's three terms agree: varifocal, GIoU and DFL, their weights and normaliser."""
    from libreyolo.models.yolonas.loss import PPYoloELoss

    reference, model = _oracle_pair(5)
    model.use_static_assigner = static
    x = torch.rand(2, 3, 128, 160)
    with torch.no_grad():  # train-mode BatchNorm in both: the same batch statistics
        _, raw = reference.train()(x)
        expected, expected_items = PPYoloELoss(5, use_static_assigner=static, distributed_normalize=False)((None, raw), _centre_size(TARGETS))
        loss, items = model.loss(model.train()(x), {"images": x, "targets": TARGETS})
    for mine, theirs in zip((items["cls"], items["iou"], items["dfl"]), expected_items[:3]):
        assert float(mine) == pytest.approx(float(theirs), rel=1e-4, abs=1e-6)
    assert float(loss) == pytest.approx(float(expected), rel=1e-4)


def test_loss_reaches_every_parameter_with_and_without_targets():
    torch.manual_seed(0)
    model = _yolonas("s", 5).train()
    x = torch.rand(2, 3, 64, 64)
    checks.assert_loss_reaches_every_parameter(model, x, (TARGETS.clone().clamp(max=63), torch.zeros(0, 6)),
                                               {"cls", "iou", "dfl"})


def test_postprocess_contract():
    torch.manual_seed(0)
    model = _yolonas("s", 3).eval()
    with torch.no_grad():
        detections = model.postprocess(model(torch.rand(2, 3, 64, 96)), conf=0.0, iou=0.7, max_det=10)
    assert len(detections) == 2
    for item in detections:
        assert item["boxes"].shape[1:] == (4,) and item["labels"].dtype == torch.int64
        assert len(item["boxes"]) == len(item["scores"]) == len(item["labels"]) == 10
        assert (item["boxes"][:, 2:] >= item["boxes"][:, :2]).all()


def test_the_recipe_is_super_gradients_published_one():
    manager = get_plugin_manager()
    recipe = manager.training_recipe("yolonas", "s")
    assert isinstance(recipe, YoloNasRecipe) and manager.family("yolonas").sync_bn is True
    defaults = recipe.config_defaults
    assert (defaults["optimizer"], defaults["lr0"], defaults["lrf"], defaults["weight_decay"]) == ("AdamW", 1e-4, 0.1, 1e-5)
    assert (defaults["lr_schedule"], defaults["warmup_iters"], defaults["warmup_bias_lr"], defaults["epochs"]) == ("cosine", 2000, 1e-5, 300)
    assert (defaults["ema"], defaults["ema_decay"], defaults["nbs"], defaults["mosaic"]) == (True, 0.9997, None, 0.0)

    model = _yolonas("s", 3)
    config = TrainConfig.build({"data": "shapes"}, defaults=defaults)
    optimizer = recipe.build_optimizer(model, config, iterations=10, images_per_step=16)
    decayed = {id(p) for group in optimizer.param_groups if group["weight_decay"] > 0 for p in group["params"]}
    assert all(id(p) not in decayed for name, p in model.named_parameters() if p.ndim <= 1)  # no decay on bias/BN
    assert any(group["weight_decay"] == 1e-5 for group in optimizer.param_groups)  # nbs null: not rescaled
    # LinearBatchLRWarmup: every group, weights included, from 1e-5 to 1e-4 over 2000 iterations
    schedule = recipe.lr_schedule(config, 100, optimizer)
    for iteration, expected in ((0, 1e-5), (1000, 1e-5 + (1e-4 * schedule.factor(1000) - 1e-5) / 2)):
        schedule.apply(optimizer, iteration)
        assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([expected] * len(optimizer.param_groups))
    # super-gradients' "threshold" EMA ramp: min(0.9997, (1 + n) / (10 + n))
    ema = recipe.build_ema(model, config)
    assert isinstance(ema, ThresholdEMA) and ema.decay_after(1) == pytest.approx(2 / 11) and ema.decay_after(10**6) == 0.9997
    before = {key: value.clone() for key, value in ema.module.state_dict().items()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    ema.update(model)
    name, parameter = next(iter(model.named_parameters()))
    assert torch.allclose(ema.module.state_dict()[name], before[name] + (1 - 2 / 11))
    assert recipe.build_ema(model, config.model_copy(update={"ema": False})) is None


def test_the_recipe_event_switches_from_atss_to_the_task_aligned_assigner():
    """YOLO-NAS's recipe never assigns with ATSS (use_static_assigner False); PP-YOLOE-style recipes do
    for their first epochs, which a subclass declares with ``static_assigner_epochs``."""
    declaration = get_plugin_manager().family("yolonas")
    model = _yolonas("s", 3, static_assigner=True)
    YoloNasRecipe(declaration, "s").on_epoch_start(model, RunInfo(0, 300, 10, 0, 1))
    assert model.use_static_assigner is True  # the published recipe leaves the build option alone

    class PPYOLOEStyle(YoloNasRecipe):
        static_assigner_epochs = 2

    recipe = PPYOLOEStyle(declaration, "s")
    seen = []
    for epoch in range(4):
        recipe.on_epoch_start(model, RunInfo(epoch, 4, 10, 0, 1))
        seen.append(model.use_static_assigner)
    assert seen == [True, True, False, False]


def test_yolonas_s_overfits_a_fixed_sample_and_draws_its_predictions(tmp_path: Path, learning):
    """160 AdamW steps at batch 4 on 4 scenes of 64 px, in 16 epochs of 10 steps (each a 155 MB checkpoint), no
    warm-up, no EMA (a run this short has no room for them). BatchNorm momentum 0.3 (build option; published
    0.03): at 0.03 the running statistics of a short run still carry its first batches and the eval-mode
    model scores mAP50 0.0 while the same weights with batch statistics score 0.6; with 0.3 eval mode
    follows the weights.

    100 steps scored mAP50 from 0.58 to 0.92 over seeds; the threshold is 80 % of the worst score over
    seeds and thread counts of this longer run (benchmarks/learning_margins.py (docs/performance.md has its table))."""
    model, metrics, images = checks.overfit_fixed_sample(
        tmp_path, "yolonas-s", "detect", images=4, size=64, batch=4, val_batch=8, options={"bn_momentum": 0.3},
        epochs=16, repeats=10, optimizer="AdamW", lr0=0.002, warmup_iters=0, ema=False, seed=learning.seed)
    learning.expect(metrics, {"mAP50": 0.55}, checks={"drawing": checks.detector_draws_its_predictions(model, images, conf=0.3, size=64, all_true=False)})


def test_yolonas_s_trains_one_epoch_on_two_spawned_cpu_ranks():
    model, result = checks.train_on_two_spawned_cpu_ranks("yolonas-s", num_train=4, num_val=2, metric="mAP50-95", imgsz=32,
                                                          warmup_iters=0)
    checks.assert_caller_holds_rank_zeros_best(model, result)
