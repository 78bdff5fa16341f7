"""PP-PicoDet (Yu et al., arXiv:2111.00902, 2021): a mobile detector of ESNet, CSP-PAN and a GFL-style head.

This is the paper's model (PaddleDetection's "legacy" PicoDet of 2021.10, the one LibreYOLO 1.6.0
ports through Bo396543018/Picodet_Pytorch), not the 2022 "PP-PicoDet v2" (TAL head, LCPAN).

- **ESNet** (Enhanced ShuffleNet): a 3×3 stride-2 stem and a 3×3 stride-2 max-pool, then three
  stages of 3 / 7 / 3 blocks. A stage opens with a two-branch stride-2 block (depthwise + linear
  1×1 on one side; 1×1, depthwise, squeeze-excite, 1×1 on the other; concatenated and mixed by a
  depthwise 3×3 and a 1×1); the other blocks split the channels in half, transform one half
  (1×1, depthwise whose output is concatenated with its input ("ghost" features), SE, 1×1) and
  shuffle the halves back together. The searched per-block ``channel_ratios`` set the inner widths.
  Outputs: the three stage ends (strides 8, 16, 32).
- **CSP-PAN**: 1×1 convs bring the three maps to one width; a top-down and a bottom-up path of
  CSP layers whose bottlenecks use 5×5 depthwise-separable convs; a fourth map (stride 64) is the
  sum of stride-2 depthwise-separable convs of the deepest input and the deepest output.
- **head** per level: ``head_convs`` 5×5 depthwise-separable convs, then one 1×1 conv giving the
  class logits and 4 × 8 distance-bin logits (``reg_max`` 7) at once (``share_cls_reg``).

Activations are hard-swish; the SE gate is ReLU then ``clip((x + 3) / 6, 0, 6)`` (the upper bound
6 is Bo's/LibreYOLO's mmcv HSigmoid setting); BatchNorms use PyTorch's defaults (eps 1e-5,
momentum 0.1, i.e. Paddle's 0.9). Input: RGB in [0, 1], normalised with ImageNet's mean and std
inside the model (PaddleDetection's NormalizeImage).

Loss (``loss.PicoDetLoss``): SimOTA assignment (zoo_core.assigners.simota), varifocal loss, GIoU
and DFL with weights 1.0 / 2.0 / 0.25.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.building import BuildRequest
from zoo_core.nn.conv import ConvNormAct
from zoo_core.nn.detection_head import make_anchor_points
from zoo_core.ops.dense_postprocess import DenseDetectionPostprocess, DenseNMSDefaults
from zoo_picodet.loss import PicoDetLoss

__all__ = [
    "PicoDetSpec",
    "DepthwiseSeparable",
    "SqueezeExcite",
    "ShuffleBlock",
    "ShuffleDownBlock",
    "ESNet",
    "CSPPAN",
    "PicoHead",
    "PicoDet",
    "build_picodet",
    "decode_picodet",
]

STRIDES = (8, 16, 32, 64)
REG_BINS = 8  # reg_max 7
STAGE_REPEATS = (3, 7, 3)
STEM_CHANNELS = 24
NECK_KERNEL = 5
CLASS_PRIOR = 0.01
PIXEL_MEAN = (123.675, 116.28, 103.53)  # ImageNet's, in 0-255 units (LibreYOLO / mmdet form)
PIXEL_STD = (58.395, 57.12, 57.375)
PRE_NMS_TOP_K = 1000  # PaddleDetection MultiClassNMS nms_top_k; LibreYOLO 1.6 applies it to each level
BN_EPS, BN_MOMENTUM = 1e-5, 0.1


def _make_divisible(value: float, divisor: int) -> int:
    """Channel rounding: nearest multiple of ``divisor``, never below 90 % of ``value``."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv(
    in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1, *, groups: int = 1, act: bool = True
) -> ConvNormAct:
    return ConvNormAct(
        in_channels,
        out_channels,
        kernel_size,
        stride,
        groups=groups,
        activation="hardswish" if act else None,
        bn_eps=BN_EPS,
        bn_momentum=BN_MOMENTUM,
    )


