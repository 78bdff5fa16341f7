"""DEIMv2 (plugins/zoo_deimv2) and the ``zoo_core.detr_vit`` blocks: it learns, trains on two spawned ranks,
draws predictions; its recipe (the matcher switch as an epoch event); LibreYOLO parity of the training loss.

The learning test (``tests/test_detr_core.learns_a_fixed_sample``) trains the smallest size,
DEIMv2-Atto, through ``LibreYOLO.train`` on 2 fixed ``shapes`` scenes (4 objects, 3 classes) at 64 px
(two levels, strides 16 and 32: 20 encoder tokens), 120 steps at batch 2 in 3 epochs (each epoch shows
every scene 40 times, so only 3 checkpoints are written; 80 steps reach mAP50 0.5, these 120 reach 1.0,
mAP50-95 0.8), with 20 matching and 20 denoising queries (build
options; published: 100 / 100), the published optimiser (AdamW, clipping 0.1, the backbone at half
the rate) at a higher base rate (2e-3) and without warm-up, EMA or mosaic, which a short run has no
room for.

The helpers here (``learns_a_fixed_sample``, re-exported, ``spawned_ranks_train_one_epoch``) also
serve tests/test_rfdetr.py and tests/test_ec.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from zoo_core.plugin_manager import get_plugin_manager

from . import family_checks as checks
from .test_detr_core import learns_a_fixed_sample  # noqa: F401  (tests/test_rfdetr.py, tests/test_ec.py import it from here)

pytestmark = pytest.mark.timeout(600)

FAMILY, SMALLEST = "deimv2", "atto"

# one torch thread in every test (the learning test's scores are those of one thread; a test that sets
# its own count gets the caller's back at teardown)
_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)


# ---------------------------------------------------------------------------------------- shared helpers
def spawned_ranks_train_one_epoch(name: str, options: dict, imgsz: int = 64) -> None:
    """One epoch of ``name`` on two spawned CPU ranks returns metrics, and the caller holds rank 0's best weights."""
    from zoo_core.data.shapes import shapes
    from zoo_core.facade import LibreYOLO

    model = LibreYOLO(name, options=options)
    result = model.train(data=shapes(num_train=4, num_val=2, image_size=64, seed=1), device="cpu,cpu", epochs=1, batch=4,
                         imgsz=imgsz, workers=0, nbs=4, plots=False, verbose=False)
    assert result.world_size == 2 and result.epochs_completed == 1
    assert math.isfinite(result.metrics["mAP50-95"])
    best = torch.load(result.best, map_location="cpu", weights_only=True)["model"]
    assert all(torch.equal(best[key], value.to(best[key].dtype)) for key, value in model.model.state_dict().items())


def build(family: str, size: str, num_classes: int = 3, options: dict | None = None, device: str | None = None):
    """``family``-``size`` built through the plugin manager (on ``device``, e.g. ``"meta"``)."""
    if device is None:
        return get_plugin_manager().build_model(family, size, num_classes, options or {})
    with torch.device(device):
        return get_plugin_manager().build_model(family, size, num_classes, options or {})


# ---------------------------------------------------------------------------------------- the family
def test_deimv2_atto_overfits_a_fixed_sample_and_draws_its_predictions(tmp_path, learning):
    # mAP50 0.75 at worst over seeds 0-2 x 1-2 threads (1.0 at the median): the threshold is 80 % of that.
    learns_a_fixed_sample(tmp_path, f"{FAMILY}-{SMALLEST}", learning, steps=120, lr0=2e-3, images=2, batch=2, repeats=40,
                          minimum_map50=0.6)


def test_the_smallest_size_trains_one_epoch_on_two_spawned_cpu_ranks():
    spawned_ranks_train_one_epoch(f"{FAMILY}-{SMALLEST}", {"num_queries": 10, "num_denoising": 10})


# LibreYOLO 1.6's LibreDEIMv2 at 80 classes: parameters, and after its deploy() (what the README/paper count).
LIBREYOLO_COUNTS = {
    "atto": (508_985, 494_159), "femto": (983_945, 962_311), "pico": (1_539_539, 1_514_285), "n": (3_600_421, 3_571_527),
    "s": (9_779_838, 9_707_403), "m": (18_357_750, 18_106_355),
    # L, X: LibreYOLO also counts DINOv3's masked key bias and pretraining mask token (4,992), which timm's DINOv3 lacks
    "l": (32_551_214 - 4_992, 32_178_043 - 4_992), "x": (51_211_736 - 4_992, 50_260_163 - 4_992),
}


