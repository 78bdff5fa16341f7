"""EdgeCrafter ECDet (plugins/zoo_ec): it learns, trains on two spawned ranks, draws predictions; its recipe,
its build options and parameter forms, its LibreYOLO key layout both ways; LibreYOLO parity of the training loss.

The learning test (``tests/test_detr_core.learns_a_fixed_sample``) trains the smallest size, ECDet-S,
through ``LibreYOLO.train`` on 2 fixed ``shapes`` scenes (4 objects) at 64 px (ECViT's stride-16 tokens resampled
to strides 8/16/32: 84 encoder tokens), 60 steps at batch 2, with 20 matching and 20 denoising
queries (build options; published: 300 / 100), the published optimiser (AdamW, clipping 0.1, ECViT at
0.05 of the rate) at a higher base rate (1e-3) and without warm-up, EMA or mosaic, which a short run
has no room for.
"""

from __future__ import annotations

import pytest
import torch

from zoo_core.plugin_manager import get_plugin_manager

from .test_deimv2 import build, learns_a_fixed_sample, spawned_ranks_train_one_epoch
from .test_detr_core import training_loss_parity

pytestmark = pytest.mark.timeout(600)

FAMILY, SMALLEST = "ec", "s"


def test_ec_s_overfits_a_fixed_sample_and_draws_its_predictions(tmp_path, learning):
    learns_a_fixed_sample(tmp_path, f"{FAMILY}-{SMALLEST}", learning, steps=60, lr0=1e-3, images=2, batch=2)


def test_the_smallest_size_trains_one_epoch_on_two_spawned_cpu_ranks():
    spawned_ranks_train_one_epoch(f"{FAMILY}-{SMALLEST}", {"num_queries": 10, "num_denoising": 10})


def test_the_recipe_is_the_published_one():
    manager = get_plugin_manager()
    small, large, xl = (manager.training_recipe(FAMILY, size) for size in ("s", "l", "x"))
    defaults = small.config_defaults
    assert (defaults["optimizer"], defaults["lr0"], defaults["weight_decay"], defaults["nbs"], defaults["batch"]) == ("AdamW", 5e-4, 1e-4, 32, 32)
    assert (defaults["lr_schedule"], defaults["lrf"], defaults["warmup_iters"], defaults["max_grad_norm"]) == ("flat_cosine", 0.5, 2000, 0.1)
    assert (defaults["epochs"], defaults["flat_epochs"], defaults["close_mosaic"], defaults["mosaic"]) == (74, 36, 2, 0.75)
    assert (defaults["ema_decay"], defaults["ema_tau"], defaults["beta2"]) == (0.9999, 1000, 0.999)
    assert (large.config_defaults["weight_decay"], large.config_defaults["epochs"], large.config_defaults["mosaic"]) == (1.25e-4, 50, 1.0)
    assert small.input_size_multiple() == 32
    for recipe, multiplier in ((small, 0.05), (large, 0.01), (xl, 0.005)):
        model = build(FAMILY, recipe.size, 3, device="meta")
        groups = [group for group in recipe.parameter_groups(model, None) if group.params]
        assert {group.lr_scale for group in groups} == {1.0, multiplier}
        backbone = {id(p) for p in model.backbone.parameters()}
        for group in groups:  # ECViT and its projectors (the configs' ``.backbone`` group) and nothing else
            assert all((id(p) in backbone) == (group.lr_scale == multiplier) for p in group.params)
        assert sum(p.numel() for group in groups for p in group.params) == sum(p.numel() for p in model.parameters())


def test_build_options_are_checked_and_name_the_key():
    with pytest.raises(ValueError, match="num_layers"):
        build(FAMILY, SMALLEST, 3, {"num_layers": 2}, device="meta")
    model = build(FAMILY, SMALLEST, 3, {"num_queries": 10, "num_denoising": 10}, device="meta")
    assert model.decoder.num_queries == 10


def test_parameter_forms_of_the_smallest_size():
    model = build(FAMILY, SMALLEST, 80, device="meta")
    # registry.yaml params_source: 9,811,307 deployed (= LibreYOLO 1.6 deploy()), 9,884,102 trainable
    assert model.published_parameter_count() == 9_811_307
    assert sum(p.numel() for p in model.parameters()) == 9_884_102 - 2  # up, reg_scale: buffers in zoo
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())


def test_the_backbone_gives_strides_8_16_32_from_the_last_two_blocks():
    model = build(FAMILY, SMALLEST, 3, {"num_queries": 10}).eval()
    with torch.no_grad():
        maps = model.backbone(torch.rand(1, 3, 64, 96))
    assert [tuple(m.shape[2:]) for m in maps] == [(8, 12), (4, 6), (2, 3)]
    assert [m.shape[1] for m in maps] == list(model.backbone.out_channels)


def test_keys_map_to_libreyolo_both_ways():
    """zoo → LibreYOLO gives exactly a LibreYOLO EC model's keys (its buffers as LibreYOLO builds them), and back."""
    pytest.importorskip("libreyolo")
    from tests.oracle_cases import build_libreyolo
    from zoo_ec.convert import from_libreyolo, to_libreyolo

    theirs = build_libreyolo(FAMILY, SMALLEST).model.state_dict()
    ours = build(FAMILY, SMALLEST).state_dict()
    written = to_libreyolo(SMALLEST, ours)
    assert set(written) == set(theirs)
    for key in ("decoder.anchors", "decoder.valid_mask", "backbone.backbone.rope_embed.periods"):
        torch.testing.assert_close(written[key], theirs[key], msg=key)
    back = from_libreyolo(SMALLEST, written)
    assert set(back) == set(ours)
    assert all(torch.equal(back[key], value) for key, value in ours.items())
    assert set(from_libreyolo(SMALLEST, theirs)) == set(ours)


def test_training_loss_matches_libreyolo(monkeypatch):
    """Same weights, same denoising draws: LibreYOLO's EC criterion on its model = zoo's recipe step on the converted one.

    LibreYOLO 1.6's EC trainer builds MAL with γ 2 where the published config (ecdet.yml) has 1.5,
    zoo's default; the comparison runs zoo's criterion at LibreYOLO's γ.
    """
    pytest.importorskip("libreyolo")
    import dataclasses

    import zoo_ec.model

    assert zoo_ec.model.CRITERION.gamma == 1.5
    monkeypatch.setattr(zoo_ec.model, "CRITERION", dataclasses.replace(zoo_ec.model.CRITERION, gamma=2.0))
    expected, got = training_loss_parity(FAMILY, SMALLEST, 128)
    assert got == pytest.approx(expected, rel=1e-5)
