"""The `segformer` family: counts, the LibreYOLO oracle, key conversion, the semantic contract, the recipe,
and that it learns, trains on two spawned ranks and draws its predictions."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from zoo_core.building import BuildRequest, count_parameters
from zoo_core.engine.config import TrainConfig
from zoo_core.errors import RegistryError
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.registry import load_registry

from .segmentation_oracle import build, libreyolo_net, oracle_max_difference, randomise_normalisation
from . import family_checks as checks

pytestmark = pytest.mark.timeout(300)

SIZES = ["b0", "b1", "b2", "b3", "b4", "b5"]
IGNORE = 255
# Exact counts at 150 classes; LibreYOLO 1.6 (= Hugging Face's SegFormer) counts the same.
EXACT = {"b0": 3_752_694, "b1": 13_715_798, "b2": 27_461_974, "b3": 47_337_814, "b4": 64_108_374, "b5": 84_708_694}


_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)


# ------------------------------------------------------------------------------ parameter counts
@pytest.mark.parametrize("size", SIZES)
def test_counts_equal_libreyolo_and_round_to_the_published_figure(size):
    with torch.device("meta"):
        zoo, reference = build("segformer", size, 150), libreyolo_net("segformer", size, 150)
    assert count_parameters(zoo) == count_parameters(reference) == EXACT[size]
    declaration = load_registry()["segformer"]
    published = declaration.sizes[size].params
    # The paper prints Params(M) with one decimal: the exact count must round to it ...
    assert round(EXACT[size] / 1e5) == published / 1e5
    # ... and B0 (3,752,694 vs 3.8M, -1.24%) sets the family's tolerance: the narrowest that admits it.
    assert abs(EXACT[size] - published) / published <= declaration.param_tolerance == 0.0125


# ------------------------------------------------------------------------------ the LibreYOLO oracle
def test_b0_reproduces_libreyolo_logits_on_square_and_rectangular_inputs():
    worst, _, _ = oracle_max_difference("segformer", "b0", 150, [(64, 64), (64, 96), (96, 160)])
    assert worst <= 1e-4


def test_libreyolo_round_trip_is_exact():
    from zoo_segformer.convert import from_libreyolo, to_libreyolo

    original = randomise_normalisation(libreyolo_net("segformer", "b0", 7)).state_dict()
    back = to_libreyolo("b0", from_libreyolo(original))
    assert set(back) == set(original)
    assert all(back[name].shape == tensor.shape and torch.equal(back[name], tensor) for name, tensor in original.items())


def test_zoo_state_dict_round_trips_through_both_foreign_layouts():
    from zoo_segformer.convert import from_libreyolo, from_upstream, to_libreyolo, to_upstream

    state = build("segformer", "b1", 5).state_dict()
    for there, back in ((lambda weights: to_libreyolo("b1", weights), from_libreyolo), (to_upstream, from_upstream)):
        again = back(there(state))
        assert set(again) == set(state) and all(torch.equal(again[name], tensor) for name, tensor in state.items())


def test_upstream_layout_has_the_hugging_face_names_and_shapes():
    from zoo_segformer.convert import to_upstream

    with torch.device("meta"):
        upstream = to_upstream(build("segformer", "b0", 150).state_dict())
    assert upstream["segformer.encoder.block.0.1.attention.self.key.weight"].shape == (32, 32)
    assert upstream["segformer.encoder.block.0.1.attention.self.sr.weight"].shape == (32, 32, 8, 8)
    assert upstream["segformer.encoder.block.3.0.mlp.dwconv.dwconv.weight"].shape == (1024, 1, 3, 3)
    assert upstream["segformer.encoder.patch_embeddings.0.proj.weight"].shape == (32, 3, 7, 7)
    assert upstream["segformer.encoder.layer_norm.3.weight"].shape == (256,)
    assert upstream["decode_head.linear_c.3.proj.weight"].shape == (256, 256)
    assert upstream["decode_head.linear_fuse.weight"].shape == (256, 1024, 1, 1)
    assert upstream["decode_head.classifier.weight"].shape == (150, 256, 1, 1)
    assert "segformer.encoder.block.3.0.attention.self.sr.weight" not in upstream  # stage 4 has no reduction


def test_convert_weights_hook_answers_its_family_only_and_rejects_strangers():
    from zoo_segformer.convert import convert, from_libreyolo, from_upstream

    state = libreyolo_net("segformer", "b0", 3).state_dict()
    assert get_plugin_manager().family("unet").converter != "zoo_segformer.convert:convert"  # segformer's only
    assert get_plugin_manager().convert_weights("segformer", "b0", state, "timm", "zoo") is None
    assert convert("b0", state, "libreyolo", "upstream") is None  # only to or from zoo
    zoo_state = convert("b0", state, "libreyolo", "zoo")
    assert "encoder.stages.0.blocks.0.attn.kv.weight" in zoo_state
    back = convert("b0", zoo_state, "zoo", "libreyolo")
    assert set(back) == set(state) and all(torch.equal(back[name], state[name]) for name in state)
    with pytest.raises(ValueError, match="unexpected key"):
        from_libreyolo({**state, "decode_head.extra.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="unexpected key"):
        from_upstream(state)  # LibreYOLO keys are not the upstream layout


# ------------------------------------------------------------------------------ the semantic contract
@pytest.mark.parametrize(("height", "width"), [(64, 64), (64, 128), (96, 32)])
def test_eval_logits_are_at_the_input_resolution(height, width):
    model = build("segformer", "b0", 4).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, height, width)).shape == (1, 4, height, width)


def test_train_outputs_are_stride_4_logits_and_the_loss_is_pixel_cross_entropy_at_mask_resolution():
    torch.manual_seed(0)
    model = build("segformer", "b0", 4).train()
    images, masks = torch.randn(2, 3, 64, 96), torch.randint(0, 4, (2, 64, 96))
    masks[:, :10] = IGNORE
    outputs = model(images)
    assert set(outputs) == {"main"} and outputs["main"].shape == (2, 4, 16, 24)
    loss, items = model.loss(outputs, {"masks": masks, "ignore_index": IGNORE})
    upsampled = F.interpolate(outputs["main"], size=(64, 96), mode="bilinear", align_corners=False)
    torch.testing.assert_close(loss, F.cross_entropy(upsampled, masks, ignore_index=IGNORE))
    assert set(items) == {"main_ce"}
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    with pytest.raises(ValueError, match="masks"):
        model.loss(outputs, {"ignore_index": IGNORE})


def test_stochastic_depth_rises_linearly_to_0_1_like_libreyolo():
    with torch.device("meta"):
        model, reference = build("segformer", "b2", 3), libreyolo_net("segformer", "b2", 3)
    rates = [getattr(block.drop_path, "drop_prob", 0.0) for stage in model.encoder.stages for block in stage.blocks]
    expected = [getattr(block.drop_path, "drop_prob", 0.0) for stage in reference.encoder.stages for block in stage.blocks]
    assert rates == pytest.approx(expected) and rates[0] == 0.0 and rates[-1] == pytest.approx(0.1)


def test_builder_options_and_errors():
    from zoo_segformer.model import Segformer, build_segformer

    config = load_registry()["segformer"].sizes["b0"].config
    model = build("segformer", "b0", 3, drop_path_rate=0.0, head_dropout=0)
    assert isinstance(model, Segformer) and model.config.drop_path_rate == 0.0 and model.config.head_dropout == 0.0
    with pytest.raises(ValueError, match="unknown SegFormer setting"):
        build("segformer", "b0", 3, width=3)
    with pytest.raises(RegistryError, match="embed_dims"):
        build_segformer(BuildRequest("segformer", "b0", 3, {**config, "embed_dims": [32, 64]}, None))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ the published recipe
def test_the_recipe_is_mmsegmentations():
    declaration = load_registry()["segformer"]
    recipe = get_plugin_manager().training_recipe("segformer", "b0")
    config = TrainConfig.build({"data": "shapes"}, defaults=recipe.config_defaults)
    assert (config.optimizer, config.lr0, config.momentum, config.beta2, config.weight_decay) == ("AdamW", 6e-5, 0.9, 0.999, 0.01)
    assert (config.lr_schedule, config.lr_power, config.lrf, config.warmup_iters, config.ema) == ("poly", 1.0, 0.0, 1500, False)
    assert declaration.sync_bn and declaration.spawn
    with torch.device("meta"):
        model = build("segformer", "b0", 150)
    optimizer = recipe.build_optimizer(model, config, iterations=10, images_per_step=16)
    rates = {id(parameter): group["lr"] for group in optimizer.param_groups for parameter in group["params"]}
    for name, parameter in model.named_parameters():  # the decode head learns 10x faster (mmseg head lr_mult 10)
        assert rates[id(parameter)] == pytest.approx(6e-4 if name.startswith("decoder.") else 6e-5), name
    schedule = recipe.lr_schedule(config, iterations_per_epoch=1000, optimizer=optimizer)
    assert schedule.warmup_iterations == 1500 and schedule.warmup_bias_lr == 0.0
    assert schedule.factor(50_000) == pytest.approx(1 - 50_000 / 100_000)  # poly power 1.0 over 100 epochs x 1000 iterations


# ------------------------------------------------------------------------------ it learns, spawns, draws
def test_b0_overfits_a_fixed_sample_and_draws_its_masks(tmp_path, learning):
    # AdamW 1e-3 (the decoder at 1e-2 through the recipe's x10), constant: the published 6e-5 with
    # 1500 warm-up iterations is for 160k iterations, not 25.
    model, metrics, images = checks.overfit_fixed_sample(
        tmp_path, "segformer-b0", "semantic", images=4, size=64, batch=4, num_classes=5, epochs=25, nbs=4,
        optimizer="AdamW", lr0=0.001, ema=False, warmup_iters=0, lr_schedule="constant", seed=learning.seed)
    # The threshold is 80 % of the worst mIoU over seeds and thread counts (benchmarks/learning_margins.py).
    learning.expect(metrics, {"mIoU": 0.55})
    checks.assert_segmenter_draws_its_masks(model, images / "000000.png", 64)


def test_b0_trains_one_epoch_on_two_spawned_cpu_ranks():
    model, result = checks.train_on_two_spawned_cpu_ranks("segformer-b0", num_train=4, num_val=2, metric="mIoU")
    assert result.best.is_file() and model.num_classes == 5
