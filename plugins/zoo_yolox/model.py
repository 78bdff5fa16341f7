"""YOLOX (Ge, Liu, Wang, Li & Sun, 2021, arXiv:2107.08430): CSPDarknet + PAFPN + decoupled anchor-free head.

Architecture (per size, from the registry ``config``: the official ``exps/default/yolox_*.py``
depth and width multipliers, and ``depthwise`` for YOLOX-Nano):

- **backbone** (CSPDarknet-53 as in YOLOv5): a Focus stem (2×2 space-to-depth, then a 3×3 conv)
  and four stages, each a stride-2 3×3 conv followed by a CSP block; the last stage has an SPP
  block (max-pools 5, 9, 13) before its CSP block, whose bottlenecks have no residual. Widths
  are ``int(64·w)·(1, 2, 4, 8, 16)``, CSP depths ``n, 3n, 3n, n`` with ``n = max(round(3·d), 1)``.
- **neck** (PAFPN): 1×1 lateral convs, nearest upsampling and CSP blocks top-down to P3, then
  stride-2 3×3 convs and CSP blocks bottom-up to P5 (outputs ``int(256·w)``, ``int(512·w)``,
  ``int(1024·w)`` channels at strides 8, 16, 32).
- **head** (decoupled): per level a 1×1 stem to ``int(256·w)`` channels, then a class tower and
  a box tower (two 3×3 convs each); 1×1 predictions of C class logits from the class tower, and
  of the 4 box offsets and 1 objectness logit from the box tower. One prediction per grid cell
  (anchor-free): centre ``(t_xy + cell) · stride``, size ``exp(t_wh) · stride``.

YOLOX-Nano replaces every 3×3 conv except the stem's (and except the head stems, which are 1×1)
by a depthwise 3×3 + pointwise 1×1 pair. Every conv is conv → BatchNorm (eps 1e-3, momentum 0.03,
as the official ``init_yolo``) → SiLU.

Input. The published YOLOX weights (and LibreYOLO's) take BGR pixel values in 0..255; zoo feeds
RGB in [0, 1]. ``YOLOX.forward`` converts (channel flip, ×255) before the stem, so checkpoints
convert by key renaming only and zoo's data pipeline stays the same for every family.
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
from zoo_core.nn.norm import apply_batchnorm_momentum_option
from zoo_core.ops.dense_postprocess import DenseDetectionPostprocess, DenseNMSDefaults

from .loss import YOLOXLoss, decode_yolox_boxes

__all__ = [
    "YOLOXSpec",
    "DepthwiseSeparableConv",
    "DarknetBottleneck",
    "CSPBlock",
    "SPPBlock",
    "FocusStem",
    "CSPDarknet",
    "PAFPN",
    "YOLOXHead",
    "YOLOX",
    "build_yolox",
]

STRIDES = (8, 16, 32)
PRIOR_PROBABILITY = 0.01  # official head.initialize_biases(1e-2)
BN_MOMENTUM = 0.03  # official init_yolo (eps 1e-3, momentum 0.03)
# bn_momentum: the BatchNorms' running-statistics momentum. The published 0.03 suits 300-epoch runs; a
# run of a hundred steps needs torch's 0.1, or its eval-mode statistics still lag the weights.
BUILD_OPTIONS = ("bn_momentum",)


@dataclass(frozen=True)
class YOLOXSpec:
    """The registry ``config`` of one YOLOX size: the official depth/width multipliers."""

    depth_multiple: float
    width_multiple: float
    depthwise: bool = False
    activation: str = "silu"

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str = "yolox config") -> "YOLOXSpec":
        """Validate a registry ``config`` mapping; errors name the key and the expected form."""
        required = {"depth_multiple", "width_multiple"}
        allowed = set(cls.__dataclass_fields__)
        unknown, missing = set(config) - allowed, required - set(config)
        if unknown or missing:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}; allowed {sorted(allowed)}")
        for key in required:
            value = config[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{where}: '{key}' must be a positive number, got {value!r}")
        if not isinstance(config.get("depthwise", False), bool):
            raise ValueError(f"{where}: 'depthwise' must be true or false, got {config['depthwise']!r}")
        return cls(
            depth_multiple=float(config["depth_multiple"]),
            width_multiple=float(config["width_multiple"]),
            depthwise=config.get("depthwise", False),
            activation=config.get("activation", "silu"),
        )

    def width(self, channels: int) -> int:
        """``channels`` scaled by the width multiple (truncated, as the official code)."""
        return int(channels * self.width_multiple)

    @property
    def base_depth(self) -> int:
        """Bottlenecks of the shallow CSP blocks (3 scaled by the depth multiple, at least 1)."""
        return max(round(3 * self.depth_multiple), 1)


class DepthwiseSeparableConv(nn.Module):
    """Depthwise k×k conv (BN, act) then pointwise 1×1 conv (BN, act): YOLOX-Nano's 3×3 conv."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1, *, activation: str = "silu") -> None:
        super().__init__()
        self.depthwise = ConvNormAct(in_channels, in_channels, kernel_size, stride, groups=in_channels, activation=activation)
        self.pointwise = ConvNormAct(in_channels, out_channels, 1, activation=activation)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


