"""PP-LiteSeg: an STDC backbone, a simple pyramid pooling context and attention-fusion decoder (the `ppliteseg` family).

Peng et al., "PP-LiteSeg: A Superior Real-Time Semantic Segmentation Model" (arXiv:2204.02681).

- Backbone: STDC1 (size t) or STDC2 (size b) of Fan et al. (CVPR 2021): two strided 3×3
  conv-BN-ReLU layers (32 and 64 channels) and three stages of Short-Term Dense Concatenate
  modules (256, 512 and 1024 channels at strides 8, 16 and 32). A module reduces its input to
  half its output width with a 1×1 conv and runs three 3×3 convs of decreasing width (1/4, 1/8,
  1/8 of the output); its output concatenates the reduced input and the three conv outputs. The
  first module of a stage downsamples: a depthwise strided 3×3 conv-BN before the convs, and a
  3×3 average pool on the reduced input's path.
- Lateral 3×3 conv-BN-ReLU projections of the stride 8/16/32 features (decoder widths).
- SPPM (simple pyramid pooling module) on the stride-32 feature: average pools to 1×1, 2×2 and
  4×4 bins, a 1×1 conv-BN-ReLU each, upsampled and *summed*, then a 3×3 conv-BN-ReLU.
- Flexible lightweight decoder of UAFMs (unified attention fusion modules) from stride 32 to 8:
  the deeper feature is upsampled to the lateral feature's size; a spatial attention map
  ``alpha = sigmoid(conv(conv([mean_c(up), max_c(up), mean_c(lat), max_c(lat)])))`` mixes them as
  ``up·alpha + lat·(1 − alpha)``, then a 3×3 conv-BN-ReLU sets the stage's width.
- Segmentation head on the stride-8 decoder output (3×3 conv-BN-ReLU, dropout, bias-free 1×1
  classifier) and, for training only, the same head on each lateral projection.

The four sizes are two networks: ``t50``/``t75`` share STDC1 and ``b50``/``b75`` STDC2; 50 and 75
are the published evaluation scales (512×1024 and 768×1536 on Cityscapes). Layer widths and the
auxiliary heads follow LibreYOLO 1.6.0, whose implementation (ported from SuperGradients) is
what its checkpoints were trained with.

Only the builder imports this module, so the plugin's top level stays free of torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.building import BuildRequest
from zoo_core.nn.build_config import config_from_request
from zoo_core.nn.conv import ConvNormAct
from zoo_core.nn.fcn_head import SEGMENTATION_BN_EPS, SEGMENTATION_BN_MOMENTUM
from zoo_core.ops.resize import resize_logits

__all__ = ["PPLiteSegConfig", "STDCNet", "PPLiteSeg", "build_ppliteseg", "AUX_HEAD_NAMES"]

AUX_HEAD_NAMES = ("aux8", "aux16", "aux32")  # training outputs of the auxiliary heads, by stride
LOSSES = ("dice_ce_edge", "ohem_ce")


@dataclass(frozen=True)
class PPLiteSegConfig:
    """Architecture and loss settings of one PP-LiteSeg size (the registry's ``config``); defaults are PP-LiteSeg-T."""

    stem_widths: tuple[int, ...] = (32, 64)  # the two strided conv layers (strides 2 and 4)
    stage_widths: tuple[int, ...] = (256, 512, 1024)  # STDC stages at strides 8, 16, 32
    stage_depths: tuple[int, ...] = (2, 2, 2)  # STDC modules per stage: STDC1 (2, 2, 2), STDC2 (4, 5, 3)
    lateral_channels: tuple[int, ...] = (64, 128, 128)  # projections of the stride 8/16/32 features
    decoder_channels: tuple[int, ...] = (128, 64, 32)  # UAFM outputs at strides 32, 16, 8
    context_channels: int = 128  # SPPM branch and output width
    context_bins: tuple[int, ...] = (1, 2, 4)
    head_channels: int = 32  # hidden width of the main head
    aux_head_channels: tuple[int, ...] = (32, 64, 64)  # hidden widths of the stride 8/16/32 auxiliary heads
    head_dropout: float = 0.0
    # Loss: "dice_ce_edge" (LibreYOLO/SuperGradients recipe, the one its checkpoints were trained
    # with) or "ohem_ce" (PaddleSeg's published recipe: online hard example mining cross-entropy).
    loss: str = "dice_ce_edge"
    aux_weights: tuple[float, ...] = (1.0, 1.0, 1.0)  # auxiliary heads' weights (the main head's is 1)
    dice_weight: float = 1.0
    ce_weight: float = 1.0
    edge_ce_weights: tuple[float, ...] = (0.5, 0.5)  # (all pixels, edge pixels) inside the CE term
    edge_kernel: int = 5  # window of the label-edge map (odd)
    ohem_thresh: float = 0.7  # pixels whose true-class probability is below this are hard
    ohem_min_kept_ratio: float = 0.0625  # keep at least this fraction of the batch's pixels (PaddleSeg: 1/16)

    def __post_init__(self) -> None:
        sequences = {
            "stem_widths": 2,
            "stage_widths": 3,
            "stage_depths": 3,
            "lateral_channels": 3,
            "decoder_channels": 3,
            "aux_head_channels": 3,
            "aux_weights": 3,
            "edge_ce_weights": 2,
        }
        for field, length in sequences.items():
            values = getattr(self, field)
            smallest = 0 if field in ("aux_weights", "edge_ce_weights") else 1
            if len(values) != length or min(values) < smallest:
                raise ValueError(f"PP-LiteSeg {field} needs {length} values of at least {smallest}, got {values!r}")
        if not self.context_bins or min(self.context_bins) < 1:
            raise ValueError(f"PP-LiteSeg context_bins must be positive ints, got {self.context_bins!r}")
        for width in self.stage_widths:
            if width % 8:
                raise ValueError(
                    f"PP-LiteSeg stage_widths must be multiples of 8 (an STDC module splits by 2, 4, 8), got {width}"
                )
        if self.loss not in LOSSES:
            raise ValueError(f"PP-LiteSeg loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.edge_kernel < 1 or self.edge_kernel % 2 == 0:
            raise ValueError(f"PP-LiteSeg edge_kernel must be a positive odd int, got {self.edge_kernel}")
        if not 0.0 <= self.head_dropout < 1.0:
            raise ValueError(f"PP-LiteSeg head_dropout must be in [0, 1), got {self.head_dropout}")
        if not 0.0 <= self.ohem_min_kept_ratio <= 1.0:
            raise ValueError(f"PP-LiteSeg ohem_min_kept_ratio must be in [0, 1], got {self.ohem_min_kept_ratio}")


def _conv(
    in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, *, groups: int = 1, relu: bool = True
) -> ConvNormAct:
    """Bias-free conv → BatchNorm (PyTorch defaults) → ReLU (or nothing)."""
    return ConvNormAct(
        in_channels,
        out_channels,
        kernel_size,
        stride,
        groups=groups,
        activation="relu" if relu else None,
        bn_eps=SEGMENTATION_BN_EPS,
        bn_momentum=SEGMENTATION_BN_MOMENTUM,
    )


class STDCModule(nn.Module):
    """Short-Term Dense Concatenate module with four steps (widths out/2, out/4, out/8, out/8)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        half = out_channels // 2
        self.reduce = _conv(in_channels, half, 1)
        self.down = _conv(half, half, 3, 2, groups=half, relu=False) if stride == 2 else None
        self.pool = nn.AvgPool2d(3, stride=2, padding=1) if stride == 2 else None
        widths = (half, out_channels // 4, out_channels // 8, out_channels // 8)
        self.branches = nn.ModuleList(_conv(widths[step], widths[step + 1], 3) for step in range(3))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        reduced = self.reduce(features)
        parts = [reduced if self.pool is None else self.pool(reduced)]
        current = reduced if self.down is None else self.down(reduced)
        for branch in self.branches:
            current = branch(current)
            parts.append(current)
        return torch.cat(parts, dim=1)


class STDCNet(nn.Module):
    """STDC backbone: returns the stride 8, 16 and 32 features (``out_channels`` = ``stage_widths``)."""

    def __init__(
        self,
        stem_widths: tuple[int, ...],
        stage_widths: tuple[int, ...],
        stage_depths: tuple[int, ...],
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        stages: list[nn.Module] = []
        for width in stem_widths:
            stages.append(nn.Sequential(_conv(in_channels, width, 3, 2)))
            in_channels = width
        for width, depth in zip(stage_widths, stage_depths):
            # The first module of a stage downsamples (stride 2) and changes the width.
            modules = [STDCModule(in_channels, width, 2)] + [STDCModule(width, width, 1) for _ in range(depth - 1)]
            stages.append(nn.Sequential(*modules))
            in_channels = width
        self.stages = nn.ModuleList(stages)
        self.num_outputs = len(stage_widths)
        self.out_channels = tuple(stage_widths)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        outputs = []
        features = images
        for stage in self.stages:
            features = stage(features)
            outputs.append(features)
        return outputs[-self.num_outputs :]


class PyramidPoolingContext(nn.Module):
    """SPPM: average pools to ``bins``×``bins``, 1×1 conv each, upsample, sum, 3×3 conv."""

    def __init__(self, in_channels: int, channels: int, bins: tuple[int, ...]) -> None:
        super().__init__()
        self.bins = tuple(bins)
        self.branches = nn.ModuleList(_conv(in_channels, channels, 1) for _ in self.bins)
        self.fuse = _conv(channels, channels, 3)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        size = features.shape[-2:]
        total = None
        for bins, branch in zip(self.bins, self.branches):
            pooled = resize_logits(branch(F.adaptive_avg_pool2d(features, bins)), size)
            total = pooled if total is None else total + pooled
        return self.fuse(total)


class AttentionFusion(nn.Module):
    """UAFM with spatial attention: fuse an upsampled deep feature with a lateral one."""

    def __init__(self, in_channels: int, lateral_channels: int, out_channels: int) -> None:
        super().__init__()
        self.lateral_proj = _conv(lateral_channels, in_channels, 3) if lateral_channels != in_channels else nn.Identity()
        self.attention = nn.Sequential(_conv(4, 2, 3), _conv(2, 1, 3, relu=False))
        self.out = _conv(in_channels, out_channels, 3)

    def forward(self, deep: torch.Tensor, lateral: torch.Tensor) -> torch.Tensor:
        lateral = self.lateral_proj(lateral)
        deep = resize_logits(deep, lateral.shape[-2:])
        statistics = torch.cat(
            [
                deep.mean(1, keepdim=True),
                deep.amax(1, keepdim=True),
                lateral.mean(1, keepdim=True),
                lateral.amax(1, keepdim=True),
            ],
            dim=1,
        )
        alpha = torch.sigmoid(self.attention(statistics))
        return self.out(deep * alpha + lateral * (1 - alpha))


class SegmentationHead(nn.Module):
    """3×3 conv-BN-ReLU, dropout, bias-free 1×1 classifier."""

    def __init__(self, in_channels: int, channels: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.conv = _conv(in_channels, channels, 3)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Conv2d(channels, num_classes, 1, bias=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.conv(features)))


class PPLiteSeg(nn.Module):
    """STDC backbone + lateral projections + SPPM + UAFM decoder + heads.

    Input: ImageNet-normalised images N×3×H×W. Multiples of 32 are exact (every stride divides
    them); other sizes run too, each decoder stage resizing the deeper map to the lateral one.
    ``eval()``: ``model(images)`` returns logits N×num_classes×H×W (bilinear from stride 8).
    ``train()``: it returns ``{"main": stride-8 logits, "aux8", "aux16", "aux32": auxiliary
    logits at their strides}``; ``loss`` resizes every head to the masks.
    """

    def __init__(self, num_classes: int, config: PPLiteSegConfig | None = None, in_channels: int = 3) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        config = config or PPLiteSegConfig()
        self.config = config
        self.num_classes = num_classes
        self.backbone = STDCNet(config.stem_widths, config.stage_widths, config.stage_depths, in_channels)
        self.laterals = nn.ModuleList(
            _conv(width, channels, 3) for width, channels in zip(config.stage_widths, config.lateral_channels)
        )
        self.context = PyramidPoolingContext(config.stage_widths[-1], config.context_channels, config.context_bins)
        fusions = []
        deep = config.context_channels
        for lateral, out in zip(reversed(config.lateral_channels), config.decoder_channels):
            fusions.append(AttentionFusion(deep, lateral, out))
            deep = out
        self.decoder = nn.ModuleList(fusions)
        self.head = SegmentationHead(deep, config.head_channels, num_classes, config.head_dropout)
        self.aux_heads = nn.ModuleList(
            SegmentationHead(lateral, hidden, num_classes, config.head_dropout)
            for lateral, hidden in zip(config.lateral_channels, config.aux_head_channels)
        )
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        height, width = images.shape[-2:]
        features = self.backbone(images)
        laterals = [lateral(feature) for lateral, feature in zip(self.laterals, features)]
        decoded = self.context(features[-1])
        for fusion, lateral in zip(self.decoder, reversed(laterals)):
            decoded = fusion(decoded, lateral)
        logits = self.head(decoded)
        if not self.training:
            return resize_logits(logits, (height, width))
        outputs = {"main": logits}
        for name, head, lateral in zip(AUX_HEAD_NAMES, self.aux_heads, laterals):
            outputs[name] = head(lateral)
        return outputs

    def published_parameter_count(self) -> int:
        """Parameters of the inference network: the training-only auxiliary heads left out (works on the meta device)."""
        auxiliary = {id(parameter) for parameter in self.aux_heads.parameters()}
        return sum(parameter.numel() for parameter in self.parameters() if id(parameter) not in auxiliary)

    def loss(
        self, outputs: torch.Tensor | Mapping[str, torch.Tensor], batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The configured loss over the heads in ``outputs`` (the main head alone for eval outputs); see ``loss.py``."""
        from zoo_ppliteseg.loss import ppliteseg_loss

        for key in ("masks", "ignore_index"):
            if key not in batch:
                raise ValueError(f"a semantic batch needs {key!r} (zoo_core/tasks/base.py); got keys {', '.join(batch)}")
        heads = {"main": outputs} if isinstance(outputs, torch.Tensor) else outputs
        return ppliteseg_loss(heads, batch["masks"], int(batch["ignore_index"]), self.config)


def build_ppliteseg(request: BuildRequest) -> PPLiteSeg:
    """The `ppliteseg` builder: ``request.config`` (registry) overridden by ``request.options`` (caller).

    Both may set any ``PPLiteSegConfig`` field; anything else raises a ValueError naming it
    (a ``RegistryError`` when the declaration is at fault).
    """
    return PPLiteSeg(request.num_classes, config_from_request(PPLiteSegConfig, request, what="PP-LiteSeg"))
