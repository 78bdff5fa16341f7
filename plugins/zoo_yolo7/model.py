"""YOLOv7 (Wang, Bochkovskiy & Liao, CVPR 2023, arXiv:2207.02696): E-ELAN backbone, ELAN PAN neck,
anchor-based implicit-knowledge head.

One configurable graph builds the three published P5 models (registry ``config``, transcribed
from the official ``cfg/training/yolov7-tiny.yaml``, ``yolov7.yaml`` and ``yolov7x.yaml``):

- **stem**: plain convs (YOLOv7: 3×3 s1, 3×3 s2, 3×3 s1, 3×3 s2; tiny: two 3×3 s2).
- **backbone**: four ELAN stages (strides 4, 8, 16, 32). An ELAN block runs two 1×1 convs on its
  input and a chain of 3×3 convs on the second; some of those outputs (``taps``, the official
  ``Concat`` sources counted back from the chain's end) are concatenated and merged by a 1×1
  conv. Stages after the first start with a downsample: YOLOv7's "MP" block (max-pool + 1×1
  beside 1×1 + 3×3 stride 2, concatenated) or, in tiny, a bare 2×2 max-pool.
- **neck**: SPPCSPC on the last stage (tiny: its lighter variant), then a PAN: top-down
  (lateral 1×1 + upsample, concatenated after a 1×1 "route" of the backbone level, ELAN) and
  bottom-up (MP block or 3×3 stride-2 conv, concatenated with the top-down level, ELAN).
- **head**: a 3×3 conv per level (RepConv in YOLOv7, plain conv in tiny and X), then the
  IDetect head: ``ImplicitM(conv1×1(ImplicitA(x)))`` giving, for each of 3 anchors per cell,
  4 box values, an objectness logit and C class logits. Decoding is YOLOv5's: centre
  ``(2σ(t_xy) - 0.5 + cell)·stride``, size ``(2σ(t_wh))²·anchor``.

``fuse()`` gives the re-parameterised inference graph: RepConv branches merged, implicit layers
folded into the 1×1 head convs (as the official ``IDetect.fuse``), BatchNorms folded.

LibreYOLO 1.6.0's YOLOv7 (a port of MultimediaTechLab/YOLO's ``v7.yaml``) differs from the
official graph in two places, both reproduced for size ``b`` so that LibreYOLO checkpoints give
LibreYOLO's outputs, and both switchable in the config:

- ``spp_pooling``: its SPPCSPC applies the 5/9/13 max-pools one after the other (each on the
  previous pool's output: effective windows 5, 13, 25; ``cascade``), where the official code
  pools the same map three times (``parallel``);
- ``route_p3_source``: its neck's P3 route reads the backbone's last P3 ELAN *before* the 1×1
  merge (the concatenation, ``concatenated``; the tag ``B3`` sits on the Concat layer), where
  the official ``yolov7.yaml`` routes layer 24, the merge's output (``merged``).

``build_yolo7`` with the option ``official_graph=True`` builds the official graph for any size
(for checkpoints converted from WongKinYiu/yolov7 releases).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.building import BuildRequest, count_parameters
from zoo_core.nn.conv import ConvNormAct
from zoo_core.nn.gelan import RepConvN, fuse_for_inference
from zoo_core.nn.norm import apply_batchnorm_momentum_option
from zoo_core.ops.dense_postprocess import DenseDetectionPostprocess, DenseNMSDefaults

from .loss import LossGains, YOLOv7OTALoss, decode_yolo7_boxes

__all__ = [
    "ELANSpec",
    "YOLOv7Spec",
    "ELANBlock",
    "MPDownsample",
    "SPPCSPC",
    "ImplicitDetectLevel",
    "ImplicitDetectHead",
    "ELANBackbone",
    "ELANPAN",
    "YOLOv7",
    "build_yolo7",
]

STRIDES = (8, 16, 32)
POOL_SIZES = (5, 9, 13)
_DOWNSAMPLES = ("mp_conv", "maxpool", "conv")
_SPP_KINDS = ("csp", "csp_tiny")
_POOLINGS = ("parallel", "cascade")
_HEAD_CONVS = ("repconv", "conv")
_ROUTES = ("merged", "concatenated")
BN_MOMENTUM = 0.03  # official models/yolo.py initialize_weights (eps 1e-3, momentum 0.03)
BUILD_OPTIONS = ("official_graph", "bn_momentum")


@dataclass(frozen=True)
class ELANSpec:
    """Shape of the ELAN blocks of one part of the network: ``convs`` chained 3×3 convs, ``taps``."""

    convs: int
    taps: tuple[int, ...]

    def check(self, where: str) -> "ELANSpec":
        if self.convs < 1 or not self.taps or any(t >= 0 or -t > self.convs + 2 for t in self.taps):
            raise ValueError(f"{where}: taps must be negative indices into the {self.convs + 2} outputs, got {self.taps}")
        return self


def _ints(value: Any, length: int | None, key: str, where: str, *, allow_zero: bool = False) -> tuple[int, ...]:
    ok = isinstance(value, (list, tuple)) and (length is None or len(value) == length)
    ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and (v >= 0 if allow_zero else v > 0) for v in value)
    if not ok:
        raise ValueError(f"{where}: '{key}' must be a list of {length or 'some'} positive integers, got {value!r}")
    return tuple(value)


def _choice(value: Any, choices: Sequence[str], key: str, where: str) -> str:
    if value not in choices:
        raise ValueError(f"{where}: '{key}' must be one of {', '.join(choices)}, got {value!r}")
    return value


@dataclass(frozen=True)
class YOLOv7Spec:
    """Widths, depths and block kinds of one YOLOv7 size (the ``config`` of its registry entry).

    Rows: ``backbone`` per stage (P2..P5) ``(downsample width, split, branch, out)`` (downsample
    width 0 for P2, or when the stage downsamples by max-pool); ``neck_top_down`` for P4 then P3
    ``(lateral, split, branch, out)``; ``neck_bottom_up`` for P4 then P5 ``(downsample width,
    split, branch, out)``. ``split``: width of the ELAN's two 1×1 convs; ``branch``: of its 3×3s.
    """

    activation: str
    stem: tuple[tuple[int, ...], ...]  # (out, kernel, stride) per conv
    backbone_downsample: str  # mp_conv | maxpool
    backbone_elan: ELANSpec
    backbone: tuple[tuple[int, ...], ...]
    spp: str  # csp | csp_tiny
    spp_width: int
    spp_pooling: str  # parallel (official) | cascade (LibreYOLO)
    route_p3_source: str  # merged (official) | concatenated (LibreYOLO)
    neck_elan: ELANSpec
    neck_top_down: tuple[tuple[int, ...], ...]
    neck_downsample: str  # mp_conv | conv
    neck_bottom_up: tuple[tuple[int, ...], ...]
    head_conv: str  # repconv | conv
    head_widths: tuple[int, ...]
    anchors: tuple[tuple[int, ...], ...]  # per level: w0, h0, w1, h1, w2, h2 (input pixels)
    anchor_threshold: float
    loss_gains: LossGains

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str = "yolo7 config") -> "YOLOv7Spec":
        """Validate a registry ``config`` mapping; errors name the key and the expected form."""
        expected = set(cls.__dataclass_fields__)
        unknown, missing = set(config) - expected, expected - set(config)
        if unknown or missing:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}; expected {sorted(expected)}")

        def elan(key: str) -> ELANSpec:
            value = config[key]
            if not isinstance(value, Mapping) or set(value) != {"convs", "taps"}:
                raise ValueError(f"{where}: '{key}' must be a mapping with 'convs' and 'taps', got {value!r}")
            taps = value["taps"]
            if not isinstance(taps, (list, tuple)) or not all(isinstance(t, int) for t in taps):
                raise ValueError(f"{where}: '{key}.taps' must be a list of negative integers, got {taps!r}")
            return ELANSpec(int(value["convs"]), tuple(taps)).check(f"{where} {key}")

        gains = config["loss_gains"]
        if not isinstance(gains, Mapping) or set(gains) != {"box", "obj", "cls"}:
            raise ValueError(f"{where}: 'loss_gains' must map box, obj and cls to numbers, got {gains!r}")
        anchors = tuple(_ints(level, 6, f"anchors[{i}]", where) for i, level in enumerate(config["anchors"]))
        if len(anchors) != len(STRIDES):
            raise ValueError(f"{where}: 'anchors' needs one row per stride {STRIDES}, got {len(anchors)}")
        return cls(
            activation=config["activation"],
            stem=tuple(_ints(row, 3, f"stem[{i}]", where) for i, row in enumerate(config["stem"])),
            backbone_downsample=_choice(config["backbone_downsample"], ("mp_conv", "maxpool"), "backbone_downsample", where),
            backbone_elan=elan("backbone_elan"),
            backbone=tuple(
                _ints(row, 4, f"backbone[{i}]", where, allow_zero=True) for i, row in enumerate(config["backbone"])
            ),
            spp=_choice(config["spp"], _SPP_KINDS, "spp", where),
            spp_width=_ints([config["spp_width"]], 1, "spp_width", where)[0],
            spp_pooling=_choice(config["spp_pooling"], _POOLINGS, "spp_pooling", where),
            route_p3_source=_choice(config["route_p3_source"], _ROUTES, "route_p3_source", where),
            neck_elan=elan("neck_elan"),
            neck_top_down=tuple(_ints(row, 4, f"neck_top_down[{i}]", where) for i, row in enumerate(config["neck_top_down"])),
            neck_downsample=_choice(config["neck_downsample"], ("mp_conv", "conv"), "neck_downsample", where),
            neck_bottom_up=tuple(_ints(row, 4, f"neck_bottom_up[{i}]", where) for i, row in enumerate(config["neck_bottom_up"])),
            head_conv=_choice(config["head_conv"], _HEAD_CONVS, "head_conv", where),
            head_widths=_ints(config["head_widths"], 3, "head_widths", where),
            anchors=anchors,
            anchor_threshold=float(config["anchor_threshold"]),
            loss_gains=LossGains(**{key: float(value) for key, value in gains.items()}),
        )


class ELANBlock(nn.Module):
    """Efficient layer aggregation: two 1×1 convs on the input, ``convs`` chained 3×3 convs on the
    second, the ``taps`` of ``[first, second, chain...]`` concatenated (in ``taps`` order), 1×1 merge."""

    def __init__(
        self, in_channels: int, split: int, branch: int, out_channels: int, spec: ELANSpec, *, activation: str
    ) -> None:
        super().__init__()
        self.part_a = ConvNormAct(in_channels, split, 1, activation=activation)
        self.part_b = ConvNormAct(in_channels, split, 1, activation=activation)
        self.chain = nn.ModuleList(
            ConvNormAct(split if index == 0 else branch, branch, 3, activation=activation) for index in range(spec.convs)
        )
        widths = [split, split] + [branch] * spec.convs
        self.taps = tuple(len(widths) + tap for tap in spec.taps)  # as positive indices
        self.concat_channels = sum(widths[tap] for tap in self.taps)
        self.merge = ConvNormAct(self.concat_channels, out_channels, 1, activation=activation)

    def aggregate(self, x: torch.Tensor) -> torch.Tensor:
        """The concatenation the merge conv reads."""
        outputs = [self.part_a(x), self.part_b(x)]
        y = outputs[1]
        for conv in self.chain:
            y = conv(y)
            outputs.append(y)
        return torch.cat([outputs[tap] for tap in self.taps], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.merge(self.aggregate(x))


class MPDownsample(nn.Module):
    """YOLOv7's "MP" downsample: [1×1 → 3×3 stride 2] concatenated with [2×2 max-pool → 1×1]; 2·width out."""

    def __init__(self, in_channels: int, width: int, *, activation: str) -> None:
        super().__init__()
        self.pool_branch = nn.Sequential(nn.MaxPool2d(2, 2), ConvNormAct(in_channels, width, 1, activation=activation))
        self.conv_branch = nn.Sequential(
            ConvNormAct(in_channels, width, 1, activation=activation), ConvNormAct(width, width, 3, 2, activation=activation)
        )
        self.out_channels = 2 * width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((self.conv_branch(x), self.pool_branch(x)), dim=1)


