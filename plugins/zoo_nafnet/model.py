"""NAFNet, the nonlinear-activation-free U-Net of "Simple Baselines for Image Restoration".

Chen, Chu, Zhang & Sun, ECCV 2022 (arXiv:2204.04676). The network is a single-stage U-Net:

- a 3×3 convolution lifts the image to ``width`` channels;
- each encoder stage is a stack of NAF blocks followed by a 2×2 stride-2 convolution that halves
  the resolution and doubles the channels;
- a stack of middle blocks runs at the lowest resolution;
- each decoder stage upsamples with a 1×1 convolution to twice the channels and a PixelShuffle(2)
  (half the channels at twice the resolution), adds the encoder feature of that resolution, then
  runs its NAF blocks;
- a 3×3 convolution maps back to 3 channels and the input image is added (global residual), so
  the network predicts the correction to the degraded image.

Inputs of any size work: they are zero-padded on the bottom and right to a multiple of
``2 ** len(encoder_blocks)`` and the output is cropped back.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.building import BuildRequest
from zoo_core.losses.restoration import charbonnier_loss, psnr_loss
from zoo_core.nn.gating import SimpleGate, SimplifiedChannelAttention
from zoo_core.nn.norm import LayerNorm2d

__all__ = ["NAFBlock", "NAFNet", "build_nafnet", "LOSSES"]

LOSSES = ("psnr", "charbonnier")
_ARCHITECTURE_KEYS = ("width", "enc_blk_nums", "middle_blk_num", "dec_blk_nums")
_OPTION_KEYS = ("dw_expand", "ffn_expand", "dropout", "loss")


class NAFBlock(nn.Module):
    """The NAF block: a gated depthwise-convolution mixer and a gated feed-forward branch.

    Mixer: LayerNorm2d → 1×1 conv to ``dw_expand·C`` → 3×3 depthwise conv → SimpleGate (halves the
    channels) → simplified channel attention → 1×1 conv back to C. Feed-forward: LayerNorm2d →
    1×1 conv to ``ffn_expand·C`` → SimpleGate → 1×1 conv back to C. Each branch is added to its
    input scaled by a learnable per-channel factor (``beta``, ``gamma``) that starts at zero, so
    a fresh block is the identity and deep stacks train stably without warm-up.
    """

    def __init__(self, channels: int, dw_expand: int = 2, ffn_expand: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        mixer_channels = channels * dw_expand
        ffn_channels = channels * ffn_expand
        if mixer_channels % 2 or ffn_channels % 2:
            raise ValueError(
                f"SimpleGate halves the channels, so channels·dw_expand ({mixer_channels}) and "
                f"channels·ffn_expand ({ffn_channels}) must be even; use even expansion factors"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        gated_mixer = mixer_channels // 2
        gated_ffn = ffn_channels // 2

        self.mixer_norm = LayerNorm2d(channels)
        self.mixer_expand = nn.Conv2d(channels, mixer_channels, kernel_size=1)
        self.mixer_depthwise = nn.Conv2d(
            mixer_channels, mixer_channels, kernel_size=3, padding=1, groups=mixer_channels
        )
        self.mixer_gate = SimpleGate()
        self.mixer_attention = SimplifiedChannelAttention(gated_mixer)
        self.mixer_project = nn.Conv2d(gated_mixer, channels, kernel_size=1)
        self.mixer_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

        self.ffn_norm = LayerNorm2d(channels)
        self.ffn_expand = nn.Conv2d(channels, ffn_channels, kernel_size=1)
        self.ffn_gate = SimpleGate()
        self.ffn_project = nn.Conv2d(gated_ffn, channels, kernel_size=1)
        self.ffn_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

        self.beta = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.gamma = nn.Parameter(torch.zeros(1, channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (N×C×H×W) refined, same shape."""
        mixed = self.mixer_expand(self.mixer_norm(x))
        mixed = self.mixer_gate(self.mixer_depthwise(mixed))
        mixed = self.mixer_project(self.mixer_attention(mixed))
        x = x + self.beta * self.mixer_dropout(mixed)

        fed = self.ffn_gate(self.ffn_expand(self.ffn_norm(x)))
        fed = self.ffn_project(fed)
        return x + self.gamma * self.ffn_dropout(fed)


def _stack(channels: int, count: int, **block_options: Any) -> nn.Sequential:
    return nn.Sequential(*(NAFBlock(channels, **block_options) for _ in range(count)))


