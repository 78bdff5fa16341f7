"""DEIM (plugins/zoo_deim): it learns, trains on two spawned ranks, draws predictions; its recipe; LibreYOLO parity.

The learning test trains the smallest size, DEIM-N, through ``LibreYOLO.train`` on a fixed
``shapes`` sample of 2 scenes (4 objects, 3 classes) and validates on the same images (80 steps at
batch 2, base rate 1e-3, in 2 epochs: each epoch shows every scene 40 times, so only 2 checkpoints
are written; 40 steps at batch 4 on 4 scenes reach mAP50 0.12, these 80 reach 1.0): at 64 px (two levels, strides 16 and 32: 20 encoder tokens) with 20 matching and 20
denoising queries (build options; published: 300 / 100),
the published optimiser (AdamW, clipping 0.1, backbone at half the rate; N's flat schedule) at a
higher base rate and without warm-up, EMA or mosaic, which an 80-step run has no room for.
"""

from __future__ import annotations

import pytest

from zoo_core.plugin_manager import get_plugin_manager

from . import family_checks as checks
from .test_detr_core import learns_a_fixed_sample, libreyolo_key_sets_agree, spawned_ranks_train_one_epoch, training_loss_parity

pytestmark = pytest.mark.timeout(600)

FAMILY, SMALLEST = "deim", "n"

# one torch thread in every test (the learning test's scores are those of one thread; a test that sets
# its own count gets the caller's back at teardown)
_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)


def test_deim_n_overfits_a_fixed_sample_and_draws_its_predictions(tmp_path, learning):
    learns_a_fixed_sample(tmp_path, f"{FAMILY}-{SMALLEST}", learning, steps=80, lr0=1e-3, images=2, batch=2, repeats=40)


def test_the_smallest_size_trains_one_epoch_on_two_spawned_cpu_ranks():
    spawned_ranks_train_one_epoch(f"{FAMILY}-{SMALLEST}")


def test_the_recipe_is_the_published_one():
    manager = get_plugin_manager()
    small = manager.training_recipe(FAMILY, "s").config_defaults
    assert (small["optimizer"], small["lr0"], small["weight_decay"], small["nbs"]) == ("AdamW", 4e-4, 1e-4, 32)
    assert (small["lr_schedule"], small["lrf"], small["warmup_iters"], small["max_grad_norm"]) == ("flat_cosine", 0.5, 2000, 0.1)
    assert (small["epochs"], small["flat_epochs"], small["close_mosaic"], small["mosaic"]) == (132, 64, 12, 0.5)
    assert (small["ema_decay"], small["ema_tau"]) == (0.9999, 1000) and small["find_unused_parameters"] is True
    assert manager.training_recipe(FAMILY, "s").lr_multipliers == {"backbone.": 0.5}
    assert manager.training_recipe(FAMILY, "l").lr_multipliers == {"backbone.": 0.05}
    nano = manager.training_recipe(FAMILY, "n").config_defaults  # flat_epoch 7800, lr_gamma 1: a flat rate
    assert (nano["lr0"], nano["flat_epochs"], nano["lrf"], nano["nbs"]) == (8e-4, 160, 1.0, 128)


def test_the_flat_cosine_schedule_is_deims():
    from zoo_core.engine.config import TrainConfig

    recipe = get_plugin_manager().training_recipe(FAMILY, "l")  # 58 epochs, flat 29, no-aug 8, lr_gamma 0.5
    config = TrainConfig.build({"data": "shapes"}, defaults=recipe.config_defaults)
    schedule = recipe.lr_schedule(config, iterations_per_epoch=10, optimizer=_optimizer())
    assert schedule.warmup_iterations == 2000
    assert schedule.factor(290) == 1.0 and schedule.factor(500) == pytest.approx(0.5) and schedule.factor(570) == 0.5
    assert 0.5 < schedule.factor(400) < 1.0


def _optimizer():
    import torch

    return torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.zeros(1))], "initial_lr": 1e-3}])


def test_training_loss_matches_libreyolo():
    expected, got = training_loss_parity(FAMILY, SMALLEST, 256)
    assert got == pytest.approx(expected, rel=1e-5)


def test_keys_map_to_libreyolo_both_ways():
    libreyolo_key_sets_agree(FAMILY, SMALLEST)