class SPPCSPC(nn.Module):
    """Spatial pyramid pooling in a CSP block.

    A pooled branch (YOLOv7: 1×1, 3×3, 1×1; tiny: 1×1) whose output and its 5/9/13 max-pools are
    concatenated and reduced (YOLOv7: 1×1, 3×3; tiny: 1×1), concatenated with a 1×1 shortcut of
    the input, and merged by a 1×1 conv. YOLOv7 concatenates ``[map, pool5, pool9, pool13]``,
    tiny ``[pool13, pool9, pool5, map]``. ``pooling="cascade"`` pools each pool's output again
    (LibreYOLO's port) instead of the map three times (official).
    """

    def __init__(self, in_channels: int, width: int, *, tiny: bool, pooling: str, activation: str) -> None:
        super().__init__()
        pre_kernels, post_kernels = ((1,), (1,)) if tiny else ((1, 3, 1), (1, 3))
        self.pooled_branch = nn.Sequential(
            *(ConvNormAct(in_channels if i == 0 else width, width, k, activation=activation) for i, k in enumerate(pre_kernels))
        )
        self.shortcut = ConvNormAct(in_channels, width, 1, activation=activation)
        self.post = nn.Sequential(
            *(
                ConvNormAct(width * (len(POOL_SIZES) + 1) if i == 0 else width, width, k, activation=activation)
                for i, k in enumerate(post_kernels)
            )
        )
        self.merge = ConvNormAct(2 * width, width, 1, activation=activation)
        self.descending = tiny
        self.cascade = pooling == "cascade"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pooled_branch(x)
        maps = [y]
        for size in POOL_SIZES:
            source = maps[-1] if self.cascade else y
            maps.append(F.max_pool2d(source, size, stride=1, padding=size // 2))
        if self.descending:
            maps.reverse()
        return self.merge(torch.cat((self.post(torch.cat(maps, dim=1)), self.shortcut(x)), dim=1))


class ImplicitDetectLevel(nn.Module):
    """One level of IDetect: ``implicit_mul * conv1×1(x + implicit_add)`` (YOLOR's implicit knowledge)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.implicit_add: nn.Parameter | None = nn.Parameter(torch.empty(1, in_channels, 1, 1))
        self.conv = nn.Conv2d(in_channels, out_channels, 1)
        self.implicit_mul: nn.Parameter | None = nn.Parameter(torch.empty(1, out_channels, 1, 1))
        nn.init.normal_(self.implicit_add, mean=0.0, std=0.02)  # official ImplicitA / ImplicitM init
        nn.init.normal_(self.implicit_mul, mean=1.0, std=0.02)

    @property
    def fused(self) -> bool:
        return self.implicit_add is None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.implicit_add is None or self.implicit_mul is None:
            return self.conv(x)
        return self.conv(x + self.implicit_add) * self.implicit_mul

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold both implicit tensors into the conv (same outputs); idempotent."""
        if self.implicit_add is None or self.implicit_mul is None:
            return
        weight = self.conv.weight  # out×in×1×1
        scale = self.implicit_mul.reshape(-1)
        bias = self.conv.bias + weight[:, :, 0, 0] @ self.implicit_add.reshape(-1)
        self.conv.bias.copy_(bias * scale)
        self.conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
        self.implicit_add = None
        self.implicit_mul = None


class ImplicitDetectHead(nn.Module):
    """IDetect: per level, ``anchors_per_level·(5 + C)`` raw outputs per cell."""

    def __init__(self, num_classes: int, in_channels: Sequence[int], anchors_per_level: int = 3) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.anchors_per_level = anchors_per_level
        self.levels = nn.ModuleList(ImplicitDetectLevel(c, anchors_per_level * (5 + num_classes)) for c in in_channels)

    @torch.no_grad()
    def initialize_biases(self, strides: Sequence[int], reference_size: int = 640) -> None:
        """The official prior: objectness for ~8 objects per 640² image, classes at 0.6/(C - 0.99)."""
        for level, stride in zip(self.levels, strides):
            bias = level.conv.bias.view(self.anchors_per_level, -1)
            bias[:, 4] += math.log(8 / (reference_size / stride) ** 2)
            bias[:, 5:] += math.log(0.6 / (self.num_classes - 0.99))

    def forward(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """N×A×(5 + C) raw outputs, A enumerating (level, anchor, row, column)."""
        outputs = []
        for level, x in zip(self.levels, features):
            y = level(x)
            n, _, h, w = y.shape
            y = y.view(n, self.anchors_per_level, 5 + self.num_classes, h * w).transpose(2, 3)
            outputs.append(y.reshape(n, self.anchors_per_level * h * w, 5 + self.num_classes))
        return torch.cat(outputs, dim=1)

    def fuse(self) -> None:
        for level in self.levels:
            level.fuse()


def _downsample(kind: str, in_channels: int, width: int, activation: str) -> tuple[nn.Module, int]:
    if kind == "mp_conv":
        block = MPDownsample(in_channels, width, activation=activation)
        return block, block.out_channels
    if kind == "maxpool":
        return nn.MaxPool2d(2, 2), in_channels
    return ConvNormAct(in_channels, width, 3, 2, activation=activation), width


class BackboneStage(nn.Module):
    """An optional downsample followed by an ELAN block."""

    def __init__(self, downsample: nn.Module | None, block: ELANBlock) -> None:
        super().__init__()
        self.downsample = downsample
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x if self.downsample is None else self.downsample(x))

    def forward_with_concat(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(output, the ELAN's concatenation before its merge conv)``."""
        concat = self.block.aggregate(x if self.downsample is None else self.downsample(x))
        return self.block.merge(concat), concat


class ELANBackbone(nn.Module):
    """Stem convs and four ELAN stages; returns the P3, P4, P5 maps (P3: the stage's ELAN concatenation
    instead of its output when ``route_p3_source`` is ``concatenated``)."""

    def __init__(self, spec: YOLOv7Spec) -> None:
        super().__init__()
        act = spec.activation
        stem, width = [], 3
        for out, kernel, stride in spec.stem:
            stem.append(ConvNormAct(width, out, kernel, stride, activation=act))
            width = out
        self.stem = nn.Sequential(*stem)
        self.stages = nn.ModuleList()
        self.out_channels: list[int] = []
        for index, (down_width, split, branch, out) in enumerate(spec.backbone):
            downsample = None
            if index > 0:
                downsample, width = _downsample(spec.backbone_downsample, width, down_width, act)
            self.stages.append(BackboneStage(downsample, ELANBlock(width, split, branch, out, spec.backbone_elan, activation=act)))
            width = out
            self.out_channels.append(out)
        self.out_channels = self.out_channels[1:]
        self.p3_from_concat = spec.route_p3_source == "concatenated"
        if self.p3_from_concat:
            self.out_channels[0] = self.stages[1].block.concat_channels

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outputs = []
        for index, stage in enumerate(self.stages):
            if index == 1 and self.p3_from_concat:
                x, concat = stage.forward_with_concat(x)
                outputs.append(concat)
                continue
            x = stage(x)
            if index > 0:
                outputs.append(x)
        return outputs


class ELANPAN(nn.Module):
    """SPPCSPC, then a top-down and a bottom-up path of ELAN blocks; returns P3, P4, P5 outputs."""

    def __init__(self, spec: YOLOv7Spec, backbone_channels: Sequence[int]) -> None:
        super().__init__()
        act = spec.activation
        c3, c4, c5 = backbone_channels
        self.spp = SPPCSPC(c5, spec.spp_width, tiny=spec.spp == "csp_tiny", pooling=spec.spp_pooling, activation=act)
        (lat4, split4, branch4, out4), (lat3, split3, branch3, out3) = spec.neck_top_down
        self.lateral_p5 = ConvNormAct(spec.spp_width, lat4, 1, activation=act)
        self.route_p4 = ConvNormAct(c4, lat4, 1, activation=act)
        self.merge_p4 = ELANBlock(2 * lat4, split4, branch4, out4, spec.neck_elan, activation=act)
        self.lateral_p4 = ConvNormAct(out4, lat3, 1, activation=act)
        self.route_p3 = ConvNormAct(c3, lat3, 1, activation=act)
        self.merge_p3 = ELANBlock(2 * lat3, split3, branch3, out3, spec.neck_elan, activation=act)
        (down4, bsplit4, bbranch4, bout4), (down5, bsplit5, bbranch5, bout5) = spec.neck_bottom_up
        self.downsample_p3, width = _downsample(spec.neck_downsample, out3, down4, act)
        self.bottom_up_p4 = ELANBlock(width + out4, bsplit4, bbranch4, bout4, spec.neck_elan, activation=act)
        self.downsample_p4, width = _downsample(spec.neck_downsample, bout4, down5, act)
        self.bottom_up_p5 = ELANBlock(width + spec.spp_width, bsplit5, bbranch5, bout5, spec.neck_elan, activation=act)
        self.out_channels = [out3, bout4, bout5]

    def forward(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        p3, p4, p5 = features
        top5 = self.spp(p5)
        up5 = F.interpolate(self.lateral_p5(top5), scale_factor=2.0, mode="nearest")
        top4 = self.merge_p4(torch.cat((self.route_p4(p4), up5), dim=1))
        up4 = F.interpolate(self.lateral_p4(top4), scale_factor=2.0, mode="nearest")
        out3 = self.merge_p3(torch.cat((self.route_p3(p3), up4), dim=1))
        out4 = self.bottom_up_p4(torch.cat((self.downsample_p3(out3), top4), dim=1))
        out5 = self.bottom_up_p5(torch.cat((self.downsample_p4(out4), top5), dim=1))
        return [out3, out4, out5]


def make_anchor_grid(
    feature_sizes: Sequence[tuple[int, int]], anchors: torch.Tensor, strides: Sequence[int]
) -> dict[str, torch.Tensor]:
    """Per anchor (level, anchor, row, column order): cell (x, y), anchor size (w, h, pixels), stride, level;
    plus the level geometry (``level_shapes``, ``level_strides``, ``anchors`` L×K×2)."""
    cells, sizes, anchor_strides, levels = [], [], [], []
    device = anchors.device
    num_anchors = anchors.shape[1]
    for level, ((height, width), stride) in enumerate(zip(feature_sizes, strides)):
        ys, xs = torch.meshgrid(
            torch.arange(height, device=device, dtype=torch.float32),
            torch.arange(width, device=device, dtype=torch.float32),
            indexing="ij",
        )
        grid = torch.stack((xs, ys), dim=-1).reshape(1, -1, 2).expand(num_anchors, -1, -1)
        cells.append(grid.reshape(-1, 2))
        sizes.append(anchors[level].float()[:, None, :].expand(-1, height * width, -1).reshape(-1, 2))
        count = num_anchors * height * width
        anchor_strides.append(torch.full((count, 1), float(stride), device=device))
        levels.append(torch.full((count,), level, device=device, dtype=torch.int64))
    return {
        "anchor_cells": torch.cat(cells),
        "anchor_sizes": torch.cat(sizes),
        "anchor_strides": torch.cat(anchor_strides),
        "anchor_levels": torch.cat(levels),
        # Level geometry stays on the CPU: the loss reads it without a device synchronisation.
        "level_shapes": torch.tensor(list(feature_sizes), dtype=torch.int64).reshape(-1, 2),
        "level_strides": torch.tensor(list(strides), dtype=torch.int64),
        "anchors": anchors,
    }


class YOLOv7(DenseDetectionPostprocess, nn.Module):
    """The YOLOv7 detector, zoo's detection model contract.

    - ``forward(images)`` (N×3×H×W RGB in [0, 1], H and W multiples of 32) returns a dict:
      ``predictions`` (N×A×(5 + C) raw: t_x, t_y, t_w, t_h, objectness, classes), per anchor
      ``anchor_cells`` (A×2), ``anchor_sizes`` (A×2, pixels), ``anchor_strides`` (A×1),
      ``anchor_levels`` (A), ``anchors`` (L×K×2 anchor sizes), and on the CPU ``level_shapes``
      (L×2: H, W of each level) and ``level_strides`` (L); in eval mode also
      ``boxes`` (N×A×4 xyxy input pixels) and ``scores`` (N×A×C: objectness × class probability).
    - ``loss(outputs, batch)``: YOLOv7's ComputeLossOTA (YOLOv5 anchor matching for candidates,
      SimOTA dynamic-k selection; CIoU box, objectness and class BCE), times the nominal batch 64.
    - ``postprocess(outputs, conf, iou, max_det)``: per-class NMS.
    - ``fuse()``: the re-parameterised inference graph (same outputs).
    """

    nms_defaults = DenseNMSDefaults(iou=0.65)

    def __init__(self, num_classes: int, spec: YOLOv7Spec) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.spec = spec
        self.strides = STRIDES
        self.max_stride = max(STRIDES)
        self.backbone = ELANBackbone(spec)
        self.neck = ELANPAN(spec, self.backbone.out_channels)
        act = spec.activation
        if spec.head_conv == "repconv":
            self.head_convs = nn.ModuleList(
                RepConvN(c, w, 3, activation=act) for c, w in zip(self.neck.out_channels, spec.head_widths)
            )
        else:
            self.head_convs = nn.ModuleList(
                ConvNormAct(c, w, 3, activation=act) for c, w in zip(self.neck.out_channels, spec.head_widths)
            )
        anchors = torch.tensor(spec.anchors, dtype=torch.float32).reshape(len(STRIDES), -1, 2)
        self.register_buffer("anchors", anchors, persistent=False)
        self.head = ImplicitDetectHead(num_classes, spec.head_widths, anchors.shape[1])
        self.head.initialize_biases(STRIDES)
        self.criterion = YOLOv7OTALoss(num_classes, spec.loss_gains, anchor_threshold=spec.anchor_threshold)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Dense predictions of ``images``; see the class docstring for the dict's keys."""
        if images.dim() != 4 or images.shape[1] != 3 or images.shape[2] % self.max_stride or images.shape[3] % self.max_stride:
            raise ValueError(
                f"YOLOv7 takes N×3×H×W images with H and W multiples of {self.max_stride}, got {tuple(images.shape)}; "
                "letterbox or resize the input"
            )
        features = [conv(level) for conv, level in zip(self.head_convs, self.neck(self.backbone(images)))]
        outputs = {"predictions": self.head(features)}
        outputs.update(make_anchor_grid([tuple(f.shape[2:]) for f in features], self.anchors, self.strides))
        if not self.training:
            outputs["boxes"], outputs["scores"] = self.decode(outputs)
        return outputs

    @staticmethod
    def decode(outputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(boxes N×A×4 xyxy in input pixels, scores N×A×C)`` from the raw outputs."""
        predictions = outputs["predictions"].float()  # float32 even under autocast (anchor-scaled sizes)
        boxes = decode_yolo7_boxes(
            predictions[..., :4], outputs["anchor_cells"], outputs["anchor_sizes"], outputs["anchor_strides"]
        )
        probabilities = predictions[..., 4:].sigmoid()
        return boxes, probabilities[..., :1] * probabilities[..., 1:]

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)`` for a detection batch (``images``, ``targets`` M×6 in input pixels).

        The objectness gain is rescaled for the batch's input size, as the official train.py does
        for ``--img-size`` (``hyp['obj'] *= (imgsz / 640) ** 2``; zoo trains on square inputs).
        """
        images = batch["images"]
        return self.criterion(outputs, batch["targets"], int(images.shape[0]), image_size=int(max(images.shape[-2:])))

    def published_parameter_count(self) -> int:
        """Parameters of the re-parameterised model the paper counts (RepConv merged, implicit layers
        and BatchNorms folded: ``fuse()``), counted on a meta-device twin (no memory, any device)."""
        with torch.device("meta"):
            twin = YOLOv7(self.num_classes, self.spec)
        return count_parameters(twin.fuse())

    def fuse(self) -> "YOLOv7":
        """Inference form: RepConv merged, implicit layers folded into the head convs, BatchNorms folded (eval mode)."""
        self.head.fuse()
        fuse_for_inference(self)
        return self


def build_yolo7(request: BuildRequest) -> YOLOv7:
    """The registry builder of ``yolo7``: ``request.config`` is the size's ``YOLOv7Spec`` data.

    Option ``official_graph`` (bool, default False): build the official WongKinYiu/yolov7 graph
    (parallel SPP pools, P3 route from the merged stage output) even where the size's config
    follows LibreYOLO (size ``b``); same parameters and state-dict keys.
    Option ``bn_momentum`` (number in (0, 1], default the published 0.03): the BatchNorms'
    running-statistics momentum; a run of a hundred steps needs torch's 0.1, or its eval-mode
    statistics still lag the weights.
    """
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"yolo7 does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    official = request.options.get("official_graph", False)
    if not isinstance(official, bool):
        raise ValueError(f"yolo7 option official_graph must be True or False, got {official!r}")
    spec = YOLOv7Spec.from_config(request.config, where=f"registry.yaml yolo7 size {request.size!r} config")
    if official:
        spec = dataclasses.replace(spec, spp_pooling="parallel", route_p3_source="merged")
    return apply_batchnorm_momentum_option(YOLOv7(request.num_classes, spec), request.options, family="yolo7")