class NAFNet(nn.Module):
    """NAFNet restoration U-Net: ``model(images)`` returns restored images of the input's size.

    ``encoder_blocks[i]`` NAF blocks run at resolution 1/2^i with ``width·2^i`` channels;
    ``middle_blocks`` at the lowest resolution; ``decoder_blocks`` list the decoder stages from
    the lowest resolution up, so ``decoder_blocks[0]`` mirrors ``encoder_blocks[-1]``.
    ``loss(outputs, batch)`` is the family's training loss (``loss_name``: ``"psnr"``, the
    published one, or ``"charbonnier"``).
    """

    def __init__(
        self,
        width: int,
        encoder_blocks: Sequence[int],
        middle_blocks: int,
        decoder_blocks: Sequence[int],
        *,
        image_channels: int = 3,
        dw_expand: int = 2,
        ffn_expand: int = 2,
        dropout: float = 0.0,
        loss_name: str = "psnr",
    ) -> None:
        super().__init__()
        if width <= 0:
            raise ValueError(f"width must be a positive channel count, got {width}")
        if len(encoder_blocks) != len(decoder_blocks):
            raise ValueError(
                f"encoder_blocks {list(encoder_blocks)} and decoder_blocks {list(decoder_blocks)} must have "
                "the same number of stages (one decoder stage per encoder stage)"
            )
        if any(count < 0 for count in (*encoder_blocks, middle_blocks, *decoder_blocks)):
            raise ValueError("block counts must be non-negative")
        if loss_name not in LOSSES:
            raise ValueError(f"unknown NAFNet loss {loss_name!r}; choose one of {', '.join(LOSSES)}")
        block_options = {"dw_expand": dw_expand, "ffn_expand": ffn_expand, "dropout": dropout}
        self.image_channels = image_channels
        self.loss_name = loss_name
        self.size_multiple = 2 ** len(encoder_blocks)

        self.intro = nn.Conv2d(image_channels, width, kernel_size=3, padding=1)
        self.encoders = nn.ModuleList()
        self.downsamples = nn.ModuleList()
        channels = width
        for count in encoder_blocks:
            self.encoders.append(_stack(channels, count, **block_options))
            self.downsamples.append(nn.Conv2d(channels, channels * 2, kernel_size=2, stride=2))
            channels *= 2
        self.middle = _stack(channels, middle_blocks, **block_options)
        self.upsamples = nn.ModuleList()
        self.decoders = nn.ModuleList()
        for count in decoder_blocks:
            # 1×1 conv to 2C then PixelShuffle(2): C/2 channels at twice the resolution.
            self.upsamples.append(
                nn.Sequential(nn.Conv2d(channels, channels * 2, kernel_size=1, bias=False), nn.PixelShuffle(2))
            )
            channels //= 2
            self.decoders.append(_stack(channels, count, **block_options))
        self.ending = nn.Conv2d(width, image_channels, kernel_size=3, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Restore ``images`` (N×3×H×W, any H and W); returns N×3×H×W."""
        if images.dim() != 4 or images.shape[1] != self.image_channels:
            raise ValueError(
                f"NAFNet expects images of shape N×{self.image_channels}×H×W, got {tuple(images.shape)}"
            )
        height, width = images.shape[-2:]
        pad_bottom = -height % self.size_multiple
        pad_right = -width % self.size_multiple
        padded = F.pad(images, (0, pad_right, 0, pad_bottom)) if pad_bottom or pad_right else images

        features = self.intro(padded)
        skips: list[torch.Tensor] = []
        for encoder, downsample in zip(self.encoders, self.downsamples):
            features = encoder(features)
            skips.append(features)
            features = downsample(features)
        features = self.middle(features)
        for upsample, decoder, skip in zip(self.upsamples, self.decoders, reversed(skips)):
            features = decoder(upsample(features) + skip)
        restored = self.ending(features) + padded
        return restored[..., :height, :width]

    def loss(self, outputs: torch.Tensor, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The training loss against ``batch["targets"]``: a mean over images (E6, docs/architecture.md)."""
        targets = batch["targets"]
        if self.loss_name == "psnr":
            value = psnr_loss(outputs, targets)
            return value, {"psnr_loss": value.detach()}
        value = charbonnier_loss(outputs, targets)
        return value, {"charbonnier": value.detach()}


def build_nafnet(request: BuildRequest) -> NAFNet:
    """Build the NAFNet size of ``request`` from its registry ``config``, randomly initialised.

    ``config`` holds the official option names ``width``, ``enc_blk_nums``, ``middle_blk_num`` and
    ``dec_blk_nums``. ``request.options`` may override any of them and set ``dw_expand``,
    ``ffn_expand`` (default 2), ``dropout`` (default 0) or ``loss`` (``"psnr"`` or
    ``"charbonnier"``). ``num_classes`` does not apply to restoration and is ignored.
    """
    unknown = sorted(set(request.options) - set(_ARCHITECTURE_KEYS) - set(_OPTION_KEYS))
    if unknown:
        raise ValueError(
            f"nafnet does not accept option(s) {', '.join(map(repr, unknown))}; accepted options: "
            f"{', '.join(_ARCHITECTURE_KEYS + _OPTION_KEYS)}"
        )
    settings = {**request.config, **request.options}
    missing = [key for key in _ARCHITECTURE_KEYS if key not in settings]
    if missing:
        raise ValueError(
            f"nafnet size {request.size!r}: config lacks {', '.join(missing)}; declare them under "
            f"sizes.{request.size}.config in the registry (docs/registry.md)"
        )
    return NAFNet(
        width=int(settings["width"]),
        encoder_blocks=[int(count) for count in settings["enc_blk_nums"]],
        middle_blocks=int(settings["middle_blk_num"]),
        decoder_blocks=[int(count) for count in settings["dec_blk_nums"]],
        dw_expand=int(settings.get("dw_expand", 2)),
        ffn_expand=int(settings.get("ffn_expand", 2)),
        dropout=float(settings.get("dropout", 0.0)),
        loss_name=str(settings.get("loss", "psnr")),
    )
