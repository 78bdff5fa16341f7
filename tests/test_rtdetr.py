"""RT-DETR (plugins/zoo_rtdetr): it learns, two ranks equal one, draws predictions; its recipe; LibreYOLO parity.

The learning test trains the smallest size, RT-DETR-R18, through ``LibreYOLO.train`` on a fixed
``shapes`` sample of 2 scenes (4 objects, 4 classes) and validates on the same images: at 64 px
(strides 8-32: 84 encoder tokens), 60 steps at batch 2, with 20 matching and 20 denoising queries
(build options; published: 300 / 100), the published optimiser (AdamW, clipping 0.1, backbone at a
tenth of the rate) at a higher base rate (1e-3) and without warm-up or EMA, which a 60-step run
has no room for. (RT-DETR learns in a jump between 40 and 60 steps here: 40 steps reach mAP50 0.1.)

The DDP test is also the family's two-rank spawn test: one optimizer step on two spawned CPU
ranks at batch 2 each gives the parameters of one process at batch 4 (the criterion divides by
the box count averaged over ranks, so DDP's gradient mean is the whole batch's gradient), and the
run returns its metrics.
"""

from __future__ import annotations

import math

import pytest
import torch

from zoo_core.data.shapes import shapes
from zoo_core.facade import LibreYOLO
from zoo_core.plugin_manager import get_plugin_manager

from .test_detr_core import learns_a_fixed_sample, libreyolo_key_sets_agree, training_loss_parity

pytestmark = pytest.mark.timeout(600)

FAMILY, SMALLEST = "rtdetr", "r18"


def test_rtdetr_r18_overfits_a_fixed_sample_and_draws_its_predictions(tmp_path, learning):
    learns_a_fixed_sample(tmp_path, f"{FAMILY}-{SMALLEST}", learning, steps=60, lr0=1e-3, images=2, batch=2, repeats=30)


def test_two_spawned_ranks_at_half_batch_equal_one_process_and_return_metrics(tmp_path):
    # Denoising is off: its random noise is drawn per rank. BatchNorm statistics are synchronised and
    # SGD without clipping keeps the comparison scale-sensitive (tests/test_engine_equivalence.py).
    torch.manual_seed(0)
    initial = LibreYOLO(f"{FAMILY}-{SMALLEST}", num_classes=4, options={"num_queries": 10, "num_denoising": 0})
    initial_path = initial.save(tmp_path / "initial.safetensors")
    settings = dict(
        data=shapes(num_train=4, num_val=2, image_size=64, seed=1), epochs=1, batch=4, imgsz=64, workers=0, nbs=4,
        optimizer="SGD", lr0=0.01, momentum=0.9, weight_decay=0.0, warmup_iters=0, ema=False, augment=False,
        sync_bn=True, max_grad_norm=None, plots=False, verbose=False,
    )
    one = LibreYOLO(initial_path).train(device="cpu", name="one", **settings)
    two = LibreYOLO(initial_path).train(device="cpu,cpu", name="two", **settings)
    assert two.world_size == 2 and two.epochs_completed == 1 and math.isfinite(two.metrics["mAP50-95"])
    first = torch.load(one.last, map_location="cpu", weights_only=True)["train_model"]
    second = torch.load(two.last, map_location="cpu", weights_only=True)["train_model"]
    before = initial.model.state_dict()
    moved = [key for key, value in first.items() if value.is_floating_point() and not torch.equal(value, before[key])]
    assert moved, "the step changed nothing: the comparison would be vacuous"
    different = [key for key, value in first.items()
                 if value.is_floating_point() and not torch.allclose(value, second[key], rtol=1e-4, atol=1e-6)]
    assert different == []


def test_the_recipe_is_the_published_one():
    manager = get_plugin_manager()
    recipe = manager.training_recipe(FAMILY, SMALLEST)
    defaults = recipe.config_defaults
    assert (defaults["optimizer"], defaults["lr0"], defaults["weight_decay"], defaults["max_grad_norm"]) == ("AdamW", 1e-4, 1e-4, 0.1)
    assert (defaults["lr_schedule"], defaults["lr_milestones"], defaults["warmup_iters"]) == ("multistep", [1000], 2000)
    assert (defaults["ema_decay"], defaults["ema_tau"], defaults["epochs"], defaults["nbs"]) == (0.9999, 2000, 72, 16)
    assert defaults["mosaic"] == 0.0 and defaults["find_unused_parameters"] is True
    assert manager.family(FAMILY).sync_bn is False
    assert recipe.lr_multipliers == {"backbone.": 0.1}
    assert manager.training_recipe(FAMILY, "r101").lr_multipliers == {"backbone.": 0.01}
    # The backbone's parameter groups start at a tenth of the rate; the targets reach forward (denoising).
    model = LibreYOLO(f"{FAMILY}-{SMALLEST}", num_classes=3, options={"num_queries": 10, "num_denoising": 10}).model
    from zoo_core.engine.config import TrainConfig

    config = TrainConfig.build({"data": "shapes"}, defaults=defaults)
    optimizer = recipe.build_optimizer(model, config, iterations=10, images_per_step=16)
    backbone = {id(p) for p in model.backbone.parameters()}
    rates = {group["lr"] for group in optimizer.param_groups if any(id(p) in backbone for p in group["params"])}
    assert rates == {1e-5}
    images, targets = torch.rand(2, 3, 64, 64), torch.tensor([[0, 1, 4.0, 4.0, 40.0, 30.0], [1, 2, 10.0, 12.0, 60.0, 60.0]])
    outputs = {}
    original = model.forward

    def spy(*args, **kwargs):
        outputs.update(original(*args, **kwargs))
        return outputs

    model.forward = spy
    loss, items = recipe.forward_train(model.train(), {"images": images, "targets": targets})
    assert outputs["denoising"] is not None and torch.isfinite(loss) and set(items) == {"cls", "l1", "giou"}


def test_training_loss_matches_libreyolo():
    expected, got = training_loss_parity(FAMILY, SMALLEST, 128)
    assert got == pytest.approx(expected, rel=1e-5)


def test_keys_map_to_libreyolo_both_ways():
    libreyolo_key_sets_agree(FAMILY, SMALLEST)
