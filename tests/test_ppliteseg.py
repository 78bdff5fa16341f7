"""The `ppliteseg` family: counts, the LibreYOLO oracle (logits and loss), key conversion, the semantic contract,
the losses, the recipe, and that it learns, trains on two spawned ranks and draws its predictions."""

from __future__ import annotations

import math

import pytest
import torch

from zoo_core.building import count_parameters
from zoo_core.engine.config import TrainConfig
from zoo_core.errors import RegistryError
from zoo_core.facade import LibreYOLO
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.registry import load_registry

from .segmentation_oracle import build, libreyolo_net, normalised, oracle_max_difference, randomise_normalisation
from . import family_checks as checks

pytestmark = pytest.mark.timeout(300)

SIZES = ["t50", "b50", "t75", "b75"]
IGNORE = 255
INFERENCE = {"t": 8_027_808, "b": 12_234_240}  # 19 classes, auxiliary heads excluded
AUXILIARY = {"t": 169_248, "b": 178_464}


_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)


# ------------------------------------------------------------------------------ sizes and parameter counts
def test_the_registry_declares_the_published_rectangles():
    sizes = load_registry()["ppliteseg"].sizes
    assert {name: size.input_size for name, size in sizes.items()} == {
        "t50": (512, 1024), "b50": (512, 1024), "t75": (768, 1536), "b75": (768, 1536)
    }
    assert LibreYOLO("ppliteseg-t75").input_size == (768, 1536)


@pytest.mark.parametrize("size", SIZES)
def test_the_published_count_is_the_inference_network_of_the_libreyolo_implementation(size):
    with torch.device("meta"):
        zoo, reference = build("ppliteseg", size, 19), libreyolo_net("ppliteseg", size, 19)
    built, auxiliary = count_parameters(zoo), count_parameters(zoo.aux_heads)
    assert built == count_parameters(reference)  # LibreYOLO counts its auxiliary heads too
    assert (zoo.published_parameter_count(), auxiliary) == (INFERENCE[size[0]], AUXILIARY[size[0]])
    assert zoo.published_parameter_count() == built - auxiliary == load_registry()["ppliteseg"].sizes[size].params


# ------------------------------------------------------------------------------ the LibreYOLO oracle
def test_t50_reproduces_libreyolo_logits_on_rectangles():
    worst, _, _ = oracle_max_difference("ppliteseg", "t50", 19, [(64, 64), (64, 128), (96, 160)])
    assert worst <= 1e-4


def test_training_outputs_and_loss_reproduce_libreyolo():
    from libreyolo.models.ppliteseg.loss import PPLiteSegLoss

    worst, model, reference = oracle_max_difference("ppliteseg", "t50", 6, [(64, 64)], seed=4)
    assert worst <= 1e-4
    model.train()
    reference.train()
    images = torch.rand(2, 3, 64, 96)
    masks = torch.randint(0, 6, (2, 64, 96))
    masks[0, :, :20] = IGNORE
    masks[1, 30:40] = IGNORE
    expected = PPLiteSegLoss(num_classes=6, ignore_index=IGNORE)(reference(images), masks)
    loss, items = model.loss(model(normalised(images)), {"masks": masks, "ignore_index": IGNORE})
    torch.testing.assert_close(loss, expected["loss"], rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(("main", "aux8", "aux16", "aux32"), ("main", "aux0", "aux1", "aux2")):
        torch.testing.assert_close(items[f"{ours}_loss"], expected[theirs].detach(), rtol=1e-5, atol=1e-6)


def test_libreyolo_round_trip_is_exact_and_upstream_strips_the_ddp_prefix():
    from zoo_ppliteseg.convert import convert, from_libreyolo, from_upstream, to_libreyolo

    original = randomise_normalisation(libreyolo_net("ppliteseg", "b50", 19)).state_dict()
    back = to_libreyolo("b50", from_libreyolo(original))
    assert set(back) == set(original) and all(torch.equal(back[name], tensor) for name, tensor in original.items())
    wrapped = {f"module.{name}": tensor for name, tensor in original.items()}
    assert from_upstream(wrapped).keys() == from_libreyolo(original).keys()
    assert convert("b50", original, "libreyolo", "upstream") is None  # only to or from zoo
    assert get_plugin_manager().family("segformer").converter != "zoo_ppliteseg.convert:convert"  # ppliteseg's only
    assert get_plugin_manager().convert_weights("ppliteseg", "b50", original, "paddle", "zoo") is None
    zoo_state = convert("b50", original, "libreyolo", "zoo")
    for target in ("libreyolo", "upstream"):
        again = convert("b50", zoo_state, "zoo", target)
        assert set(again) == set(original) and all(torch.equal(again[name], original[name]) for name in original)
    with pytest.raises(ValueError, match="unexpected key"):
        from_libreyolo({**original, "encoder.backbone.fc.weight": torch.zeros(1)})


# ------------------------------------------------------------------------------ the semantic contract
@pytest.mark.parametrize(("height", "width"), [(64, 64), (64, 128), (96, 32)])
def test_eval_logits_are_at_the_input_resolution(height, width):
    model = build("ppliteseg", "t50", 3).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, height, width)).shape == (1, 3, height, width)


