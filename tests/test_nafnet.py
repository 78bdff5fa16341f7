"""The NAFNet family: its shared blocks, its losses, its architecture and that it learns to denoise."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
from typing import Iterator

import pytest
import torch
import torch.nn.functional as F

from zoo_core.building import count_parameters
from zoo_core.losses.restoration import charbonnier_loss, per_image_mse, psnr_loss
from zoo_core.nn.gating import SimpleGate, SimplifiedChannelAttention
from zoo_core.nn.norm import LayerNorm2d
from zoo_core.plugin_manager import get_plugin_manager


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Heavy tests use one intra-op thread (the CPUs are shared); the previous setting is restored."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def build(size: str = "s", **options) -> torch.nn.Module:
    return get_plugin_manager().build_model("nafnet", size, options=options)


def smooth_images(count: int, side: int, generator: torch.Generator) -> torch.Tensor:
    """Natural-image-like test content: random colours on a 4×4 grid, bicubically upsampled."""
    coarse = torch.rand(count, 3, 4, 4, generator=generator)
    return F.interpolate(coarse, size=(side, side), mode="bicubic", align_corners=False).clamp(0, 1)


def mean_psnr(prediction: torch.Tensor, target: torch.Tensor) -> float:
    """Mean per-image PSNR in dB (peak 1), computed independently of the loss under test."""
    mse = ((prediction - target) ** 2).mean(dim=(1, 2, 3))
    return float((10 * torch.log10(1.0 / mse)).mean())


# --------------------------------------------------------------------------- LayerNorm2d
def test_layer_norm_2d_equals_layer_norm_over_channels_forward_and_backward():
    torch.manual_seed(0)
    norm = LayerNorm2d(5).double()
    with torch.no_grad():  # non-trivial affine parameters, so their gradients are checked too
        norm.weight.copy_(torch.randn(5))
        norm.bias.copy_(torch.randn(5))
    x = (torch.randn(2, 5, 3, 4, dtype=torch.float64) * 3 + 1).requires_grad_()
    upstream = torch.randn(2, 5, 3, 4, dtype=torch.float64)

    ours = norm(x)
    (ours * upstream).sum().backward()
    ours_grads = [x.grad.clone(), norm.weight.grad.clone(), norm.bias.grad.clone()]

    x_ref = x.detach().clone().requires_grad_()
    weight_ref = norm.weight.detach().clone().requires_grad_()
    bias_ref = norm.bias.detach().clone().requires_grad_()
    reference = F.layer_norm(x_ref.permute(0, 2, 3, 1), (5,), weight_ref, bias_ref, eps=norm.eps).permute(0, 3, 1, 2)
    (reference * upstream).sum().backward()

    torch.testing.assert_close(ours, reference)
    for mine, theirs in zip(ours_grads, [x_ref.grad, weight_ref.grad, bias_ref.grad]):
        torch.testing.assert_close(mine, theirs)


def test_layer_norm_2d_gradients_pass_gradcheck():
    torch.manual_seed(0)
    norm = LayerNorm2d(3).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(3))
        norm.bias.copy_(torch.randn(3))
    x = torch.randn(2, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda inp, w, b: _functional_norm(norm, inp, w, b), (x, norm.weight, norm.bias))


def _functional_norm(norm: LayerNorm2d, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.func.functional_call(norm, {"weight": weight, "bias": bias}, (x,))


def test_layer_norm_2d_rejects_a_tensor_with_the_wrong_channel_count():
    with pytest.raises(ValueError, match=r"LayerNorm2d\(4\) expects an N×4×H×W tensor"):
        LayerNorm2d(4)(torch.zeros(1, 3, 2, 2))


# --------------------------------------------------------------------------- gates
def test_simple_gate_multiplies_the_two_channel_halves():
    x = torch.randn(2, 6, 3, 5)
    gated = SimpleGate()(x)
    assert gated.shape == (2, 3, 3, 5)
    torch.testing.assert_close(gated, x[:, :3] * x[:, 3:])
    with pytest.raises(ValueError, match="even number of channels"):
        SimpleGate()(torch.zeros(1, 5, 2, 2))


def test_simplified_channel_attention_rescales_channels_by_a_linear_map_of_their_means():
    torch.manual_seed(0)
    attention = SimplifiedChannelAttention(4)
    x = torch.randn(2, 4, 5, 7)
    out = attention(x)
    assert out.shape == x.shape
    means = x.mean(dim=(2, 3))  # N×C
    scales = means @ attention.project.weight[:, :, 0, 0].T + attention.project.bias
    torch.testing.assert_close(out, x * scales[:, :, None, None])


# --------------------------------------------------------------------------- architecture
def test_a_fresh_naf_block_is_the_identity_until_its_residual_scales_learn():
    from zoo_nafnet.model import NAFBlock

    torch.manual_seed(0)
    block = NAFBlock(8)
    x = torch.randn(2, 8, 6, 6)
    torch.testing.assert_close(block(x), x)
    with torch.no_grad():
        block.beta.fill_(1.0)
        block.gamma.fill_(1.0)
    changed = block(x)
    assert changed.shape == x.shape and not torch.allclose(changed, x)


@pytest.mark.parametrize(
    ("size", "width", "encoders", "middle", "decoders"),
    [
        ("s", 32, [1, 1, 1, 28], 1, [1, 1, 1, 1]),  # the GoPro deblurring networks (LibreYOLO's s / l)
        ("l", 64, [1, 1, 1, 28], 1, [1, 1, 1, 1]),
        ("s_sidd", 32, [2, 2, 4, 8], 12, [2, 2, 2, 2]),  # the SIDD denoising networks
        ("l_sidd", 64, [2, 2, 4, 8], 12, [2, 2, 2, 2]),
    ],
)
def test_sizes_follow_the_official_configs(size: str, width: int, encoders: list, middle: int, decoders: list):
    with torch.device("meta"):
        model = build(size)
    assert model.intro.out_channels == width
    assert [len(stage) for stage in model.encoders] == encoders
    assert len(model.middle) == middle
    assert [len(stage) for stage in model.decoders] == decoders
    assert model.middle[0].mixer_norm.num_channels == width * 16
    assert not any(isinstance(module, torch.nn.modules.batchnorm._BatchNorm) for module in model.modules())


def test_built_parameter_counts_are_the_published_ones():
    with torch.device("meta"):
        assert count_parameters(build("s_sidd")) == 29_159_715  # published 29.16M
        assert count_parameters(build("l_sidd")) == 115_982_915  # published 115.98M
        assert count_parameters(build("s")) == 17_111_907  # LibreYOLO 1.6's NAFNet s
        assert count_parameters(build("l")) == 67_888_835


@pytest.mark.parametrize(("height", "width"), [(37, 53), (16, 16), (1, 31)])
def test_any_input_size_comes_back_the_same_size(height: int, width: int):
    torch.manual_seed(0)
    model = build("s").eval()
    with torch.no_grad():
        out = model(torch.rand(2, 3, height, width))
    assert out.shape == (2, 3, height, width)
    assert torch.isfinite(out).all()


def test_the_input_is_added_to_the_output_and_the_padding_cropped_away():
    torch.manual_seed(0)
    model = build("s").eval()
    with torch.no_grad():
        model.ending.weight.zero_()
        model.ending.bias.zero_()
        images = torch.rand(1, 3, 37, 53)
        torch.testing.assert_close(model(images), images)


def test_forward_rejects_images_that_are_not_three_channel_batches():
    model = build("s")
    with pytest.raises(ValueError, match=r"N×3×H×W"):
        model(torch.rand(3, 32, 32))


def test_builder_rejects_unknown_options_and_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"'drop_out_rate'.*accepted options: width, .*dropout"):
        build("s", drop_out_rate=0.1)
    with pytest.raises(ValueError, match="unknown NAFNet loss 'l2'"):
        build("s", loss="l2")


def test_build_is_deterministic_under_a_seed_and_the_model_pickles():
    torch.manual_seed(7)
    first = build("s")
    torch.manual_seed(7)
    second = build("s")
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name
    clone = pickle.loads(pickle.dumps(first))
    images = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(clone.eval()(images), first.eval()(images))


def test_declaration_defaults_spawn_on_and_sync_bn_off():
    manager = get_plugin_manager()
    assert manager.supports_spawn("nafnet") is True
    assert manager.default_sync_bn("nafnet") is False
    defaults = manager.family("nafnet").train_defaults
    assert defaults["optimizer"] == "AdamW" and defaults["lr0"] == 1e-3 and defaults["cos_lr"] is True


def test_importing_the_plugin_package_does_not_import_torch(subprocess_env: dict[str, str]):
    code = "import sys, zoo_nafnet; zoo_nafnet.zoo_families(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env, check=True)
    assert result.stdout.strip() == "False"


# --------------------------------------------------------------------------- losses
def test_psnr_loss_is_minus_the_mean_per_image_psnr():
    target = torch.full((2, 3, 4, 4), 0.5)
    prediction = target.clone()
    prediction[0] += 0.1  # MSE 1e-2 -> 20 dB
    prediction[1] -= 0.01  # MSE 1e-4 -> 40 dB
    torch.testing.assert_close(per_image_mse(prediction, target), torch.tensor([1e-2, 1e-4]))
    expected = -(10 * math.log10(1 / (1e-2 + 1e-8)) + 10 * math.log10(1 / (1e-4 + 1e-8))) / 2
    assert psnr_loss(prediction, target).item() == pytest.approx(expected, abs=1e-4)
    assert expected == pytest.approx(-30.0, abs=1e-3)
    # A mean of per-image PSNRs, not the PSNR of the batch MSE (22.97 dB here) ...
    assert psnr_loss(prediction, target).item() != pytest.approx(-10 * math.log10(1 / 5.05e-3), abs=0.5)
    # ... and independent of the batch size: repeating the batch changes nothing.
    doubled = psnr_loss(prediction.repeat(2, 1, 1, 1), target.repeat(2, 1, 1, 1))
    assert doubled.item() == pytest.approx(expected, abs=1e-4)


def test_psnr_loss_stays_finite_on_a_perfect_reconstruction():
    images = torch.rand(2, 3, 4, 4, requires_grad=True)
    loss = psnr_loss(images, images.detach())
    assert loss.item() == pytest.approx(-80.0)
    loss.backward()
    assert torch.isfinite(images.grad).all()


def test_charbonnier_loss_is_the_mean_smooth_l1_penalty():
    target = torch.zeros(2, 1, 2, 2)
    prediction = torch.tensor([0.3, -0.3]).view(2, 1, 1, 1).expand(2, 1, 2, 2)
    assert charbonnier_loss(prediction, target).item() == pytest.approx(math.sqrt(0.09 + 1e-6))
    assert charbonnier_loss(target, target).item() == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="same shape"):
        charbonnier_loss(prediction, torch.zeros(2, 1, 3, 3))


def test_model_loss_is_the_psnr_loss_against_the_targets_or_charbonnier_on_request():
    outputs = torch.rand(2, 3, 8, 8, requires_grad=True)
    batch = {"images": torch.rand(2, 3, 8, 8), "targets": torch.rand(2, 3, 8, 8)}
    with torch.device("meta"):
        psnr_model = build("s")
        charbonnier_model = build("s", loss="charbonnier")
    loss, items = psnr_model.loss(outputs, batch)
    torch.testing.assert_close(loss, psnr_loss(outputs, batch["targets"]))
    assert set(items) == {"psnr_loss"} and not items["psnr_loss"].requires_grad and loss.requires_grad
    loss, items = charbonnier_model.loss(outputs, batch)
    torch.testing.assert_close(loss, charbonnier_loss(outputs, batch["targets"]))
    assert set(items) == {"charbonnier"}


# --------------------------------------------------------------------------- learning
def test_nafnet_s_learns_to_denoise_with_the_published_optimiser(one_thread, learning):
    """Real size-s network, 32×32 crops, AdamW(lr 1e-3, betas 0.9/0.9, wd 0) and the PSNR loss.

    Fresh Gaussian noise (σ = 0.1, about 20 dB) every step, so the network cannot memorise the
    noise; it is scored on images it never saw, with their own noise.
    """
    generator = torch.Generator().manual_seed(learning.seed)
    torch.manual_seed(learning.seed)
    train_clean = smooth_images(8, 32, generator)
    val_clean = smooth_images(4, 32, generator)
    sigma = 0.1
    val_noisy = val_clean + sigma * torch.randn(val_clean.shape, generator=generator)

    model = build("s").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.9), weight_decay=0.0)
    for _ in range(40):
        clean = train_clean[torch.randint(0, len(train_clean), (4,), generator=generator)]
        noisy = clean + sigma * torch.randn(clean.shape, generator=generator)
        loss, _ = model.loss(model(noisy), {"images": noisy, "targets": clean})
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    model.eval()
    with torch.no_grad():
        restored = model(val_noisy)
    noisy_psnr = mean_psnr(val_noisy, val_clean)
    restored_psnr = mean_psnr(restored, val_clean)
    print(f"restored {restored_psnr:.2f} dB vs noisy {noisy_psnr:.2f} dB")
    learning.expect({"psnr_gain_db": restored_psnr - noisy_psnr}, {"psnr_gain_db": 3.0})