@dataclass(frozen=True)
class PicoDetSpec:
    """One PicoDet size (the ``config`` of its registry entry): ESNet ``scale`` and per-block
    ``channel_ratios`` (13), CSP-PAN width ``neck_channels``, ``head_convs`` per head tower."""

    scale: float
    channel_ratios: tuple[float, ...]
    neck_channels: int
    head_convs: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str = "picodet config") -> "PicoDetSpec":
        """Validate a registry ``config`` mapping; errors name the key and the expected form."""
        expected = set(cls.__dataclass_fields__)
        unknown, missing = set(config) - expected, expected - set(config)
        if unknown or missing:
            raise ValueError(
                f"{where}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}; expected exactly {sorted(expected)}"
            )
        ratios = config["channel_ratios"]
        if not isinstance(ratios, (list, tuple)) or len(ratios) != sum(STAGE_REPEATS) or any(
            not isinstance(r, (int, float)) or r <= 0 for r in ratios
        ):
            raise ValueError(f"{where}: 'channel_ratios' must be {sum(STAGE_REPEATS)} positive numbers, got {ratios!r}")
        for key in ("neck_channels", "head_convs"):
            if not isinstance(config[key], int) or config[key] < 1:
                raise ValueError(f"{where}: '{key}' must be a positive integer, got {config[key]!r}")
        if not isinstance(config["scale"], (int, float)) or config["scale"] <= 0:
            raise ValueError(f"{where}: 'scale' must be a positive number, got {config['scale']!r}")
        return cls(float(config["scale"]), tuple(float(r) for r in ratios), config["neck_channels"], config["head_convs"])