def test_train_outputs_are_the_main_and_three_auxiliary_heads_at_their_strides():
    outputs = build("ppliteseg", "b50", 3).train()(torch.randn(2, 3, 64, 128))
    assert {name: tuple(logits.shape) for name, logits in outputs.items()} == {
        "main": (2, 3, 8, 16), "aux8": (2, 3, 8, 16), "aux16": (2, 3, 4, 8), "aux32": (2, 3, 2, 4)
    }


@pytest.mark.parametrize("loss", ["dice_ce_edge", "ohem_ce"])
def test_both_losses_back_propagate_finite_gradients(loss):
    torch.manual_seed(0)
    model = build("ppliteseg", "t50", 4, loss=loss).train()
    masks = torch.randint(0, 4, (2, 64, 64))
    masks[:, :8] = IGNORE
    total, items = model.loss(model(torch.randn(2, 3, 64, 64)), {"masks": masks, "ignore_index": IGNORE})
    assert set(items) == {"main_loss", "aux8_loss", "aux16_loss", "aux32_loss"}
    torch.testing.assert_close(total, sum(items.values()))  # published weights 1, 1, 1, 1
    total.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# ------------------------------------------------------------------------------ loss pieces, by hand and against LibreYOLO
def test_label_edges_by_hand_and_against_libreyolo():
    from libreyolo.models.ppliteseg.loss import target_to_binary_edge
    from zoo_ppliteseg.loss import label_edges

    masks = torch.zeros(1, 6, 6, dtype=torch.long)
    masks[:, :, 3:] = 1  # a vertical class border between columns 2 and 3
    expected = torch.zeros(1, 6, 6, dtype=torch.bool)
    expected[:, :, 2:4] = True
    assert torch.equal(label_edges(masks, 3), expected)
    torch.manual_seed(1)
    random_masks = torch.randint(0, 4, (2, 20, 24))
    random_masks[0, 5:12, 3:9] = IGNORE
    random_masks[1] = 2
    random_masks[1, :, 10:] = IGNORE
    for kernel in (3, 5):
        theirs = target_to_binary_edge(random_masks, num_classes=4, kernel_size=kernel, ignore_index=IGNORE)
        assert torch.equal(label_edges(random_masks, kernel), theirs.squeeze(1).bool())


def test_dice_by_hand_and_against_libreyolo():
    from libreyolo.models.ppliteseg.loss import DiceLoss
    from zoo_ppliteseg.loss import dice_loss

    logits = torch.tensor([[[[0.0, 2.0]], [[0.0, 0.0]]]])  # 1×2 classes×1×2 pixels
    masks = torch.tensor([[[0, IGNORE]]])
    probability = 0.5  # pixel 0: softmax(0, 0); pixel 1 is ignored
    class0 = 1 - (2 * probability + 1) / (probability + 1 + 1 + 1e-5)
    class1 = 1 - (0 + 1) / (probability + 0 + 1 + 1e-5)
    torch.testing.assert_close(dice_loss(logits, masks, IGNORE), torch.tensor((class0 + class1) / 2))
    torch.manual_seed(2)
    logits = torch.randn(2, 5, 12, 10)
    masks = torch.randint(0, 5, (2, 12, 10))
    masks[:, :3] = IGNORE
    torch.testing.assert_close(dice_loss(logits, masks, IGNORE), DiceLoss(5, IGNORE)(logits, masks))


def _two_class_logits(true_probabilities: list[float]) -> torch.Tensor:
    """1×2×1×n logits whose softmax probability of class 0 is ``true_probabilities``."""
    first = torch.tensor([math.log(p / (1 - p)) for p in true_probabilities])
    return torch.stack([first, torch.zeros_like(first)]).view(1, 2, 1, -1)


@pytest.mark.parametrize(
    ("min_kept", "kept"),
    [
        (2, [0.1, 0.3, 0.6]),  # 2nd smallest (0.3) < 0.7: the threshold stays 0.7
        (4, [0.1, 0.3, 0.6]),  # 4th smallest is 0.8 > 0.7: threshold 0.8, kept strictly below it
        (5, [0.1, 0.3, 0.6, 0.8]),  # threshold 0.95
        (6, [0.1, 0.3, 0.6, 0.8, 0.95, 0.99]),  # no more labelled pixels (6) than min_kept: keep them all
        (0, [0.1, 0.3, 0.6, 0.8, 0.95, 0.99]),  # min_kept 0 switches mining off (as PaddleSeg's loss does)
    ],
)
def test_ohem_keeps_the_hard_pixels_by_hand(min_kept, kept):
    from zoo_ppliteseg.loss import ohem_cross_entropy

    logits = _two_class_logits([0.95, 0.1, 0.8, 0.3, 0.6, 0.99, 0.5])
    masks = torch.tensor([[[0, 0, 0, 0, 0, 0, IGNORE]]])  # the last pixel (p 0.5) is ignored
    expected = sum(-math.log(p) for p in kept) / len(kept)
    torch.testing.assert_close(ohem_cross_entropy(logits, masks, IGNORE, 0.7, min_kept), torch.tensor(expected))


