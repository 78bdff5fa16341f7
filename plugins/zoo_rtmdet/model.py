"""RTMDet (Lyu et al., RTMDet: An Empirical Study of Designing Real-Time Object Detectors, arXiv:2212.07784).

Architecture (per size, data from registry.yaml, read from mmdetection's
``configs/rtmdet/rtmdet_{tiny,s,m,l,x}_8xb32-300e_coco.py`` and LibreYOLO 1.6.0):

- **CSPNeXt backbone**: a stem of three 3×3 convs (the first with stride 2), then four stages,
  each a stride-2 3×3 conv and a CSP layer (the last stage with an SPP block, parallel 5/9/13 max
  pools, before its CSP layer). A CSP layer splits its input through two 1×1 convs; one half runs
  through CSPNeXt blocks (3×3 conv, then a *large-kernel 5×5 depthwise* conv and a 1×1 pointwise
  conv, with a residual in stages 1-3), the halves are concatenated, re-weighted by *channel
  attention* (global average pool, biased 1×1 conv, hard sigmoid) and merged by a 1×1 conv.
- **CSPNeXt-PAFPN neck** on the backbone's P3-P5: top-down (1×1 lateral reduction, nearest
  upsample, concat, CSP layer without attention or residuals), bottom-up (stride-2 3×3 conv,
  concat, CSP layer), then a 3×3 conv per level to the head width.
- **Head**: per level a classification and a regression tower of two 3×3 convs whose *conv
  weights are shared across the levels* while each level keeps its *own BatchNorms*, then a 1×1
  class conv and a 1×1 distance conv per level. Distances (left, top, right, bottom) are the
  output times the stride (RTMDet-t/s) or its exponential times the stride (m/l/x); anchor points
  are the cells' top-left corners (mmdetection's ``MlvlPointGenerator(offset=0)``).

Every conv is conv → BatchNorm(eps 1e-5, momentum 0.1: mmdetection's SyncBN defaults) → SiLU.
The network takes RGB images in [0, 1] and applies RTMDet's input normalisation itself (ImageNet
mean/std in 0-255 units). The published models read BGR: ``convert`` reorders the stem's first
conv weights, so the two compute the same function.
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
from zoo_core.ops.boxes import distances_to_boxes
from zoo_core.ops.dense_postprocess import DenseDetectionPostprocess, DenseNMSDefaults

from .loss import RTMDetLoss

__all__ = [
    "RTMDetSpec",
    "ChannelAttention",
    "CSPNeXtBlock",
    "CSPNeXtLayer",
    "SpatialPyramidPooling",
    "CSPNeXtBackbone",
    "CSPNeXtPAFPN",
    "shared_tower_convs",
    "per_level_norms",
    "apply_shared_tower",
    "initialize_dense_head",
    "SharedConvSeparateNormHead",
    "CSPNeXtFeatures",
    "RTMDet",
    "build_rtmdet",
]

STRIDES = (8, 16, 32)
BN_EPS, BN_MOMENTUM = 1e-5, 0.1
STAGE_RESIDUALS = (True, True, True, False)  # CSPNeXt's P5 arch: stage 4's blocks have no identity
SPP_KERNELS = (5, 9, 13)
BLOCK_KERNEL = 5  # the large depthwise kernel of a CSPNeXt block
HEAD_STACKED_CONVS = 2
CLASS_PRIOR_PROBABILITY = 0.01  # mmdetection bias_init_with_prob(0.01) on the class convs
# RTMDet's data_preprocessor: ImageNet statistics in 0-255 units (given there in BGR order).
RGB_MEAN = (123.675, 116.28, 103.53)
RGB_STD = (58.395, 57.12, 57.375)


def _conv(in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1, *, groups: int = 1) -> ConvNormAct:
    return ConvNormAct(
        in_channels, out_channels, kernel_size, stride, groups=groups, bn_eps=BN_EPS, bn_momentum=BN_MOMENTUM
    )


def _positive_int(value: Any, key: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class RTMDetSpec:
    """Widths and depths of one RTMDet size (the ``config`` of its registry entry).

    ``stem`` is ``(first, last)`` width of the three stem convs (the first two share ``first``);
    ``stages`` holds ``(width, blocks)`` per backbone stage (CSPNeXt blocks in its CSP layer);
    ``neck_blocks`` the blocks of every neck CSP layer; ``head_width`` the neck's output and the
    head towers' width; ``exp_on_reg`` whether distances are ``exp(output) * stride``.
    """

    stem: tuple[int, int]
    stages: tuple[tuple[int, int], ...]
    neck_blocks: int
    head_width: int
    exp_on_reg: bool

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str = "rtmdet config") -> "RTMDetSpec":
        """Validate a registry ``config`` mapping; errors name the key and the expected form."""
        expected = set(cls.__dataclass_fields__)
        unknown, missing = set(config) - expected, expected - set(config)
        if unknown or missing:
            raise ValueError(
                f"{where}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}; expected exactly {sorted(expected)}"
            )
        stem = config["stem"]
        if not isinstance(stem, (list, tuple)) or len(stem) != 2:
            raise ValueError(f"{where}: 'stem' must be [first width, last width], got {stem!r}")
        stages = config["stages"]
        if not isinstance(stages, (list, tuple)) or len(stages) != len(STAGE_RESIDUALS):
            raise ValueError(f"{where}: 'stages' must list {len(STAGE_RESIDUALS)} [width, blocks] pairs, got {stages!r}")
        parsed_stages = []
        for index, stage in enumerate(stages):
            if not isinstance(stage, (list, tuple)) or len(stage) != 2:
                raise ValueError(f"{where}: 'stages[{index}]' must be [width, blocks], got {stage!r}")
            parsed_stages.append(
                (_positive_int(stage[0], f"stages[{index}][0]", where), _positive_int(stage[1], f"stages[{index}][1]", where))
            )
        if not isinstance(config["exp_on_reg"], bool):
            raise ValueError(f"{where}: 'exp_on_reg' must be true or false, got {config['exp_on_reg']!r}")
        return cls(
            stem=(_positive_int(stem[0], "stem[0]", where), _positive_int(stem[1], "stem[1]", where)),
            stages=tuple(parsed_stages),
            neck_blocks=_positive_int(config["neck_blocks"], "neck_blocks", where),
            head_width=_positive_int(config["head_width"], "head_width", where),
            exp_on_reg=config["exp_on_reg"],
        )


class ChannelAttention(nn.Module):
    """Squeeze-and-excitation without reduction: ``x * hardsigmoid(conv1×1(avgpool(x)))``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.fc = nn.Conv2d(channels, channels, 1)
        self.gate = nn.Hardsigmoid(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Re-weight the channels of ``x``."""
        return x * self.gate(self.fc(x.mean(dim=(2, 3), keepdim=True)))


class CSPNeXtBlock(nn.Module):
    """3×3 conv, then a depthwise-separable large-kernel conv (5×5 depthwise, 1×1 pointwise)."""

    def __init__(self, channels: int, *, residual: bool, kernel_size: int = BLOCK_KERNEL) -> None:
        super().__init__()
        self.conv = _conv(channels, channels, 3)
        self.depthwise = _conv(channels, channels, kernel_size, groups=channels)
        self.pointwise = _conv(channels, channels, 1)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        y = self.pointwise(self.depthwise(self.conv(x)))
        return x + y if self.residual else y


class CSPNeXtLayer(nn.Module):
    """CSP layer: a 1×1 ``main`` path through ``blocks`` CSPNeXt blocks and a 1×1 ``bypass``,
    concatenated (main first), optionally channel-attended, merged by a 1×1 conv. The hidden
    width is half the output width."""

    def __init__(self, in_channels: int, out_channels: int, blocks: int, *, residual: bool, attention: bool) -> None:
        super().__init__()
        hidden = out_channels // 2
        self.main = _conv(in_channels, hidden, 1)
        self.bypass = _conv(in_channels, hidden, 1)
        self.blocks = nn.Sequential(*(CSPNeXtBlock(hidden, residual=residual) for _ in range(blocks)))
        self.attention = ChannelAttention(2 * hidden) if attention else None
        self.merge = _conv(2 * hidden, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer."""
        y = torch.cat((self.blocks(self.main(x)), self.bypass(x)), dim=1)
        if self.attention is not None:
            y = self.attention(y)
        return self.merge(y)


class SpatialPyramidPooling(nn.Module):
    """SPP (mmdetection's ``SPPBottleneck``): 1×1 halving conv, the map and its stride-1 max pools
    of sizes 5, 9, 13 in parallel, concatenated and merged by a 1×1 conv."""

    def __init__(self, in_channels: int, out_channels: int, kernel_sizes: Sequence[int] = SPP_KERNELS) -> None:
        super().__init__()
        hidden = in_channels // 2
        self.reduce = _conv(in_channels, hidden, 1)
        self.pools = nn.ModuleList(nn.MaxPool2d(size, 1, size // 2) for size in kernel_sizes)
        self.aggregate = _conv(hidden * (len(kernel_sizes) + 1), out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the pyramid pooling."""
        x = self.reduce(x)
        return self.aggregate(torch.cat([x, *(pool(x) for pool in self.pools)], dim=1))


class CSPNeXtStage(nn.Module):
    """One backbone stage: stride-2 3×3 conv, SPP (last stage only), CSP layer with attention."""

    def __init__(self, in_channels: int, out_channels: int, blocks: int, *, residual: bool, spp: bool) -> None:
        super().__init__()
        self.downsample = _conv(in_channels, out_channels, 3, 2)
        self.spp = SpatialPyramidPooling(out_channels, out_channels) if spp else None
        self.csp = CSPNeXtLayer(out_channels, out_channels, blocks, residual=residual, attention=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Halve the resolution and transform."""
        x = self.downsample(x)
        if self.spp is not None:
            x = self.spp(x)
        return self.csp(x)


class CSPNeXtBackbone(nn.Module):
    """Stem and four stages; returns the P3, P4, P5 maps (strides 8, 16, 32)."""

    def __init__(self, spec: RTMDetSpec, in_channels: int = 3) -> None:
        super().__init__()
        first, last = spec.stem
        self.stem = nn.Sequential(_conv(in_channels, first, 3, 2), _conv(first, first, 3), _conv(first, last, 3))
        self.stages = nn.ModuleList()
        width = last
        for index, ((out_channels, blocks), residual) in enumerate(zip(spec.stages, STAGE_RESIDUALS)):
            self.stages.append(
                CSPNeXtStage(width, out_channels, blocks, residual=residual, spp=index == len(spec.stages) - 1)
            )
            width = out_channels
        self.out_channels = [out_channels for out_channels, _ in spec.stages[1:]]

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        """P3, P4, P5 feature maps."""
        x = self.stem(images)
        levels = []
        for index, stage in enumerate(self.stages):
            x = stage(x)
            if index >= 1:
                levels.append(x)
        return levels


def _upsample(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, scale_factor=2.0, mode="nearest")


class CSPNeXtPAFPN(nn.Module):
    """PAFPN with CSP layers (no attention, no residuals) and a 3×3 output conv per level.

    Top-down, from the coarsest level: the running map is reduced by a 1×1 conv to the next
    finer level's width (the reduced map is also what the bottom-up path later concatenates),
    upsampled, concatenated with that level's input and fused by a CSP layer. Bottom-up: a
    stride-2 3×3 conv, concat with the top-down map of the coarser level, CSP layer.
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int, blocks: int) -> None:
        super().__init__()
        widths = list(in_channels)
        levels = len(widths)
        self.lateral = nn.ModuleList()  # coarsest first
        self.top_down = nn.ModuleList()
        for level in range(levels - 1, 0, -1):
            self.lateral.append(_conv(widths[level], widths[level - 1], 1))
            self.top_down.append(
                CSPNeXtLayer(2 * widths[level - 1], widths[level - 1], blocks, residual=False, attention=False)
            )
        self.downsample = nn.ModuleList()  # finest first
        self.bottom_up = nn.ModuleList()
        for level in range(levels - 1):
            self.downsample.append(_conv(widths[level], widths[level], 3, 2))
            self.bottom_up.append(
                CSPNeXtLayer(2 * widths[level], widths[level + 1], blocks, residual=False, attention=False)
            )
        self.outputs = nn.ModuleList(_conv(width, out_channels, 3) for width in widths)
        self.out_channels = [out_channels] * levels

    def forward(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Head inputs (finest first) from backbone maps (finest first)."""
        levels = len(features)
        # top_down_maps[level]: the map the bottom-up path concatenates at that level.
        top_down_maps: list[torch.Tensor] = [features[-1]] * levels
        running = features[-1]
        for step, level in enumerate(range(levels - 1, 0, -1)):
            reduced = self.lateral[step](running)
            top_down_maps[level] = reduced
            running = self.top_down[step](torch.cat((_upsample(reduced), features[level - 1]), dim=1))
        top_down_maps[0] = running
        outputs = [running]
        for level in range(levels - 1):
            merged = torch.cat((self.downsample[level](outputs[-1]), top_down_maps[level + 1]), dim=1)
            outputs.append(self.bottom_up[level](merged))
        return [conv(output) for conv, output in zip(self.outputs, outputs)]


def shared_tower_convs(in_channels: int, width: int, count: int) -> nn.ModuleList:
    """The ``count`` bias-free 3×3 convs of a head tower that every pyramid level shares (RTMDet's ``share_conv``)."""
    return nn.ModuleList(nn.Conv2d(in_channels if index == 0 else width, width, 3, padding=1, bias=False) for index in range(count))


def per_level_norms(width: int, count: int, levels: int) -> nn.ModuleList:
    """Each level's own BatchNorms of a shared tower: ``norms[level][index]`` follows conv ``index``."""
    return nn.ModuleList(
        nn.ModuleList(nn.BatchNorm2d(width, eps=BN_EPS, momentum=BN_MOMENTUM) for _ in range(count)) for _ in range(levels)
    )


def apply_shared_tower(x: torch.Tensor, convs: nn.ModuleList, norms: nn.ModuleList, activation: nn.Module) -> torch.Tensor:
    """One level's pass through a shared tower: each shared conv, that level's norm, the activation."""
    for conv, norm in zip(convs, norms):
        x = activation(norm(conv(x)))
    return x


@torch.no_grad()
def initialize_dense_head(head: nn.Module, class_preds: nn.ModuleList) -> None:
    """mmdetection's RTMDet head init: every conv N(0, 0.01) with zero bias, the class convs' bias at the
    logit of a 1% prior (``bias_init_with_prob(0.01)``), so a fresh head scores about 0.01 everywhere."""
    for module in head.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.normal_(module.weight, std=0.01)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    prior_logit = -math.log((1 - CLASS_PRIOR_PROBABILITY) / CLASS_PRIOR_PROBABILITY)
    for conv in class_preds:
        nn.init.constant_(conv.bias, prior_logit)


class SharedConvSeparateNormHead(nn.Module):
    """RTMDet's head: classification and regression towers whose convs are shared by all levels,
    with separate BatchNorms per level, and per-level 1×1 prediction convs.

    Output dict (the layout of ``zoo_core.nn.detection_head``, with distances instead of DFL bins):

    - ``class_logits`` N×A×C; ``box_distances`` N×A×4 (left, top, right, bottom in input pixels);
    - ``anchor_points`` A×2 (cell corners, input pixels); ``anchor_strides`` A×1;
    - in eval mode also ``boxes`` (N×A×4 xyxy) and ``scores`` (N×A×C probabilities).
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: int,
        width: int,
        strides: Sequence[int] = STRIDES,
        *,
        stacked_convs: int = HEAD_STACKED_CONVS,
        exp_on_reg: bool = False,
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.strides = tuple(int(stride) for stride in strides)
        self.exp_on_reg = exp_on_reg
        levels = len(self.strides)

        self.cls_convs = shared_tower_convs(in_channels, width, stacked_convs)
        self.reg_convs = shared_tower_convs(in_channels, width, stacked_convs)
        self.cls_norms = per_level_norms(width, stacked_convs, levels)
        self.reg_norms = per_level_norms(width, stacked_convs, levels)
        self.cls_preds = nn.ModuleList(nn.Conv2d(width, num_classes, 1) for _ in range(levels))
        self.reg_preds = nn.ModuleList(nn.Conv2d(width, 4, 1) for _ in range(levels))
        self.activation = nn.SiLU(inplace=True)
        self.initialize_weights()

    @torch.no_grad()
    def initialize_weights(self) -> None:
        """mmdetection's RTMDetSepBNHead init: convs N(0, 0.01), zero biases, class bias at the
        logit of a 1% prior."""
        initialize_dense_head(self, self.cls_preds)

    def _tower(self, x: torch.Tensor, convs: nn.ModuleList, norms: nn.ModuleList) -> torch.Tensor:
        return apply_shared_tower(x, convs, norms, self.activation)

    def forward(self, features: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Raw (and in eval mode decoded) dense predictions of the pyramid ``features``."""
        if len(features) != len(self.strides):
            raise ValueError(f"the head expects {len(self.strides)} feature levels, got {len(features)}")
        class_maps, distance_maps = [], []
        for level, (feature, stride) in enumerate(zip(features, self.strides)):
            class_maps.append(self.cls_preds[level](self._tower(feature, self.cls_convs, self.cls_norms[level])).flatten(2))
            regression = self.reg_preds[level](self._tower(feature, self.reg_convs, self.reg_norms[level]))
            if self.exp_on_reg:
                regression = regression.exp()
            distance_maps.append((regression * stride).flatten(2))
        class_logits = torch.cat(class_maps, dim=2).transpose(1, 2)
        box_distances = torch.cat(distance_maps, dim=2).transpose(1, 2)
        anchor_points, anchor_strides = make_anchor_points(
            [tuple(feature.shape[2:]) for feature in features], self.strides, offset=0.0, device=class_logits.device
        )
        outputs = {
            "class_logits": class_logits,
            "box_distances": box_distances,
            "anchor_points": anchor_points,
            "anchor_strides": anchor_strides,
        }
        if not self.training:
            outputs["boxes"] = distances_to_boxes(box_distances.float(), anchor_points)
            outputs["scores"] = class_logits.sigmoid()
        return outputs


class CSPNeXtFeatures(nn.Module):
    """What RTMDet and RTMDet-Ins share: the input normalisation, the CSPNeXt backbone and the PAFPN neck.

    ``pyramid(images)`` (N×3×H×W RGB in [0, 1], H and W multiples of 32) returns the neck's
    maps at strides 8, 16, 32, each ``spec.head_width`` channels wide.
    """

    def __init__(self, spec: RTMDetSpec) -> None:
        super().__init__()
        self.strides = STRIDES
        self.max_stride = max(STRIDES)
        std = torch.tensor(RGB_STD).reshape(1, 3, 1, 1)
        self.register_buffer("input_scale", 255.0 / std, persistent=False)
        self.register_buffer("input_shift", -torch.tensor(RGB_MEAN).reshape(1, 3, 1, 1) / std, persistent=False)
        self.backbone = CSPNeXtBackbone(spec)
        self.neck = CSPNeXtPAFPN(self.backbone.out_channels, spec.head_width, spec.neck_blocks)

    def pyramid(self, images: torch.Tensor) -> list[torch.Tensor]:
        """The neck's feature maps of ``images`` (finest first); a clear error for a wrong input shape."""
        if images.dim() != 4 or images.shape[2] % self.max_stride or images.shape[3] % self.max_stride:
            raise ValueError(
                f"{type(self).__name__} takes N×3×H×W images with H and W multiples of {self.max_stride}, "
                f"got {tuple(images.shape)}; letterbox or resize the input"
            )
        normalised = torch.addcmul(self.input_shift, images, self.input_scale)
        return self.neck(self.backbone(normalised))


class RTMDet(DenseDetectionPostprocess, CSPNeXtFeatures):
    """The RTMDet detector (CSPNeXt + CSPNeXt-PAFPN + shared-conv head), zoo's detection model contract.

    - ``forward(images)`` (N×3×H×W RGB in [0, 1], H and W multiples of 32) returns the head dict
      of ``SharedConvSeparateNormHead``.
    - ``loss(outputs, batch)``: dynamic soft-label assignment, quality focal loss (weight 1) +
      GIoU (weight 2), normalised by the (all-ranks mean) sum of the positives' IoUs.
    - ``postprocess(outputs, conf, iou, max_det)``: multi-label per-class NMS (mmdetection's
      ``multiclass_nms``; RTMDet's test config uses iou 0.65, score 0.001, 300 per image).
    """

    # mmdetection's test_cfg: every class above the threshold, nms_pre 30000 (anchor, class) pairs per level.
    nms_defaults = DenseNMSDefaults(iou=0.65, multi_label=True, per_level_candidates=30000)

    def __init__(self, num_classes: int, spec: RTMDetSpec) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        super().__init__(spec)
        self.num_classes = num_classes
        self.head = SharedConvSeparateNormHead(num_classes, spec.head_width, spec.head_width, STRIDES, exp_on_reg=spec.exp_on_reg)
        self.criterion = RTMDetLoss(num_classes)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Dense predictions of ``images``; see ``SharedConvSeparateNormHead`` for the dict's keys."""
        return self.head(self.pyramid(images))

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)`` for a detection batch (``images``, ``targets`` M×6 in input pixels)."""
        terms = self.criterion(outputs, batch["targets"], int(batch["images"].shape[0]))
        return terms.cls + terms.box, {"cls": terms.cls.detach(), "box": terms.box.detach()}

    def decode(self, outputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(boxes N×A×4 xyxy in input pixels, scores N×A×C)`` from the raw head outputs."""
        return distances_to_boxes(outputs["box_distances"].float(), outputs["anchor_points"]), outputs["class_logits"].sigmoid()

    def dense_candidates(self, outputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoded boxes and scores, with the scores of empty or inverted boxes zeroed before NMS.

        RTMDet-t/s regress distances without ``exp``, so a distance can be negative and a box
        empty or inverted; such boxes are dropped, as LibreYOLO's postprocess drops boxes of
        non-positive width or height.
        """
        boxes, scores = super().dense_candidates(outputs)
        proper = (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])
        return boxes, scores * proper[..., None].to(scores.dtype)


def build_rtmdet(request: BuildRequest) -> RTMDet:
    """The registry builder of ``rtmdet``: ``request.config`` is the size's ``RTMDetSpec`` data."""
    if request.options:
        raise ValueError(f"rtmdet takes no build options, got {sorted(request.options)}")
    spec = RTMDetSpec.from_config(request.config, where=f"registry.yaml rtmdet size {request.size!r} config")
    return RTMDet(request.num_classes, spec)
