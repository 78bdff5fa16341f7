"""UNet-S5-D16 with an FCN decode head and an auxiliary FCN head (the `unet` family).

The network is the one segmentation toolkits train on Cityscapes as "UNet + FCN"
(MMSegmentation, configs/_base_/models/fcn_unet_s5-d16.py): a 5-stage U-Net encoder of
conv-BN-ReLU pairs with 64·2^i channels and 2×2 max-pooling between stages (output stride 16),
a decoder whose every stage upsamples bilinearly, applies a 1×1 conv-BN-ReLU, concatenates the
encoder skip and fuses with two 3×3 conv-BN-ReLU; an FCN head on the full-resolution decoder
feature, and during training a second FCN head on the stride-2 decoder feature whose
cross-entropy counts 0.4 (deep supervision).

Only the builder imports this module, so the plugin's top level stays free of torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.building import BuildRequest
from zoo_core.losses.segmentation import weighted_pixel_cross_entropy
from zoo_core.nn.build_config import config_from_request
from zoo_core.nn.conv import ConvNormAct
from zoo_core.nn.fcn_head import SEGMENTATION_BN_EPS, SEGMENTATION_BN_MOMENTUM, FCNHead
from zoo_core.ops.resize import resize_logits

__all__ = ["UNetConfig", "UNetEncoderDecoder", "UNetSegmenter", "build_unet"]


@dataclass(frozen=True)
class UNetConfig:
    """Architecture and loss settings of one UNet size (the registry's ``config`` mapping).

    The defaults are UNet-S5-D16 + FCN as published; the registry states them explicitly.
    """

    base_channels: int = 64  # width of the first stage; stage i has base_channels·2^i
    num_stages: int = 5  # encoder stages; the deepest feature has stride 2^(num_stages-1)
    encoder_convs: int = 2  # 3×3 conv-BN-ReLU layers per encoder stage
    decoder_convs: int = 2  # 3×3 conv-BN-ReLU layers per decoder stage (after the concat)
    head_channels: int = 64  # hidden width of both FCN heads
    head_convs: int = 1
    head_concat_input: bool = False
    head_dropout: float = 0.1
    aux_stride: int = 2  # output stride of the decoder feature the auxiliary head reads
    aux_weight: float = 0.4  # weight of the auxiliary cross-entropy (the main head's is 1)

    def __post_init__(self) -> None:
        for name in ("base_channels", "num_stages", "encoder_convs", "decoder_convs", "head_channels"):
            if getattr(self, name) < 1:
                raise ValueError(f"UNet {name} must be at least 1, got {getattr(self, name)}")
        if self.num_stages < 2:
            raise ValueError(f"UNet num_stages must be at least 2 (an encoder and a decoder stage), got {self.num_stages}")
        deepest_stride = 2 ** (self.num_stages - 1)
        if self.aux_stride < 1 or self.aux_stride & (self.aux_stride - 1) or self.aux_stride > deepest_stride:
            raise ValueError(
                f"UNet aux_stride must be a power of two from 1 to {deepest_stride} (a decoder output stride), "
                f"got {self.aux_stride}"
            )
        if self.aux_weight < 0:
            raise ValueError(f"UNet aux_weight must be >= 0, got {self.aux_weight}")


def _conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int) -> ConvNormAct:
    return ConvNormAct(
        in_channels,
        out_channels,
        kernel_size,
        activation="relu",
        bn_eps=SEGMENTATION_BN_EPS,
        bn_momentum=SEGMENTATION_BN_MOMENTUM,
    )


def _conv_stack(in_channels: int, out_channels: int, num_convs: int) -> nn.Sequential:
    """``num_convs`` 3×3 conv-BN-ReLU layers, the first changing the width."""
    return nn.Sequential(
        *(_conv_bn_relu(in_channels if index == 0 else out_channels, out_channels, 3) for index in range(num_convs))
    )


class _UpsampleConv(nn.Module):
    """Bilinear upsampling to the skip feature's size, then a 1×1 conv-BN-ReLU (U-Net's "up-conv")."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = _conv_bn_relu(in_channels, out_channels, 1)

    def forward(self, features: torch.Tensor, size: torch.Size) -> torch.Tensor:
        # Interpolating to the skip's size (not a fixed ×2) keeps odd sizes aligned after floor pooling.
        upsampled = F.interpolate(features, size=size, mode="bilinear", align_corners=False)
        return self.conv(upsampled)