@pytest.mark.parametrize("size", list(LIBREYOLO_COUNTS))
def test_counts_equal_libreyolos_trainable_and_deployed_forms(size):
    model = build(FAMILY, size, 80, device="meta")
    trainable, deployed = LIBREYOLO_COUNTS[size]  # LibreYOLO's up/reg_scale are frozen parameters, zoo's buffers
    assert (sum(p.numel() for p in model.parameters()), model.published_parameter_count()) == (trainable - 2, deployed)


def test_the_recipe_is_the_published_one():
    manager = get_plugin_manager()
    atto, small, xl = (manager.training_recipe(FAMILY, size) for size in ("atto", "s", "x"))
    defaults = atto.config_defaults
    assert (defaults["optimizer"], defaults["lr0"], defaults["epochs"], defaults["warmup_iters"], defaults["flat_epochs"]) == ("AdamW", 2e-3, 500, 4000, 250)
    assert (defaults["close_mosaic"], defaults["lrf"], defaults["nbs"], defaults["max_grad_norm"], defaults["ema_decay"]) == (32, 0.5, 128, 0.1, 0.9999)
    assert (small.config_defaults["lr0"], small.config_defaults["epochs"], small.config_defaults["close_mosaic"]) == (5e-4, 132, 12)
    assert xl.config_defaults["weight_decay"] == 1.25e-4
    assert atto.input_size_multiple() == small.input_size_multiple() == 32
    model = build(FAMILY, "s", 3, device="meta")
    scales = {group.lr_scale for group in small.parameter_groups(model, None) if group.params}
    assert scales == {1.0, 0.05}
    vit = {id(p) for p in model.backbone.vit.parameters()}
    assert all(id(p) in vit for group in small.parameter_groups(model, None) if group.lr_scale == 0.05 for p in group.params)


def test_the_matcher_switch_is_an_epoch_event():
    from zoo_core.engine.recipe import RunInfo

    recipe = get_plugin_manager().training_recipe(FAMILY, "s")  # published: epoch 100 of 132
    model = build(FAMILY, SMALLEST, 3, {"num_queries": 10})
    for epochs, epoch, expected in [(132, 99, False), (132, 100, True), (66, 49, False), (66, 50, True)]:
        recipe.on_epoch_start(model, RunInfo(epoch, epochs, 1, 0, 1))
        assert model.criterion.matcher.iou_ordered is expected, (epochs, epoch)
    # the IoU-ordered cost: -p * IoU^4 of the target's class
    from zoo_core.detr.targets import DETRTargets

    targets = DETRTargets.from_lists([torch.tensor([1])], [torch.tensor([[0.5, 0.5, 0.2, 0.2]])])
    logits = torch.tensor([[[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]])
    boxes = torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.5, 0.5, 0.1, 0.2]]])
    cost = model.criterion.matcher.cost_matrix(logits, boxes, targets)[0, :, 0]
    torch.testing.assert_close(cost, torch.tensor([-torch.sigmoid(torch.tensor(2.0)).item(), -0.5 * 0.5**4]))


def test_atto_trains_without_local_losses_and_n_with_the_go_union():
    atto, nano = build(FAMILY, "atto"), build(FAMILY, "n")
    assert (atto.criterion.use_local, atto.criterion.config.go_union) == (False, False)
    assert (nano.criterion.use_local, nano.criterion.config.go_union) == (True, True)
    # Atto: no gateway, one distribution head shared by the three layers
    assert atto.decoder.layers[0].gate is None and atto.decoder.box_heads[0] is atto.decoder.box_heads[2]


def _libreyolo(size: str, num_classes: int = 3):
    import contextlib
    import io

    import libreyolo

    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        wrapper = libreyolo.LibreDEIMv2(None, size=size, nb_classes=num_classes, device="cpu")
    return wrapper.model


