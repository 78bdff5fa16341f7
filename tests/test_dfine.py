"""D-FINE (plugins/zoo_dfine): it learns, trains on two spawned ranks, draws predictions; its recipe; LibreYOLO parity.

The learning test trains the smallest size, D-FINE-N, through ``LibreYOLO.train`` on a fixed
``shapes`` sample of 2 scenes (4 objects, 3 classes) and validates on the same images (80 steps at
batch 2, base rate 1e-3, in 2 epochs: each epoch shows every scene 40 times, so only 2 checkpoints
are written): at 64 px (two levels, strides 16 and 32: 20 encoder tokens) with 20 matching and 20
denoising queries (build options; published: 300 / 100),
the published optimiser (AdamW, clipping 0.1, backbone at half the rate) at a higher base rate
and without warm-up or EMA, which an 80-step run has no room for. (40 steps at batch 4 on 4 scenes
reach mAP50 0.2; these 80 reach 1.0, mAP50-95 0.68.)
"""

from __future__ import annotations

import pytest
import torch

from zoo_core.plugin_manager import get_plugin_manager

from . import family_checks as checks
from .test_detr_core import learns_a_fixed_sample, libreyolo_key_sets_agree, spawned_ranks_train_one_epoch, training_loss_parity

pytestmark = pytest.mark.timeout(600)

FAMILY, SMALLEST = "dfine", "n"

# one torch thread in every test (the learning test's scores are those of one thread; a test that sets
# its own count gets the caller's back at teardown)
_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)


def test_dfine_n_overfits_a_fixed_sample_and_draws_its_predictions(tmp_path, learning):
    learns_a_fixed_sample(tmp_path, f"{FAMILY}-{SMALLEST}", learning, steps=80, lr0=1e-3, images=2, batch=2, repeats=40)


def test_the_smallest_size_trains_one_epoch_on_two_spawned_cpu_ranks():
    spawned_ranks_train_one_epoch(f"{FAMILY}-{SMALLEST}")


def test_the_recipe_is_the_published_one():
    recipe = get_plugin_manager().training_recipe(FAMILY, "n")
    defaults = recipe.config_defaults
    assert (defaults["optimizer"], defaults["lr0"], defaults["weight_decay"], defaults["nbs"]) == ("AdamW", 8e-4, 1e-4, 128)
    assert (defaults["lr_schedule"], defaults["warmup_iters"], defaults["max_grad_norm"]) == ("constant", 500, 0.1)
    assert (defaults["ema_decay"], defaults["ema_tau"], defaults["epochs"], defaults["close_mosaic"]) == (0.9999, 1000, 160, 12)
    assert defaults["mosaic"] == 0.0 and defaults["find_unused_parameters"] is True
    assert recipe.lr_multipliers == {"backbone.": 0.5}
    large = get_plugin_manager().training_recipe(FAMILY, "x")
    assert large.lr_multipliers == {"backbone.": 0.01} and large.config_defaults["lr0"] == 2.5e-4
    assert large.config_defaults["epochs"] - large.config_defaults["close_mosaic"] == 72  # the augmentation stops at 72


def test_training_loss_matches_libreyolo():
    expected, got = training_loss_parity(FAMILY, SMALLEST, 256)
    assert got == pytest.approx(expected, rel=1e-5)


def test_keys_map_to_libreyolo_both_ways():
    libreyolo_key_sets_agree(FAMILY, SMALLEST)


def test_official_keys_load_through_the_upstream_layout():
    from zoo_dfine.convert import convert

    libreyolo_keys = convert(SMALLEST, {"decoder.anchors": torch.zeros(1), "decoder.up": torch.zeros(1)}, "upstream", "zoo")
    assert set(libreyolo_keys) == {"decoder.up"}  # the cached anchors are recomputed, not loaded
    assert get_plugin_manager().family("yolo9").converter != "zoo_dfine.convert:convert"  # dfine's converter is dfine's only
