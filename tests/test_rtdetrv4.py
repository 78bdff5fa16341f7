"""RT-DETRv4 (plugins/zoo_rtdetrv4): it learns, trains on two spawned ranks, draws predictions; its recipe; LibreYOLO parity.

RT-DETRv4's DINOv3-teacher distillation is not built (zoo_rtdetrv4/recipe.py): zoo trains the
student as DEIM does. The learning test trains the smallest size, RT-DETRv4-S, through
``LibreYOLO.train`` on a fixed ``shapes`` sample of 2 scenes (4 objects) and validates on the same
images: 80 steps at batch 2 and base rate 1e-3, at 64 px (strides 8-32: 84 encoder tokens) with 20 matching and 20 denoising queries (build options;
published: 300 / 100), the published optimiser (AdamW, clipping 0.1, backbone at half the rate)
at a higher base rate and without warm-up, EMA or mosaic, which an 80-step run has no room for.
"""

from __future__ import annotations

import pytest

from zoo_core.plugin_manager import get_plugin_manager

from .test_detr_core import learns_a_fixed_sample, libreyolo_key_sets_agree, spawned_ranks_train_one_epoch, training_loss_parity

pytestmark = pytest.mark.timeout(600)

FAMILY, SMALLEST = "rtdetrv4", "s"


def test_rtdetrv4_s_overfits_a_fixed_sample_and_draws_its_predictions(tmp_path, learning):
    learns_a_fixed_sample(tmp_path, f"{FAMILY}-{SMALLEST}", learning, steps=80, lr0=1e-3, images=2, batch=2, repeats=40)


def test_the_smallest_size_trains_one_epoch_on_two_spawned_cpu_ranks():
    spawned_ranks_train_one_epoch(f"{FAMILY}-{SMALLEST}")


def test_the_recipe_is_deims_without_the_teacher():
    manager = get_plugin_manager()
    for size in ("s", "m", "l", "x"):
        assert manager.training_recipe(FAMILY, size).config_defaults == manager.training_recipe("deim", size).config_defaults
        assert manager.training_recipe(FAMILY, size).lr_multipliers == manager.training_recipe("deim", size).lr_multipliers
    assert "distill" not in " ".join(manager.training_recipe(FAMILY, "s").config_defaults)


def test_official_checkpoints_drop_the_training_only_feature_projector():
    import torch

    from zoo_rtdetrv4.convert import convert

    converted = convert(SMALLEST, {"encoder.feature_projector.0.weight": torch.zeros(1), "decoder.up": torch.zeros(1)},
                        "upstream", "zoo")
    assert set(converted) == {"decoder.up"}


def test_training_loss_matches_libreyolo():
    expected, got = training_loss_parity(FAMILY, SMALLEST, 128)
    assert got == pytest.approx(expected, rel=1e-5)


def test_keys_map_to_libreyolo_both_ways():
    libreyolo_key_sets_agree(FAMILY, SMALLEST)
