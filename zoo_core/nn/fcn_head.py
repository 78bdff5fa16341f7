"""The FCN decode head: a few conv-BN-ReLU layers and a 1×1 classifier over one feature map.

This is the head of Long et al.'s fully convolutional networks as segmentation toolkits use it
on top of any backbone (MMSegmentation's ``FCNHead``): ``num_convs`` 3×3 conv-BN-ReLU layers,
optionally the input concatenated back and fused by one more conv, channel dropout, and a biased
1×1 convolution to per-class logits. It is used both as the main decode head and as the
auxiliary head that supervises an intermediate feature during training.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo_core.nn.conv import ConvNormAct

__all__ = ["FCNHead", "SEGMENTATION_BN_EPS", "SEGMENTATION_BN_MOMENTUM"]

# Segmentation models in this family of designs use PyTorch's BatchNorm defaults (MMSegmentation's
# BN/SyncBN), not the YOLO-style eps=1e-3 / momentum=0.03 that ConvNormAct defaults to.
SEGMENTATION_BN_EPS = 1e-5
SEGMENTATION_BN_MOMENTUM = 0.1


class FCNHead(nn.Module):
    """Per-pixel class logits from one feature map, at that feature map's resolution.

    Args:
        in_channels: channels of the input feature map.
        channels: width of the hidden conv layers.
        num_classes: number of output logits per pixel.
        num_convs: hidden conv-BN-ReLU layers; 0 means the classifier reads the input directly
            (then ``in_channels`` must equal ``channels``).
        kernel_size: kernel of the hidden convs (odd, "same" padding).
        dilation: dilation of the hidden convs.
        concat_input: concatenate the input with the hidden result and fuse them with one more
            conv-BN-ReLU before the classifier.
        dropout: ``Dropout2d`` probability before the classifier (0 disables it).
    """

    def __init__(
        self,
        in_channels: int,
        channels: int,
        num_classes: int,
        *,
        num_convs: int = 1,
        kernel_size: int = 3,
        dilation: int = 1,
        concat_input: bool = False,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        if num_convs < 0:
            raise ValueError(f"num_convs must be 0 or more, got {num_convs}")
        if num_convs == 0 and in_channels != channels:
            raise ValueError(
                f"num_convs=0 feeds the input straight to the classifier, so in_channels ({in_channels}) "
                f"must equal channels ({channels}); set channels={in_channels} or num_convs >= 1"
            )
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd to keep the resolution, got {kernel_size}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if concat_input and num_convs == 0:
            raise ValueError("concat_input=True needs num_convs >= 1 (there is nothing to concatenate with)")

        def hidden_conv(conv_in: int) -> ConvNormAct:
            return ConvNormAct(
                conv_in,
                channels,
                kernel_size,
                dilation=dilation,
                activation="relu",
                bn_eps=SEGMENTATION_BN_EPS,
                bn_momentum=SEGMENTATION_BN_MOMENTUM,
            )

        self.convs = nn.Sequential(*(hidden_conv(in_channels if index == 0 else channels) for index in range(num_convs)))
        self.fuse = hidden_conv(in_channels + channels) if concat_input else None
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.classifier = nn.Conv2d(channels, num_classes, kernel_size=1)
        self.num_classes = num_classes
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He-normal (fan-out) hidden convs, as for ReLU nets; a small normal classifier with zero bias."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d) and module is not self.classifier:
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        # Small initial logits keep the first losses near log(num_classes) whatever the width.
        nn.init.normal_(self.classifier.weight, std=0.01)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Logits N×num_classes×H×W for features N×in_channels×H×W."""
        hidden = self.convs(features)
        if self.fuse is not None:
            hidden = self.fuse(torch.cat([features, hidden], dim=1))
        return self.classifier(self.dropout(hidden))