def _spatial_conv(depthwise: bool, in_channels: int, out_channels: int, stride: int, activation: str) -> nn.Module:
    """A 3×3 conv, or its depthwise-separable replacement (YOLOX-Nano)."""
    if depthwise:
        return DepthwiseSeparableConv(in_channels, out_channels, 3, stride, activation=activation)
    return ConvNormAct(in_channels, out_channels, 3, stride, activation=activation)


class DarknetBottleneck(nn.Module):
    """1×1 conv then 3×3 conv, plus the input when ``residual`` (widths equal)."""

    def __init__(self, channels: int, *, residual: bool, depthwise: bool, activation: str) -> None:
        super().__init__()
        self.reduce = ConvNormAct(channels, channels, 1, activation=activation)
        self.spatial = _spatial_conv(depthwise, channels, channels, 1, activation)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.spatial(self.reduce(x))
        return x + y if self.residual else y


class CSPBlock(nn.Module):
    """Cross-stage-partial block (YOLOv5's C3): two 1×1 branches of half width, bottlenecks on one,
    concatenation (bottleneck branch first) and a 1×1 merge."""

    def __init__(
        self, in_channels: int, out_channels: int, depth: int, *, residual: bool, depthwise: bool, activation: str
    ) -> None:
        super().__init__()
        hidden = int(out_channels * 0.5)
        self.main = ConvNormAct(in_channels, hidden, 1, activation=activation)
        self.bypass = ConvNormAct(in_channels, hidden, 1, activation=activation)
        self.blocks = nn.Sequential(
            *(DarknetBottleneck(hidden, residual=residual, depthwise=depthwise, activation=activation) for _ in range(depth))
        )
        self.merge = ConvNormAct(2 * hidden, out_channels, 1, activation=activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.merge(torch.cat((self.blocks(self.main(x)), self.bypass(x)), dim=1))


class SPPBlock(nn.Module):
    """Spatial pyramid pooling: 1×1 to half width, the map and its 5/9/13 max-pools concatenated, 1×1."""

    def __init__(self, in_channels: int, out_channels: int, *, activation: str, pool_sizes: Sequence[int] = (5, 9, 13)) -> None:
        super().__init__()
        hidden = in_channels // 2
        self.reduce = ConvNormAct(in_channels, hidden, 1, activation=activation)
        self.pool_sizes = tuple(pool_sizes)
        self.expand = ConvNormAct(hidden * (len(self.pool_sizes) + 1), out_channels, 1, activation=activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.reduce(x)
        pooled = [F.max_pool2d(x, size, stride=1, padding=size // 2) for size in self.pool_sizes]
        return self.expand(torch.cat([x, *pooled], dim=1))


class FocusStem(nn.Module):
    """Space-to-depth (each 2×2 patch's four pixels stacked as channels) then a conv.

    Channel order of the stacked pixels: (top-left, bottom-left, top-right, bottom-right), each
    with all input channels, the order the published weights expect.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, *, activation: str) -> None:
        super().__init__()
        self.conv = ConvNormAct(4 * in_channels, out_channels, kernel_size, activation=activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        # (n, c, h/2, row-in-patch, w/2, column-in-patch) -> (n, column, row, c, h/2, w/2)
        patches = x.reshape(n, c, h // 2, 2, w // 2, 2).permute(0, 5, 3, 1, 2, 4)
        return self.conv(patches.reshape(n, 4 * c, h // 2, w // 2))


class CSPDarknet(nn.Module):
    """Focus stem and four stride-2 stages; returns the stage outputs at strides 8, 16, 32."""

    def __init__(self, spec: YOLOXSpec) -> None:
        super().__init__()
        act, depthwise = spec.activation, spec.depthwise
        base = spec.width(64)
        depth = spec.base_depth
        self.stem = FocusStem(3, base, 3, activation=act)
        widths = [base * 2, base * 4, base * 8, base * 16]
        depths = [depth, depth * 3, depth * 3, depth]
        self.stages = nn.ModuleList()
        width = base
        for index, (out, blocks) in enumerate(zip(widths, depths)):
            last = index == len(widths) - 1
            layers: list[nn.Module] = [_spatial_conv(depthwise, width, out, 2, act)]
            if last:
                layers.append(SPPBlock(out, out, activation=act))
            layers.append(CSPBlock(out, out, blocks, residual=not last, depthwise=depthwise, activation=act))
            self.stages.append(nn.Sequential(*layers))
            width = out
        self.out_channels = widths[1:]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outputs = []
        for index, stage in enumerate(self.stages):
            x = stage(x)
            if index > 0:
                outputs.append(x)
        return outputs


class PAFPN(nn.Module):
    """YOLOX's path-aggregation neck: top-down (lateral 1×1, upsample, CSP) then bottom-up (stride-2, CSP)."""

    def __init__(self, spec: YOLOXSpec) -> None:
        super().__init__()
        act, depthwise = spec.activation, spec.depthwise
        c3, c4, c5 = spec.width(256), spec.width(512), spec.width(1024)
        depth = round(3 * spec.depth_multiple)

        def csp(in_channels: int, out_channels: int) -> CSPBlock:
            return CSPBlock(in_channels, out_channels, depth, residual=False, depthwise=depthwise, activation=act)

        self.reduce_p5 = ConvNormAct(c5, c4, 1, activation=act)
        self.top_down_p4 = csp(spec.width(2 * 512), c4)
        self.reduce_p4 = ConvNormAct(c4, c3, 1, activation=act)
        self.top_down_p3 = csp(spec.width(2 * 256), c3)
        self.downsample_p3 = _spatial_conv(depthwise, c3, c3, 2, act)
        self.bottom_up_p4 = csp(spec.width(2 * 256), c4)
        self.downsample_p4 = _spatial_conv(depthwise, c4, c4, 2, act)
        self.bottom_up_p5 = csp(spec.width(2 * 512), c5)
        self.out_channels = [c3, c4, c5]

    def forward(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        p3, p4, p5 = features
        lateral5 = self.reduce_p5(p5)
        top4 = self.top_down_p4(torch.cat((F.interpolate(lateral5, scale_factor=2.0, mode="nearest"), p4), dim=1))
        lateral4 = self.reduce_p4(top4)
        out3 = self.top_down_p3(torch.cat((F.interpolate(lateral4, scale_factor=2.0, mode="nearest"), p3), dim=1))
        out4 = self.bottom_up_p4(torch.cat((self.downsample_p3(out3), lateral4), dim=1))
        out5 = self.bottom_up_p5(torch.cat((self.downsample_p4(out4), lateral5), dim=1))
        return [out3, out4, out5]


def make_grid_cells(
    feature_sizes: Sequence[tuple[int, int]], strides: Sequence[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell indices (A×2, x then y, float) and strides (A×1) of every cell, level by level, row-major."""
    cells, cell_strides = [], []
    for (height, width), stride in zip(feature_sizes, strides):
        ys, xs = torch.meshgrid(
            torch.arange(height, device=device, dtype=torch.float32),
            torch.arange(width, device=device, dtype=torch.float32),
            indexing="ij",
        )
        cells.append(torch.stack((xs, ys), dim=-1).reshape(-1, 2))
        cell_strides.append(torch.full((height * width, 1), float(stride), device=device))
    return torch.cat(cells), torch.cat(cell_strides)


class YOLOXHead(nn.Module):
    """The decoupled head: per level a 1×1 stem, a class tower and a box tower (two 3×3 each) and
    three 1×1 predictors (class logits; box offsets and objectness from the box tower)."""

    def __init__(self, num_classes: int, in_channels: Sequence[int], spec: YOLOXSpec, strides: Sequence[int] = STRIDES) -> None:
        super().__init__()
        act, depthwise = spec.activation, spec.depthwise
        width = spec.width(256)
        self.num_classes = num_classes
        self.strides = tuple(strides)
        self.stems = nn.ModuleList(ConvNormAct(channels, width, 1, activation=act) for channels in in_channels)
        self.class_towers = nn.ModuleList(
            nn.Sequential(_spatial_conv(depthwise, width, width, 1, act), _spatial_conv(depthwise, width, width, 1, act))
            for _ in in_channels
        )
        self.box_towers = nn.ModuleList(
            nn.Sequential(_spatial_conv(depthwise, width, width, 1, act), _spatial_conv(depthwise, width, width, 1, act))
            for _ in in_channels
        )
        self.class_preds = nn.ModuleList(nn.Conv2d(width, num_classes, 1) for _ in in_channels)
        self.box_preds = nn.ModuleList(nn.Conv2d(width, 4, 1) for _ in in_channels)
        self.objectness_preds = nn.ModuleList(nn.Conv2d(width, 1, 1) for _ in in_channels)
        self.initialize_biases()

    @torch.no_grad()
    def initialize_biases(self, prior_probability: float = PRIOR_PROBABILITY) -> None:
        """Class and objectness logits start at ``logit(prior_probability)`` (focal-loss prior)."""
        bias = -math.log((1 - prior_probability) / prior_probability)
        for predictor in (*self.class_preds, *self.objectness_preds):
            predictor.bias.fill_(bias)

    def forward(self, features: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        boxes, objectness, classes = [], [], []
        for level, x in enumerate(features):
            x = self.stems[level](x)
            box_features = self.box_towers[level](x)
            classes.append(self.class_preds[level](self.class_towers[level](x)).flatten(2))
            boxes.append(self.box_preds[level](box_features).flatten(2))
            objectness.append(self.objectness_preds[level](box_features).flatten(2))
        grid_cells, cell_strides = make_grid_cells([tuple(x.shape[2:]) for x in features], self.strides, features[0].device)
        return {
            "box_regression": torch.cat(boxes, dim=2).transpose(1, 2),
            "objectness_logits": torch.cat(objectness, dim=2)[:, 0],
            "class_logits": torch.cat(classes, dim=2).transpose(1, 2),
            "grid_cells": grid_cells,
            "anchor_strides": cell_strides,
        }


class YOLOX(DenseDetectionPostprocess, nn.Module):
    """The YOLOX detector, zoo's detection model contract.

    - ``forward(images)`` (N×3×H×W RGB in [0, 1], H and W multiples of 32) returns a dict:
      ``box_regression`` (N×A×4 raw ``t_x, t_y, t_w, t_h``), ``objectness_logits`` (N×A),
      ``class_logits`` (N×A×C), ``grid_cells`` (A×2 cell x, y indices), ``anchor_strides`` (A×1);
      in eval mode also ``boxes`` (N×A×4 xyxy input pixels) and ``scores`` (N×A×C, objectness ×
      class probability).
    - ``loss(outputs, batch)``: SimOTA assignment; ``5·IoU loss + objectness BCE + class BCE``
      (``+ L1`` on the raw offsets once ``use_l1_loss(True)``: the last 15 no-augmentation
      epochs of the published recipe), all divided by the number of positives of the batch.
    - ``postprocess(outputs, conf, iou, max_det)``: per-class NMS of each anchor's best class.
    """

    nms_defaults = DenseNMSDefaults(iou=0.65)

    def __init__(self, num_classes: int, spec: YOLOXSpec) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.spec = spec
        self.strides = STRIDES
        self.max_stride = max(STRIDES)
        self.backbone = CSPDarknet(spec)
        self.neck = PAFPN(spec)
        self.head = YOLOXHead(num_classes, self.neck.out_channels, spec)
        self.criterion = YOLOXLoss(num_classes)

    @property
    def l1_loss_enabled(self) -> bool:
        """Whether the loss includes the L1 term on the raw box offsets."""
        return self.criterion.use_l1

    def use_l1_loss(self, enabled: bool = True) -> "YOLOX":
        """Switch the L1 term of the loss on (the recipe does it when mosaic/mixup stop)."""
        self.criterion.use_l1 = bool(enabled)
        return self

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Dense predictions of ``images``; see the class docstring for the dict's keys."""
        if images.dim() != 4 or images.shape[1] != 3 or images.shape[2] % self.max_stride or images.shape[3] % self.max_stride:
            raise ValueError(
                f"YOLOX takes N×3×H×W images with H and W multiples of {self.max_stride}, got {tuple(images.shape)}; "
                "letterbox or resize the input"
            )
        # The published weights expect BGR values in 0..255.
        pixels = images.flip(1) * 255.0
        outputs = self.head(self.neck(self.backbone(pixels)))
        if not self.training:
            outputs["boxes"], outputs["scores"] = self.decode(outputs)
        return outputs

    @staticmethod
    def decode(outputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(boxes N×A×4 xyxy in input pixels, scores N×A×C)`` from the raw head outputs."""
        # float32 even under autocast: exp() of half-precision offsets overflows
        regression = outputs["box_regression"].float()
        boxes = decode_yolox_boxes(regression, outputs["grid_cells"], outputs["anchor_strides"])
        scores = outputs["objectness_logits"].float().sigmoid()[..., None] * outputs["class_logits"].float().sigmoid()
        return boxes, scores

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)`` for a detection batch (``images``, ``targets`` M×6 in input pixels)."""
        return self.criterion(outputs, batch["targets"], int(batch["images"].shape[0]))


def build_yolox(request: BuildRequest) -> YOLOX:
    """The registry builder of ``yolox``: ``request.config`` is the size's ``YOLOXSpec`` data."""
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"yolox does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    spec = YOLOXSpec.from_config(request.config, where=f"registry.yaml yolox size {request.size!r} config")
    return apply_batchnorm_momentum_option(YOLOX(request.num_classes, spec), request.options, family="yolox")