def test_training_loss_matches_libreyolo():
    """Same weights, same denoising draws: LibreYOLO's DEIMv2 criterion (Atto recipe, after the matcher switch) = zoo's."""
    pytest.importorskip("libreyolo")
    from libreyolo.models.deimv2.loss import DEIMv2Criterion
    from libreyolo.models.deimv2.matcher import HungarianMatcher

    from tests.oracle_cases import _detr_targets, example_targets
    from zoo_deimv2.convert import from_libreyolo

    theirs = _libreyolo(SMALLEST)
    ours = build(FAMILY, SMALLEST)
    ours.load_state_dict(from_libreyolo(SMALLEST, theirs.state_dict()))
    side = 160
    images = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(1))
    targets = example_targets(side)
    listed = _detr_targets(targets, images)
    matcher = HungarianMatcher(weight_dict={"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0}, alpha=0.25, gamma=2.0,
                               change_matcher=True, iou_order_alpha=4.0, matcher_change_epoch=450)
    criterion = DEIMv2Criterion(matcher=matcher, weight_dict={"loss_mal": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_fgl": 0.15,
                                                              "loss_ddf": 1.5},
                                losses=["mal", "boxes"], alpha=0.75, gamma=1.5, num_classes=3, reg_max=32, use_uni_set=False)
    theirs.train()
    ours.train()
    for epoch in (0, 460):
        ours.criterion.matcher.iou_ordered = epoch >= 450
        torch.manual_seed(7)
        expected = sum(criterion(theirs(images, targets=listed), listed, epoch=epoch).values())
        torch.manual_seed(7)
        loss, _ = ours.loss(ours(images, targets=targets), {"images": images, "targets": targets})
        loss, expected = float(loss.detach()), float(expected.detach())
        assert abs(loss - expected) <= 1e-5 * abs(expected), (epoch, loss, expected)


def test_written_checkpoints_carry_the_buffers_libreyolo_needs():
    """DEIMv2's LibreYOLO loader refuses a file without its cached anchors; zoo writes them as LibreYOLO builds them."""
    pytest.importorskip("libreyolo")
    from zoo_deimv2.convert import to_libreyolo

    theirs = _libreyolo(SMALLEST).state_dict()
    written = to_libreyolo(SMALLEST, build(FAMILY, SMALLEST).state_dict())
    assert set(written) == set(theirs)
    for key in ("decoder.anchors", "decoder.valid_mask", "decoder.decoder.layers.0.cross_attn.num_points_scale"):
        assert torch.equal(written[key], theirs[key]), key


# ---------------------------------------------------------------------------------------- detr_vit blocks
def test_axial_rope_matches_the_hand_computed_angles():
    from zoo_core.detr_vit.rope_vit import AxialRope

    sin, cos = AxialRope(head_dim=8, base=100.0)(2, 3)  # periods 100^(0/4), 100^(2/4) = 1, 10
    y, x = 2 * (1 + 0.5) / 2 - 1, 2 * (2 + 0.5) / 3 - 1  # token (row 1, column 2)
    angles = torch.tensor([y / 1.0, y / 10.0, x / 1.0, x / 10.0]) * 2 * math.pi
    torch.testing.assert_close(sin[5], torch.cat([angles, angles]).sin())
    torch.testing.assert_close(cos[5], torch.cat([angles, angles]).cos())


def test_split_csp_block_is_two_path_csp_with_a_shared_entry():
    from zoo_core.detr_vit.fusion import SplitCSPBlock

    torch.manual_seed(0)
    block = SplitCSPBlock(6, 4, num_blocks=1).eval()
    x = torch.randn(2, 6, 5, 5)
    entry = block.entry(x)
    torch.testing.assert_close(block(x), entry[:, :4] + block.blocks(entry[:, 4:]))


def test_summed_fusion_adds_the_two_maps_it_is_given():
    from zoo_core.detr_vit.fusion import SplitELANBlock

    torch.manual_seed(0)
    summed = SplitELANBlock(4, 4, 8, 2, 1, summed_input=True).eval()
    plain = SplitELANBlock(4, 4, 8, 2, 1).eval()
    plain.load_state_dict(summed.state_dict())
    a, b = torch.randn(1, 4, 6, 6), torch.randn(1, 4, 6, 6)
    torch.testing.assert_close(summed(torch.cat([a, b], 1)), plain(a + b))


def test_the_decoder_embeds_the_query_positions_once():
    model = build(FAMILY, SMALLEST, 3, {"num_queries": 10}).eval()
    calls = []
    model.decoder.query_position.register_forward_hook(lambda *args: calls.append(1))
    model(torch.rand(1, 3, 64, 64))
    assert len(calls) == 1  # three layers, one embedding (D-FINE re-embeds every layer's box)