class _DecoderStage(nn.Module):
    """Upsample the deeper feature, concatenate the encoder skip, fuse with a conv stack."""

    def __init__(self, in_channels: int, skip_channels: int, out_channels: int, num_convs: int) -> None:
        super().__init__()
        self.upsample = _UpsampleConv(in_channels, skip_channels)
        self.fuse = _conv_stack(2 * skip_channels, out_channels, num_convs)

    def forward(self, deeper: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        upsampled = self.upsample(deeper, skip.shape[-2:])
        return self.fuse(torch.cat([skip, upsampled], dim=1))


class UNetEncoderDecoder(nn.Module):
    """The U-Net trunk: returns the bottleneck and every decoder output, deepest first.

    For ``num_stages=5`` and ``base_channels=64`` the outputs have 1024, 512, 256, 128 and 64
    channels at strides 16, 8, 4, 2 and 1. Any input of at least 2^(num_stages-1) pixels per side
    runs; sides divisible by that stride are pooled without rounding, as published.
    """

    def __init__(self, in_channels: int, base_channels: int, num_stages: int, encoder_convs: int, decoder_convs: int) -> None:
        super().__init__()
        widths = [base_channels * 2**stage for stage in range(num_stages)]
        stages: list[nn.Module] = [_conv_stack(in_channels, widths[0], encoder_convs)]
        for stage in range(1, num_stages):
            stages.append(nn.Sequential(nn.MaxPool2d(kernel_size=2), _conv_stack(widths[stage - 1], widths[stage], encoder_convs)))
        self.encoder = nn.ModuleList(stages)
        self.decoder = nn.ModuleList(
            _DecoderStage(widths[stage], widths[stage - 1], widths[stage - 1], decoder_convs)
            for stage in range(num_stages - 1, 0, -1)
        )
        self.out_channels: list[int] = widths[::-1]
        self.out_strides: list[int] = [2**stage for stage in range(num_stages - 1, -1, -1)]
        self.min_input_size = self.out_strides[0]
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Features [bottleneck, decoder outputs...] from the coarsest to the full resolution."""
        height, width = images.shape[-2:]
        if min(height, width) < self.min_input_size:
            raise ValueError(
                f"UNet needs inputs of at least {self.min_input_size}×{self.min_input_size} pixels "
                f"(it pools {len(self.encoder) - 1} times); got {height}×{width}"
            )
        skips: list[torch.Tensor] = []
        features = images
        for stage in self.encoder:
            features = stage(features)
            skips.append(features)
        outputs = [features]
        for decoder_stage, skip in zip(self.decoder, reversed(skips[:-1])):
            features = decoder_stage(features, skip)
            outputs.append(features)
        return outputs


class UNetSegmenter(nn.Module):
    """UNet trunk + FCN decode head (+ auxiliary FCN head used by the training loss).

    ``eval()``: ``model(images)`` returns logits N×num_classes×H×W at the input size.
    ``train()``: it returns ``{"main": those logits, "aux": auxiliary logits at stride
    ``aux_stride``}``, and ``loss(outputs, batch)`` is the pixel cross-entropy of the main head
    plus ``aux_weight`` times that of the auxiliary head (resized to the masks), both means over
    the pixels whose mask is not ``batch["ignore_index"]``.
    """

    def __init__(self, num_classes: int, config: UNetConfig | None = None, in_channels: int = 3) -> None:
        super().__init__()
        config = config or UNetConfig()
        self.config = config
        self.num_classes = num_classes
        self.backbone = UNetEncoderDecoder(
            in_channels, config.base_channels, config.num_stages, config.encoder_convs, config.decoder_convs
        )
        head_settings = dict(
            num_convs=config.head_convs, concat_input=config.head_concat_input, dropout=config.head_dropout
        )
        self.decode_head = FCNHead(self.backbone.out_channels[-1], config.head_channels, num_classes, **head_settings)
        self._aux_index = self.backbone.out_strides.index(config.aux_stride)
        self.aux_head = FCNHead(
            self.backbone.out_channels[self._aux_index], config.head_channels, num_classes, **head_settings
        )
        self.loss_weights = {"main": 1.0, "aux": config.aux_weight}

    def forward(self, images: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """Logits at the input size (eval), or ``{"main", "aux"}`` logits (train)."""
        features = self.backbone(images)
        logits = resize_logits(self.decode_head(features[-1]), images.shape[-2:])
        if not self.training:
            return logits
        return {"main": logits, "aux": self.aux_head(features[self._aux_index])}

    def loss(
        self, outputs: torch.Tensor | Mapping[str, torch.Tensor], batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Weighted pixel cross-entropy of the heads in ``outputs`` against ``batch["masks"]``.

        Eval-mode outputs (a plain logits tensor) give the main head's loss alone.
        """
        for key in ("masks", "ignore_index"):
            if key not in batch:
                raise ValueError(f"a semantic batch needs {key!r} (zoo_core/tasks/base.py); got keys {', '.join(batch)}")
        heads = {"main": outputs} if isinstance(outputs, torch.Tensor) else outputs
        return weighted_pixel_cross_entropy(heads, batch["masks"], int(batch["ignore_index"]), self.loss_weights)


def build_unet(request: BuildRequest) -> UNetSegmenter:
    """The `unet` builder: ``request.config`` (registry) overridden by ``request.options`` (caller).

    Both may set any ``UNetConfig`` field; anything else raises a ValueError naming it
    (a ``RegistryError`` when the declaration is at fault).
    """
    return UNetSegmenter(request.num_classes, config_from_request(UNetConfig, request, what="UNet"))