class DepthwiseSeparable(nn.Module):
    """``k×k`` depthwise conv-BN-act then 1×1 conv-BN-act (both activated, as mmcv's module)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = NECK_KERNEL, stride: int = 1) -> None:
        super().__init__()
        self.depthwise = _conv(in_channels, in_channels, kernel_size, stride, groups=in_channels)
        self.pointwise = _conv(in_channels, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


class SqueezeExcite(nn.Module):
    """Channel gate: global average, 1×1 to a quarter (ReLU), 1×1 back, ``clip((x + 3) / 6, 0, 6)``."""

    def __init__(self, channels: int, ratio: int = 4) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, channels // ratio, 1)
        self.restore = nn.Conv2d(channels // ratio, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.relu(self.reduce(F.adaptive_avg_pool2d(x, 1)))
        gate = ((self.restore(gate) + 3.0) / 6.0).clamp(0.0, 6.0)
        return x * gate


def _shuffle_halves(x: torch.Tensor) -> torch.Tensor:
    """ShuffleNet's channel shuffle with two groups: interleave the two halves."""
    batch, channels, height, width = x.shape
    return x.view(batch, 2, channels // 2, height, width).transpose(1, 2).reshape(batch, channels, height, width)


class ShuffleBlock(nn.Module):
    """ESNet stride-1 block: keep one half, transform the other (1×1, depthwise ghost features, SE, 1×1), shuffle."""

    def __init__(self, channels: int, inner: int) -> None:
        super().__init__()
        half_inner = inner // 2
        self.expand = _conv(channels // 2, half_inner)
        self.depthwise = _conv(half_inner, half_inner, 3, groups=half_inner, act=False)
        self.se = SqueezeExcite(inner)
        self.project = _conv(inner, channels // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept, changed = x.chunk(2, dim=1)
        changed = self.expand(changed)
        changed = self.project(self.se(torch.cat((changed, self.depthwise(changed)), dim=1)))
        return _shuffle_halves(torch.cat((kept, changed), dim=1))


class ShuffleDownBlock(nn.Module):
    """ESNet stride-2 block: a depthwise + 1×1 shortcut branch and a 1×1, depthwise, SE, 1×1 branch,
    concatenated and mixed by a depthwise 3×3 and a 1×1."""

    def __init__(self, in_channels: int, out_channels: int, inner: int) -> None:
        super().__init__()
        half_inner, half_out = inner // 2, out_channels // 2
        self.shortcut_depthwise = _conv(in_channels, in_channels, 3, 2, groups=in_channels, act=False)
        self.shortcut_project = _conv(in_channels, half_out)
        self.expand = _conv(in_channels, half_inner)
        self.depthwise = _conv(half_inner, half_inner, 3, 2, groups=half_inner, act=False)
        self.se = SqueezeExcite(half_inner)
        self.project = _conv(half_inner, half_out)
        self.mix_depthwise = _conv(out_channels, out_channels, 3, groups=out_channels)
        self.mix_pointwise = _conv(out_channels, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = self.shortcut_project(self.shortcut_depthwise(x))
        branch = self.project(self.se(self.depthwise(self.expand(x))))
        return self.mix_pointwise(self.mix_depthwise(torch.cat((shortcut, branch), dim=1)))


class ESNet(nn.Module):
    """Enhanced ShuffleNet backbone; returns the stride 8, 16, 32 stage outputs."""

    def __init__(self, scale: float, channel_ratios: Sequence[float]) -> None:
        super().__init__()
        widths = [STEM_CHANNELS] + [_make_divisible(base * scale, 16) for base in (128, 256, 512)]
        self.stem = _conv(3, STEM_CHANNELS, 3, 2)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        blocks: list[nn.Module] = []
        self.stage_ends: list[int] = []
        ratios = iter(channel_ratios)
        for stage, repeats in enumerate(STAGE_REPEATS):
            width = widths[stage + 1]
            for index in range(repeats):
                inner = _make_divisible(int(width * next(ratios)), 8)
                blocks.append(ShuffleDownBlock(widths[stage], width, inner) if index == 0 else ShuffleBlock(width, inner))
            self.stage_ends.append(len(blocks) - 1)
        self.blocks = nn.ModuleList(blocks)
        self.out_channels = widths[1:]

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        x = self.pool(self.stem(images))
        outputs = []
        for index, block in enumerate(self.blocks):
            x = block(x)
            if index in self.stage_ends:
                outputs.append(x)
        return outputs


class _Bottleneck(nn.Module):
    """1×1 conv then a 5×5 depthwise-separable conv (no residual in CSP-PAN)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce = _conv(channels, channels)
        self.spatial = DepthwiseSeparable(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.spatial(self.reduce(x))


class _CSPLayer(nn.Module):
    """Two 1×1 projections to half width, bottlenecks on one, concat, 1×1 mix."""

    def __init__(self, in_channels: int, out_channels: int, depth: int = 1) -> None:
        super().__init__()
        hidden = out_channels // 2
        self.main = _conv(in_channels, hidden)
        self.bypass = _conv(in_channels, hidden)
        self.bottlenecks = nn.Sequential(*(_Bottleneck(hidden) for _ in range(depth)))
        self.mix = _conv(2 * hidden, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(torch.cat((self.bottlenecks(self.main(x)), self.bypass(x)), dim=1))


class CSPPAN(nn.Module):
    """CSP-PAN neck: lateral 1×1s, top-down and bottom-up CSP paths, an extra stride-64 level."""

    def __init__(self, in_channels: Sequence[int], channels: int) -> None:
        super().__init__()
        levels = len(in_channels)
        self.lateral = nn.ModuleList(_conv(c, channels) for c in in_channels)
        self.top_down = nn.ModuleList(_CSPLayer(2 * channels, channels) for _ in range(levels - 1))
        self.downsamples = nn.ModuleList(DepthwiseSeparable(channels, channels, stride=2) for _ in range(levels - 1))
        self.bottom_up = nn.ModuleList(_CSPLayer(2 * channels, channels) for _ in range(levels - 1))
        self.extra_from_input = DepthwiseSeparable(channels, channels, stride=2)
        self.extra_from_output = DepthwiseSeparable(channels, channels, stride=2)

    def forward(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        lateral = [conv(x) for conv, x in zip(self.lateral, features)]
        merged = [lateral[-1]]
        for step, finer in enumerate(reversed(lateral[:-1])):
            up = F.interpolate(merged[0], size=finer.shape[-2:], mode="nearest")
            merged.insert(0, self.top_down[step](torch.cat((up, finer), dim=1)))
        outputs = [merged[0]]
        for step, (down, block) in enumerate(zip(self.downsamples, self.bottom_up)):
            outputs.append(block(torch.cat((down(outputs[-1]), merged[step + 1]), dim=1)))
        outputs.append(self.extra_from_input(lateral[-1]) + self.extra_from_output(outputs[-1]))
        return outputs


class PicoHead(nn.Module):
    """Per level: ``depth`` 5×5 depthwise-separable convs and one 1×1 conv predicting the class
    logits and the 4 × ``bins`` box logits together. Output: the dense-head dict of
    ``zoo_core.nn.detection_head`` (decoded ``boxes``/``scores`` added in eval mode)."""

    def __init__(self, num_classes: int, channels: int, depth: int, strides: Sequence[int], bins: int) -> None:
        super().__init__()
        self.num_classes, self.bins, self.strides = num_classes, bins, tuple(strides)
        self.towers = nn.ModuleList(
            nn.Sequential(*(DepthwiseSeparable(channels, channels) for _ in range(depth))) for _ in strides
        )
        self.preds = nn.ModuleList(nn.Conv2d(channels, num_classes + 4 * bins, 1) for _ in strides)

    def forward(self, features: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        class_logits, box_logits = [], []
        for tower, pred, x in zip(self.towers, self.preds, features):
            out = pred(tower(x)).flatten(2)
            class_logits.append(out[:, : self.num_classes])
            box_logits.append(out[:, self.num_classes :])
        anchor_points, anchor_strides = make_anchor_points(
            [tuple(level.shape[2:]) for level in features], self.strides, device=features[0].device
        )
        outputs = {
            "box_logits": torch.cat(box_logits, dim=2).transpose(1, 2),
            "class_logits": torch.cat(class_logits, dim=2).transpose(1, 2),
            "anchor_points": anchor_points,
            "anchor_strides": anchor_strides,
        }
        if not self.training:
            outputs["boxes"], outputs["scores"] = decode_picodet(outputs, self.bins)
        return outputs


def decode_picodet(outputs: Mapping[str, torch.Tensor], bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(boxes N×A×4 xyxy pixels, scores N×A×C)``: the distance expectation (softmax over bins,
    weighted sum) in strides, scaled to pixels and measured from each anchor point; in the op
    order of the published decoder, so results match it bit for bit."""
    probabilities = outputs["box_logits"].unflatten(-1, (4, bins)).softmax(dim=-1)
    levels = torch.arange(bins, device=probabilities.device, dtype=probabilities.dtype)
    distances = (probabilities * levels).sum(dim=-1) * outputs["anchor_strides"]
    points = outputs["anchor_points"]
    boxes = torch.cat((points - distances[..., :2], points + distances[..., 2:]), dim=-1)
    return boxes, outputs["class_logits"].sigmoid()


class PicoDet(DenseDetectionPostprocess, nn.Module):
    """The PP-PicoDet detector, zoo's detection model contract.

    - ``forward(images)`` (N×3×H×W RGB in [0, 1], H and W multiples of 32; the stride-64 level
      has ``ceil(H / 64)`` rows): the head dict.
    - ``loss(outputs, batch)``: SimOTA + varifocal + GIoU + DFL (``loss.PicoDetLoss``).
    - ``postprocess(outputs, conf, iou, max_det)``: per-class NMS over the 1000 best candidates.
    """

    # Every class above the threshold, the best 1000 (anchor, class) pairs of each level (LibreYOLO 1.6's postprocess).
    nms_defaults = DenseNMSDefaults(iou=0.6, max_det=100, multi_label=True, per_level_candidates=PRE_NMS_TOP_K)

    def __init__(self, num_classes: int, spec: PicoDetSpec) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.strides = STRIDES
        self.reg_bins = REG_BINS
        self.register_buffer("pixel_mean", torch.tensor(PIXEL_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(PIXEL_STD).view(1, 3, 1, 1), persistent=False)
        self.backbone = ESNet(spec.scale, spec.channel_ratios)
        self.neck = CSPPAN(self.backbone.out_channels, spec.neck_channels)
        self.head = PicoHead(num_classes, spec.neck_channels, spec.head_convs, STRIDES, REG_BINS)
        self.criterion = PicoDetLoss(num_classes, REG_BINS)
        self._initialise()

    @torch.no_grad()
    def _initialise(self) -> None:
        """PicoDet's initialisation: Kaiming-normal (fan-out) convs in backbone and neck,
        N(0, 0.01) head convs, unit BatchNorms, class biases at a 1 % prior."""
        for part, head in ((self.backbone, False), (self.neck, False), (self.head, True)):
            for module in part.modules():
                if isinstance(module, nn.Conv2d):
                    if head:
                        nn.init.normal_(module.weight, std=0.01)
                    else:
                        nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, nn.BatchNorm2d):
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)
        for pred in self.head.preds:
            pred.bias[: self.num_classes] = -math.log((1 - CLASS_PRIOR) / CLASS_PRIOR)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Dense predictions of ``images``; see the class docstring."""
        if images.dim() != 4 or images.shape[2] % 32 or images.shape[3] % 32:
            raise ValueError(f"PicoDet takes N×3×H×W images with H and W multiples of 32, got {tuple(images.shape)}")
        normalised = (images * 255.0 - self.pixel_mean) / self.pixel_std
        return self.head(self.neck(self.backbone(normalised)))

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)``: weighted varifocal + GIoU + DFL terms (see ``loss.PicoDetLoss``)."""
        terms = self.criterion(outputs, batch["targets"], int(batch["images"].shape[0]))
        return terms.total(), {"cls": terms.cls.detach(), "giou": terms.giou.detach(), "dfl": terms.dfl.detach()}

    def decode(self, outputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(boxes N×A×4 xyxy in input pixels, scores N×A×C)`` from the raw head outputs (``decode_picodet``)."""
        return decode_picodet(outputs, self.reg_bins)


def build_picodet(request: BuildRequest) -> PicoDet:
    """The registry builder of ``picodet``: ``request.config`` is the size's ``PicoDetSpec`` data."""
    if request.options:
        raise ValueError(f"picodet takes no build options, got {sorted(request.options)}")
    spec = PicoDetSpec.from_config(request.config, where=f"registry.yaml picodet size {request.size!r} config")
    return PicoDet(request.num_classes, spec)