def test_ohem_of_an_unlabelled_batch_is_zero_and_min_kept_scales_with_the_batch():
    from zoo_ppliteseg.loss import ohem_cross_entropy, ppliteseg_loss
    from zoo_ppliteseg.model import PPLiteSegConfig

    logits = torch.randn(2, 3, 4, 4, requires_grad=True)
    loss = ohem_cross_entropy(logits, torch.full((2, 4, 4), IGNORE), IGNORE, 0.7, 5)
    assert loss.item() == 0.0
    loss.backward()
    config = PPLiteSegConfig(loss="ohem_ce", ohem_min_kept_ratio=0.25, aux_weights=(0.0, 0.0, 0.0))
    masks = torch.randint(0, 3, (2, 4, 4))
    total, _ = ppliteseg_loss({"main": logits}, masks, IGNORE, config)
    torch.testing.assert_close(total, ohem_cross_entropy(logits, masks, IGNORE, 0.7, 8))  # 0.25 · 32 pixels


def test_builder_options_and_errors():
    from zoo_core.building import BuildRequest
    from zoo_ppliteseg.model import PPLiteSeg, build_ppliteseg

    model = build("ppliteseg", "t50", 3, loss="ohem_ce", aux_weights=[1, 0.4, 0.4])
    assert isinstance(model, PPLiteSeg) and model.config.loss == "ohem_ce" and model.config.aux_weights == (1.0, 0.4, 0.4)
    with pytest.raises(ValueError, match="loss must be one of"):
        build("ppliteseg", "t50", 3, loss="lovasz")
    with pytest.raises(ValueError, match="unknown PP-LiteSeg setting"):
        build("ppliteseg", "t50", 3, backbone="stdc1")
    config = load_registry()["ppliteseg"].sizes["t50"].config
    with pytest.raises(RegistryError, match="stage_depths"):
        build_ppliteseg(BuildRequest("ppliteseg", "t50", 3, {**config, "stage_depths": [2, 2]}, None))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ the published recipe
def test_the_recipe_is_paddlesegs():
    recipe = get_plugin_manager().training_recipe("ppliteseg", "t50")
    config = TrainConfig.build({"data": "shapes"}, defaults=recipe.config_defaults)
    assert (config.optimizer, config.lr0, config.momentum, config.weight_decay) == ("SGD", 0.005, 0.9, 0.0005)
    assert (config.lr_schedule, config.lr_power, config.lrf, config.warmup_iters, config.ema) == ("poly", 0.9, 0.0, 1000, False)
    model = build("ppliteseg", "t50", 19)
    optimizer = recipe.build_optimizer(model, config, iterations=10, images_per_step=16)
    assert all(group["nesterov"] is False and group["momentum"] == 0.9 for group in optimizer.param_groups)  # Paddle's Momentum
    decayed = sum(parameter.numel() for group in optimizer.param_groups if group["weight_decay"] == 0.0005 for parameter in group["params"])
    assert decayed > 0.99 * sum(p.numel() for p in model.parameters() if p.dim() > 1)  # no decay only on BN and biases
    schedule = recipe.lr_schedule(config, iterations_per_epoch=1000, optimizer=optimizer)
    assert schedule.warmup_iterations == 1000 and schedule.factor(50_000) == pytest.approx(0.5**0.9)
    assert load_registry()["ppliteseg"].sync_bn


# ------------------------------------------------------------------------------ it learns, spawns, draws
def test_t50_overfits_a_fixed_sample_and_draws_its_masks(tmp_path, learning):
    # AdamW 1e-2 with the family's poly decay: a decaying rate lets the BatchNorm running statistics
    # (momentum 0.1) catch up with the weights in 30 steps; no warm-up (the published 1000 iterations are for 160k).
    model, metrics, images = checks.overfit_fixed_sample(
        tmp_path, "ppliteseg-t50", "semantic", images=4, size=64, batch=4, num_classes=5, epochs=30, nbs=4,
        optimizer="AdamW", lr0=0.01, ema=False, warmup_iters=0, seed=learning.seed)
    # The threshold is 80 % of the worst mIoU over seeds and thread counts (benchmarks/learning_margins.py).
    learning.expect(metrics, {"mIoU": 0.55})
    checks.assert_segmenter_draws_its_masks(model, images / "000001.png", 64)


def test_t50_trains_one_epoch_on_two_spawned_cpu_ranks_at_a_rectangle():
    model, result = checks.train_on_two_spawned_cpu_ranks("ppliteseg-t50", num_train=4, num_val=2, metric="mIoU", imgsz=(64, 96))
    assert result.best.is_file() and model.input_size == (64, 96) and model.num_classes == 5
