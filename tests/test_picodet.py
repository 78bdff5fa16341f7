"""PP-PicoDet (plugins/zoo_picodet): LibreYOLO 1.6 parity of outputs, keys, loss and gradients; the recipe; learning.

Every size against LibreYOLO (converted checkpoints both ways) is ``benchmarks/libreyolo_oracle.py picodet``;
the registry-parametrized tests (parameter counts, oracle, export) cover the smallest size too.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest
import torch

from zoo_core.engine.config import TrainConfig
from zoo_core.engine.recipe import RunInfo
from zoo_core.plugin_manager import get_plugin_manager
from zoo_picodet.convert import convert, from_libreyolo, to_libreyolo
from zoo_picodet.model import PicoDetSpec
from zoo_picodet.recipe import EMA_CYCLE_EPOCHS, PUBLISHED_BATCH

from . import family_checks as checks

# one torch thread: the learning runs' scores must not depend on the worker's thread count (reduction order)
_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)

pytestmark = pytest.mark.timeout(600)

MEAN = torch.tensor([123.675, 116.28, 103.53]).view(1, 3, 1, 1)
STD = torch.tensor([58.395, 57.12, 57.375]).view(1, 3, 1, 1)
TARGETS = torch.tensor(
    [[0, 1, 10.0, 20, 60, 90], [0, 3, 50, 40, 150, 120], [1, 0, 5, 5, 40, 30], [1, 4, 70, 60, 130, 125],
     [1, 2, 20, 30, 45, 70], [1, 2, 100, 10, 180, 100]]
)


def _picodet(size: str = "s", num_classes: int = 80, **options) -> torch.nn.Module:
    return checks.build_family("picodet", size, num_classes, **options)


randomise_batch_norms = partial(checks.randomise_batch_norms, "uniform")


def _oracle_pair(num_classes: int = 5, head_std: float = 0.3):
    from libreyolo.models.picodet.nn import LibrePICODETModel

    torch.manual_seed(0)
    reference = randomise_batch_norms(LibrePICODETModel("s", nb_classes=num_classes))
    with torch.no_grad():  # PicoDet's head starts at N(0, 0.01): widen it so that outputs differ per anchor
        for parameter in reference.head.parameters():
            parameter.normal_(0, head_std)
    model = _picodet("s", num_classes)
    model.load_state_dict(convert("s", reference.state_dict(), "libreyolo", "zoo"), strict=True)
    return reference, model


def _per_image(targets: torch.Tensor, images: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    rows = [targets[targets[:, 0] == index] for index in range(images)]
    return [row[:, 2:] for row in rows], [row[:, 1].long() for row in rows]


def test_config_and_option_errors_name_the_key():
    config = dict(get_plugin_manager().family("picodet").sizes["s"].config)
    with pytest.raises(ValueError, match="'channel_ratios' must be 13"):
        PicoDetSpec.from_config({**config, "channel_ratios": config["channel_ratios"][:5]})
    with pytest.raises(ValueError, match="no build options"):
        _picodet(static_assigner=True)
    with pytest.raises(ValueError, match="multiples of 32"):
        _picodet("s", 3)(torch.rand(1, 3, 50, 64))


def test_counts_equal_libreyolo_at_every_size():
    with torch.device("meta"):
        counts = {size: sum(p.numel() for p in _picodet(size).parameters()) for size in ("s", "m", "l")}
    assert counts == {"s": 992_715, "m": 2_152_554, "l": 3_305_009}  # LibrePICODETModel(size, nb_classes=80)


def test_decoded_outputs_equal_libreyolo_with_random_batch_norms():
    reference, model = _oracle_pair()
    reference.eval(), model.eval()
    x = torch.rand(2, 3, 128, 192)
    with torch.no_grad():
        reference.head.export = True  # LibreYOLO's decoded form: N×A×(4 + C), boxes then sigmoid scores
        decoded = reference((x * 255 - MEAN) / STD)
        out = model(x)
    assert float((out["boxes"] - decoded[..., :4]).abs().max()) <= 1e-4
    assert float((out["scores"] - decoded[..., 4:]).abs().max()) <= 1e-4


def test_keys_convert_both_ways_and_the_upstream_mmdet_layout_reads_like_libreyolo_reads_it():
    from libreyolo.models.picodet.convert import convert_upstream

    reference, model = _oracle_pair(3)
    expected = reference.state_dict()
    back = to_libreyolo("s", model.state_dict())
    checks.assert_state_dicts_equal(back, expected)
    assert convert("s", model.state_dict(), "zoo", "libreyolo").keys() == back.keys()

    # Bo396543018's mmdet layout, written from LibreYOLO's keys by the renames LibreYOLO's converter lists;
    # zoo's reading of it must agree with LibreYOLO's own converter.
    flat_to_bo = {}
    for stage, repeats, start in ((2, 3, 0), (3, 7, 3), (4, 3, 10)):
        for index in range(repeats):
            flat_to_bo[start + index] = f"{stage}_{index + 1}"
    upstream = {}
    for key, value in expected.items():
        key = "bbox_head." + key[len("head."):] if key.startswith("head.") else key
        key = re.sub(r"^backbone\.blocks\.(\d+)\.", lambda match: f"backbone.{flat_to_bo[int(match.group(1))]}.", key)
        key = key.replace("neck.trans.", "neck.trans.trans.")
        key = re.sub(r"\.se\.conv([12])\.", r".se.conv\1.conv.", key)
        upstream[key] = value
    upstream["bbox_head.integral.project"] = torch.linspace(0, 7, 8)
    upstream["ema_backbone_conv1_conv_weight"] = torch.zeros(1)
    assert set(convert_upstream(upstream)) == set(expected)
    mine = convert("s", upstream, "upstream", "zoo")
    assert mine.keys() == model.state_dict().keys() and all(torch.equal(mine[k], v) for k, v in model.state_dict().items())
    # other layouts: no answer
    assert convert("s", model.state_dict(), "libreyolo", "zoo") is None
    assert convert("s", expected, "darknet", "zoo") is None
    with pytest.raises(KeyError):
        from_libreyolo({"neck.sideways.0.conv.weight": torch.zeros(1)})


def test_loss_terms_and_gradients_equal_libreyolo():
    """Same SimOTA assignment, so the varifocal, GIoU and DFL terms of ``PICODETLoss`` agree, and so do
    the gradients (both differentiate the varifocal weight, as mmdet and PaddleDetection do)."""
    from libreyolo.models.picodet.loss import PICODETLoss

    reference, model = _oracle_pair(5, head_std=0.05)
    reference.train(), model.train()
    x = torch.rand(2, 3, 128, 192)
    class_maps, box_maps = reference((x * 255 - MEAN) / STD)
    expected = PICODETLoss(num_classes=5, distributed_normalize=False)(class_maps, box_maps, *_per_image(TARGETS, 2))
    loss, items = model.loss(model(x), {"images": x, "targets": TARGETS})
    assert expected["num_pos"] > 10
    for mine, theirs in ((items["cls"], "loss_cls"), (items["giou"], "loss_bbox"), (items["dfl"], "loss_dfl")):
        assert float(mine) == pytest.approx(float(expected[theirs]), rel=1e-5)
    assert float(loss.detach()) == pytest.approx(float(expected["total_loss"].detach()), rel=1e-5)
    expected["total_loss"].backward()
    loss.backward()
    for theirs, mine in ((reference.head.gfl_cls[0].weight, model.head.preds[0].weight),
                         (reference.backbone.conv1.conv.weight, model.backbone.stem[0].weight)):
        assert float((theirs.grad - mine.grad).abs().max()) <= 1e-5 * max(1.0, float(theirs.grad.abs().max()))


def test_loss_reaches_every_parameter_with_and_without_targets():
    torch.manual_seed(0)
    model = _picodet("s", 5).train()
    x = torch.rand(2, 3, 128, 192)
    checks.assert_loss_reaches_every_parameter(model, x, (TARGETS, torch.zeros(0, 6)), {"cls", "giou", "dfl"})


def test_postprocess_contract():
    torch.manual_seed(0)
    model = _picodet("s", 3).eval()
    with torch.no_grad():
        outputs = model(torch.rand(2, 3, 64, 96))
    assert outputs["boxes"].shape == (2, 96 + 24 + 6 + 2, 4)  # strides 8, 16, 32 and a 1×2 stride-64 level
    for item in model.postprocess(outputs, conf=0.0, iou=0.6, max_det=10):
        assert item["boxes"].shape[1:] == (4,) and item["labels"].dtype == torch.int64
        assert len(item["boxes"]) == len(item["scores"]) == len(item["labels"]) == 10


def test_the_recipe_is_paddledetections_legacy_one():
    manager = get_plugin_manager()
    assert manager.family("picodet").sync_bn is True
    small, large = manager.training_recipe("picodet", "s"), manager.training_recipe("picodet", "l")
    defaults = small.config_defaults
    assert (defaults["optimizer"], defaults["lr0"], defaults["momentum"], defaults["weight_decay"]) == ("SGD", 0.4, 0.9, 4e-5)
    assert (defaults["lr_schedule"], defaults["lrf"], defaults["warmup_iters"], defaults["epochs"]) == ("cosine", 0.0, 300, 300)
    assert (defaults["ema_decay"], defaults["mosaic"], defaults["nbs"]) == (0.9998, 0.0, None)
    assert (large.config_defaults["lr0"], large.config_defaults["epochs"]) == (0.3, 250)

    model = _picodet("s", 3)
    config = TrainConfig.build({"data": "shapes"}, defaults=defaults)
    # lr0 is the rate of the published global batch (512 images for S): linear scaling to 64 images
    optimizer = small.build_optimizer(model, config, iterations=10, images_per_step=64)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.4 * 64 / PUBLISHED_BATCH["s"]] * 3)
    # L: its 250 epochs follow a cosine laid out over 300
    config_l = TrainConfig.build({"data": "shapes"}, defaults=large.config_defaults)
    assert large.lr_schedule(config_l, 10, large.build_optimizer(model, config_l, iterations=10, images_per_step=32)).epochs == 300
    # cycle EMA: restarted from the current weights every 40 epochs
    ema = small.build_ema(model, config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    ema.update(model)
    name = next(iter(dict(model.named_parameters())))
    small.on_epoch_start(model, RunInfo(EMA_CYCLE_EPOCHS - 1, 300, 10, 0, 1))
    assert not torch.equal(ema.module.state_dict()[name], model.state_dict()[name])
    small.on_epoch_start(model, RunInfo(EMA_CYCLE_EPOCHS, 300, 10, 0, 1))
    assert torch.equal(ema.module.state_dict()[name], model.state_dict()[name]) and ema.updates == 0


def test_picodet_s_overfits_a_fixed_sample_and_draws_its_predictions(tmp_path: Path, learning):
    """120 AdamW steps at batch 4 on 8 scenes of 64 px, constant rate, no warm-up, no EMA.

    At twice that rate the run was chaotic over seeds and thread counts; a cosine tail did not help,
    half the rate did. The threshold is 80 % of the worst mAP50 over seeds and thread counts, as
    ``benchmarks/learning_margins.py`` measures it.
    """
    # The recipe reads lr0 as the rate of 512 images and scales it to the batch: 0.32 at batch 4 is AdamW at 2.5e-3,
    # held constant (the published cosine to 0 spends half of a short run at a crawl).
    model, metrics, images = checks.overfit_fixed_sample(
        tmp_path, "picodet-s", "detect", images=8, size=64, batch=4, val_batch=8, epochs=60, optimizer="AdamW", lr0=0.32,
        lr_schedule="constant", warmup_iters=0, ema=False, seed=learning.seed)
    learning.expect(metrics, {"mAP50": 0.55}, checks={"drawing": checks.detector_draws_its_predictions(model, images, conf=0.3, size=64, all_true=False)})


def test_picodet_s_trains_one_epoch_on_two_spawned_cpu_ranks():
    model, result = checks.train_on_two_spawned_cpu_ranks("picodet-s", num_train=4, num_val=2, metric="mAP50-95", imgsz=32,
                                                          warmup_iters=0)
    checks.assert_caller_holds_rank_zeros_best(model, result)
