"""The `unet` family: UNet-S5-D16 + FCN head, its auxiliary head and its segmentation loss.

Covers the heads' shapes, the eval/train output contract of zoo_core/tasks/base.py, the
published parameter count, the pixel cross-entropy's handling of ignore_index, the 0.4 weight
of the auxiliary loss, build options, pickling and seeding, and a short learning run on two
drawn images that must clearly raise pixel accuracy and mIoU.
"""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F

from zoo_core.building import BuildRequest, count_parameters
from zoo_core.errors import RegistryError
from zoo_core.losses.segmentation import pixel_cross_entropy, weighted_pixel_cross_entropy
from zoo_core.nn.fcn_head import FCNHead
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.registry import load_registry

IGNORE = 255
TINY = {"base_channels": 8, "head_channels": 8}  # the published topology at 1/8 width, for speed


def build(num_classes: int = 3, **options):
    return get_plugin_manager().build_model("unet", "s", num_classes, options)


def hand_cross_entropy(logits: torch.Tensor, masks: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean of -log softmax at the labelled pixels, written out without F.cross_entropy."""
    log_probabilities = logits.log_softmax(dim=1)
    labelled = masks != ignore_index
    picked = log_probabilities.gather(1, masks.clamp(0, logits.shape[1] - 1).unsqueeze(1)).squeeze(1)
    return -picked[labelled].mean()


# ------------------------------------------------------------------------------------- heads
def test_fcn_head_output_shapes():
    features = torch.randn(2, 16, 10, 7)
    assert FCNHead(16, 8, 5)(features).shape == (2, 5, 10, 7)
    assert FCNHead(16, 8, 4, num_convs=2, concat_input=True, dropout=0.0)(features).shape == (2, 4, 10, 7)
    assert FCNHead(16, 16, 3, num_convs=0)(features).shape == (2, 3, 10, 7)
    with pytest.raises(ValueError, match="in_channels"):
        FCNHead(16, 8, 3, num_convs=0)
    with pytest.raises(ValueError, match="kernel_size"):
        FCNHead(16, 8, 3, kernel_size=2)


def test_the_published_heads_read_the_full_and_half_resolution_decoder_features():
    with torch.device("meta"):
        model = build(19)
    # FCNHead(in 64, channels 64, 1 conv) on the stride-1 feature, the auxiliary one on stride 2 (128 ch).
    assert model.decode_head.convs[0][0].in_channels == 64
    assert model.aux_head.convs[0][0].in_channels == 128
    assert model.decode_head.classifier.out_channels == model.aux_head.classifier.out_channels == 19
    assert isinstance(model.decode_head.dropout, torch.nn.Dropout2d) and model.decode_head.dropout.p == 0.1
    assert model.loss_weights == {"main": 1.0, "aux": 0.4}


def test_trunk_returns_bottleneck_and_decoder_features_deepest_first():
    model = build(**TINY)
    features = model.backbone(torch.randn(1, 3, 64, 48))
    assert [tuple(f.shape[1:]) for f in features] == [
        (128, 4, 3),
        (64, 8, 6),
        (32, 16, 12),
        (16, 32, 24),
        (8, 64, 48),
    ]
    with torch.device("meta"):
        assert build(19).backbone.out_channels == [1024, 512, 256, 128, 64]


# ------------------------------------------------------------------------------ model contract
def test_eval_forward_gives_logits_at_input_size_and_train_forward_main_and_aux():
    torch.manual_seed(0)
    model = build(3)
    images = torch.randn(2, 3, 64, 64)
    model.eval()
    with torch.no_grad():
        logits = model(images)
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 3, 64, 64)
    model.train()
    outputs = model(images)
    assert set(outputs) == {"main", "aux"}
    assert outputs["main"].shape == (2, 3, 64, 64)
    assert outputs["aux"].shape == (2, 3, 32, 32)  # stride-2 decoder feature; the loss resizes it


@pytest.mark.parametrize(("height", "width"), [(80, 48), (40, 56), (37, 50)])
def test_sides_not_divisible_by_16_still_give_input_sized_logits(height: int, width: int):
    model = build(4, **TINY).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, height, width)).shape == (1, 4, height, width)


def test_inputs_smaller_than_the_deepest_stride_are_rejected():
    model = build(**TINY).eval()
    with pytest.raises(ValueError, match="at least 16"):
        model(torch.randn(1, 3, 8, 64))


def test_parameter_count_is_the_published_inference_count_plus_the_auxiliary_head():
    declared = load_registry()["unet"].sizes["s"].params
    with torch.device("meta"):
        model = build(19)
    auxiliary = count_parameters(model.aux_head)
    assert count_parameters(model) - auxiliary == declared == 28_987_795
    assert auxiliary == 75_091  # 3×3 conv 128→64 + BN + 1×1 classifier 64→19
    assert count_parameters(model) == 29_062_886


def test_declaration_has_sync_bn_off_spawn_on_and_the_published_recipe():
    declaration = load_registry()["unet"]
    assert declaration.sync_bn is False and declaration.spawn is True
    assert get_plugin_manager().hook.default_sync_bn(family="unet") is False
    recipe = declaration.train_defaults
    assert (recipe["optimizer"], recipe["lr0"], recipe["momentum"], recipe["weight_decay"]) == ("SGD", 0.01, 0.9, 0.0005)


# ------------------------------------------------------------------------------------- loss
def test_only_labelled_pixels_make_the_loss():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6, 5)
    masks = torch.full((2, 6, 5), IGNORE)
    labelled = [(0, 1, 1, 2), (0, 4, 3, 0), (1, 2, 2, 3)]  # image, row, column, class
    for image, row, column, label in labelled:
        masks[image, row, column] = label
    expected = -torch.stack(
        [logits[image, :, row, column].log_softmax(0)[label] for image, row, column, label in labelled]
    ).mean()
    assert torch.allclose(pixel_cross_entropy(logits, masks, IGNORE), expected)


def test_logits_at_ignored_pixels_change_neither_loss_nor_gradients():
    torch.manual_seed(0)
    masks = torch.randint(0, 3, (2, 8, 8))
    masks[:, :3] = IGNORE
    ignored = (masks == IGNORE).unsqueeze(1).expand(-1, 3, -1, -1)
    base = torch.randn(2, 3, 8, 8)
    altered = torch.where(ignored, 50 * torch.randn_like(base), base)
    gradients, losses = [], []
    for logits in (base, altered):
        logits = logits.clone().requires_grad_(True)
        loss = pixel_cross_entropy(logits, masks, IGNORE)
        loss.backward()
        losses.append(loss.detach())
        gradients.append(logits.grad)
    assert torch.equal(losses[0], losses[1])
    assert torch.equal(gradients[0], gradients[1])
    assert not gradients[0][ignored].any()


def test_a_batch_without_labelled_pixels_gives_a_zero_loss_not_nan():
    logits = torch.randn(1, 3, 4, 4, requires_grad=True)
    loss = pixel_cross_entropy(logits, torch.full((1, 4, 4), IGNORE), IGNORE)
    loss.backward()
    assert loss.item() == 0.0 and not logits.grad.any()


def test_model_loss_is_main_plus_0_4_auxiliary_cross_entropy_against_the_masks():
    torch.manual_seed(0)
    model = build(3, **TINY)
    masks = torch.randint(0, 3, (2, 16, 16))
    masks[0, :4] = IGNORE
    batch = {"masks": masks, "ignore_index": IGNORE}
    outputs = {"main": torch.randn(2, 3, 16, 16), "aux": torch.randn(2, 3, 8, 8)}
    loss, items = model.loss(outputs, batch)
    auxiliary_at_mask_size = F.interpolate(outputs["aux"], size=(16, 16), mode="bilinear", align_corners=False)
    main = hand_cross_entropy(outputs["main"], masks, IGNORE)
    auxiliary = hand_cross_entropy(auxiliary_at_mask_size, masks, IGNORE)
    assert torch.allclose(loss, main + 0.4 * auxiliary)
    assert torch.allclose(items["main_ce"], main) and torch.allclose(items["aux_ce"], auxiliary)
    # Eval outputs (a logits tensor) are scored by the main head alone.
    eval_loss, eval_items = model.loss(outputs["main"], batch)
    assert torch.allclose(eval_loss, main) and set(eval_items) == {"main_ce"}


def test_the_loss_is_a_pixel_mean_not_scaled_by_the_batch_size():
    torch.manual_seed(0)
    logits = {"main": torch.randn(1, 3, 8, 8), "aux": torch.randn(1, 3, 4, 4)}
    masks = torch.randint(0, 3, (1, 8, 8))
    weights = {"main": 1.0, "aux": 0.4}
    single, _ = weighted_pixel_cross_entropy(logits, masks, IGNORE, weights)
    doubled, _ = weighted_pixel_cross_entropy(
        {name: torch.cat([value, value]) for name, value in logits.items()}, torch.cat([masks, masks]), IGNORE, weights
    )
    assert torch.allclose(single, doubled)


def test_loss_errors_name_what_is_missing():
    model = build(3, **TINY)
    with pytest.raises(ValueError, match="ignore_index"):
        model.loss(torch.randn(1, 3, 4, 4), {"masks": torch.zeros(1, 4, 4, dtype=torch.long)})
    with pytest.raises(ValueError, match="no loss weight for head"):
        weighted_pixel_cross_entropy({"extra": torch.randn(1, 3, 4, 4)}, torch.zeros(1, 4, 4, dtype=torch.long), IGNORE, {"main": 1.0})


# --------------------------------------------------------------------------- build and reuse
def test_options_override_the_declared_config_and_bad_settings_are_named():
    model = build(3, base_channels=8, head_channels=8, aux_weight=1)
    assert model.backbone.out_channels[-1] == 8 and model.loss_weights["aux"] == 1.0
    with pytest.raises(ValueError, match="unknown UNet setting.*depth"):
        build(3, depth=3)
    with pytest.raises(ValueError, match="'base_channels' must be int"):
        build(3, base_channels=True)
    with pytest.raises(ValueError, match="aux_stride"):
        build(3, aux_stride=3)
    from zoo_unet.model import build_unet

    declaration = load_registry()["unet"]
    bad_declaration = BuildRequest("unet", "s", 3, {"width": 64}, declaration)
    with pytest.raises(RegistryError, match="registry config of unet-s"):
        build_unet(bad_declaration)


def test_model_pickles_and_rebuilds_identically_under_a_seed():
    torch.manual_seed(7)
    first = build(3, **TINY)
    torch.manual_seed(7)
    second = build(3, **TINY)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    restored = pickle.loads(pickle.dumps(first)).eval()
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(restored(images), first.eval()(images))


# ------------------------------------------------------------------------------------ learning
def draw_two_scenes(size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Two ImageNet-normalised images with a red square (class 1) and a blue disk (class 2) on a green-grey background."""
    rows, columns = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    scenes = [((8, 8, 28, 28), (44, 44, 12)), ((36, 30, 58, 54), (18, 20, 11))]
    images, masks = [], []
    for (top, left, bottom, right), (centre_row, centre_column, radius) in scenes:
        image = torch.tensor([0.45, 0.55, 0.35]).view(3, 1, 1).expand(3, size, size).clone()
        mask = torch.zeros(size, size, dtype=torch.long)
        square = (rows >= top) & (rows < bottom) & (columns >= left) & (columns < right)
        disk = (rows - centre_row) ** 2 + (columns - centre_column) ** 2 <= radius**2
        for region, colour, label in ((square, (0.9, 0.15, 0.1), 1), (disk, (0.1, 0.2, 0.9), 2)):
            image[:, region] = torch.tensor(colour).view(3, 1)
            mask[region] = label
        images.append(image)
        masks.append(mask)
    pixels = (torch.stack(images) + 0.03 * torch.randn(2, 3, size, size)).clamp(0, 1)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    return (pixels - mean) / std, torch.stack(masks)


def accuracy_and_miou(model: torch.nn.Module, images: torch.Tensor, masks: torch.Tensor, num_classes: int) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        predicted = model(images).argmax(dim=1)
    ious = []
    for label in range(num_classes):
        intersection = ((predicted == label) & (masks == label)).sum().item()
        union = ((predicted == label) | (masks == label)).sum().item()
        ious.append(intersection / union)
    return (predicted == masks).float().mean().item(), sum(ious) / num_classes


def test_unet_s_learns_two_drawn_scenes(learning):
    torch.manual_seed(learning.seed)
    images, masks = draw_two_scenes()
    batch = {"images": images, "masks": masks, "ignore_index": IGNORE}
    model = build(3)
    accuracy_before, miou_before = accuracy_and_miou(model, images, masks, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    model.train()
    for _ in range(25):
        loss, _ = model.loss(model(images), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    accuracy_after, miou_after = accuracy_and_miou(model, images, masks, 3)
    assert miou_before < 0.5, miou_before  # the untrained network does not already segment the scenes
    learning.expect({"loss_drop": losses[0] / losses[-1], "mIoU": miou_after, "accuracy": accuracy_after,
                     "accuracy_gain": accuracy_after - accuracy_before},
                    {"loss_drop": 5.0, "mIoU": 0.7, "accuracy": 0.75, "accuracy_gain": 0.3})
