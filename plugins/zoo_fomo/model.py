"""FOMO, "Faster Objects, More Objects" (Edge Impulse, 2022): centroid detection on a coarse grid.

A MobileNetV2 (Sandler et al., 2018) cut after the expansion conv of its seventh inverted-residual
block (Keras ``block_6_expand_relu``), i.e. at 1/8 of the input resolution, followed by a 1×1
conv that gives, for every cell, logits over background (channel 0) and the object classes.
Objects are found as cells whose best object class is likely enough; their position is the cell
centre. Training targets are ordinary boxes turned into the cell that holds each box centre.

The backbone is written out here (not taken from timm) because FOMO cuts MobileNetV2 inside a
block and uses TensorFlow "SAME" padding (asymmetric for stride 2: nothing before, one row and
column after for even sizes), which the Keras model and LibreYOLO 1.6.0's port use; timm's
MobileNetV2 pads symmetrically. BatchNorm eps is 1e-3 (Keras), activations ReLU6.

Sizes follow LibreYOLO 1.6.0 (``models/fomo/nn.py``): width multiplier 0.35 / 0.5 / 1.0 at
96 / 192 / 224 pixels; Edge Impulse's default FOMO is the 0.35 one at 96×96. LibreYOLO's head
is one 1×1 conv; Edge Impulse's default head has a 32-filter 1×1 ReLU layer before it.

Input: RGB in [0, 1]; the model maps it to [-1, 1] itself (Keras MobileNetV2 preprocessing,
LibreYOLO's ``(x - 0.5) / 0.5``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import nms

from zoo_core.building import BuildRequest
from zoo_core.ops.distributed import mean_over_ranks

__all__ = [
    "FomoSpec",
    "SamePadConv2d",
    "InvertedResidual",
    "FomoBackbone",
    "Fomo",
    "build_fomo",
    "centroid_targets",
    "decode_centroids",
]

STRIDE = 8
EXPANSION = 6
BN_EPS = 1e-3
OBJECT_WEIGHT = 100.0  # Edge Impulse's object_weight; LibreYOLO FOMOConfig.fg_weight
BUILD_OPTIONS = ("object_weight",)


def _make_divisible(value: float, divisor: int = 8) -> int:
    """MobileNet's channel rounding: nearest multiple of ``divisor``, never below 90 % of ``value``."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


@dataclass(frozen=True)
class FomoSpec:
    """One FOMO size: the MobileNetV2 width multiplier (the ``config`` of its registry entry)."""

    width: float

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str = "fomo config") -> "FomoSpec":
        """Validate a registry ``config`` mapping."""
        if set(config) != {"width"}:
            raise ValueError(f"{where}: expected exactly the key 'width', got {sorted(config)}")
        width = config["width"]
        if not isinstance(width, (int, float)) or isinstance(width, bool) or width <= 0:
            raise ValueError(f"{where}: 'width' must be a positive number, got {width!r}")
        return cls(float(width))

    def channels(self) -> tuple[int, int, int, int]:
        """Widths of the stem and of MobileNetV2's first three stages (32, 16, 24, 32 × width)."""
        return tuple(_make_divisible(c * self.width) for c in (32, 16, 24, 32))  # type: ignore[return-value]


class SamePadConv2d(nn.Conv2d):
    """``Conv2d`` with TensorFlow "SAME" padding computed from the input size (output = ceil(in / stride))."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1, bias: bool = False
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding=0, groups=groups, bias=bias)

    @staticmethod
    def _pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
        total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
        return total // 2, total - total // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, bottom = self._pads(x.shape[-2], self.kernel_size[0], self.stride[0])
        left, right = self._pads(x.shape[-1], self.kernel_size[1], self.stride[1])
        if top or bottom or left or right:
            x = F.pad(x, (left, right, top, bottom))
        return self._conv_forward(x, self.weight, self.bias)


def _conv_bn(
    in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1, groups: int = 1, relu6: bool = True
) -> nn.Sequential:
    layers: list[nn.Module] = [
        SamePadConv2d(in_channels, out_channels, kernel_size, stride, groups=groups),
        nn.BatchNorm2d(out_channels, eps=BN_EPS),
    ]
    if relu6:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1×1 expansion (absent at ratio 1), 3×3 depthwise, linear 1×1 projection,
    and a residual when the block keeps width and resolution."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = int(round(in_channels * expansion))
        self.expand = _conv_bn(in_channels, hidden) if expansion != 1 else None
        self.depthwise = _conv_bn(hidden, hidden, 3, stride, groups=hidden)
        self.project = _conv_bn(hidden, out_channels, relu6=False)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.expand(x) if self.expand is not None else x
        y = self.project(self.depthwise(y))
        return x + y if self.residual else y


class FomoBackbone(nn.Module):
    """MobileNetV2 up to ``block_6_expand_relu``: stem, blocks 0-5, and block 6's expansion conv."""

    def __init__(self, spec: FomoSpec) -> None:
        super().__init__()
        stem, c1, c2, c3 = spec.channels()
        self.stem = _conv_bn(3, stem, 3, 2)
        # (out, stride, expansion) of MobileNetV2's blocks 0-5: stages of 16 (×1), 24 (×2), 32 (×3).
        layout = [(c1, 1, 1), (c2, 2, EXPANSION), (c2, 1, EXPANSION), (c3, 2, EXPANSION), (c3, 1, EXPANSION), (c3, 1, EXPANSION)]
        blocks, width = [], stem
        for out, stride, expansion in layout:
            blocks.append(InvertedResidual(width, out, stride, expansion))
            width = out
        self.blocks = nn.Sequential(*blocks)
        self.cut = _conv_bn(width, width * EXPANSION)
        self.out_channels = width * EXPANSION

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.cut(self.blocks(self.stem(images)))


@torch.no_grad()
def centroid_targets(targets: torch.Tensor, batch_size: int, grid_hw: tuple[int, int], image_hw: tuple[int, int]) -> torch.Tensor:
    """Per-cell class targets (N×h×w int64; 0 background, ``class + 1`` objects) from M×6 boxes.

    Each box marks the cell holding its centre (``floor(centre / image size × grid size)``,
    clamped to the grid). When several boxes share a cell the last one in ``targets`` wins, as in
    LibreYOLO's (sequential) encoder; decided here with a scatter-max over row numbers.
    """
    grid_h, grid_w = grid_hw
    height, width = image_hw
    cells = torch.zeros(batch_size * grid_h * grid_w, dtype=torch.int64, device=targets.device)
    if targets.shape[0] == 0:
        return cells.view(batch_size, grid_h, grid_w)
    centre_x = (targets[:, 2] + targets[:, 4]) / 2
    centre_y = (targets[:, 3] + targets[:, 5]) / 2
    column = (centre_x / width * grid_w).floor().long().clamp(0, grid_w - 1)
    row = (centre_y / height * grid_h).floor().long().clamp(0, grid_h - 1)
    flat = (targets[:, 0].long() * grid_h + row) * grid_w + column
    order = torch.arange(len(targets), device=targets.device)
    last = torch.full_like(cells, -1).scatter_reduce(0, flat, order, reduce="amax")
    cells = torch.where(last >= 0, targets[last.clamp(min=0), 1].long() + 1, cells)
    return cells.view(batch_size, grid_h, grid_w)


@torch.no_grad()
def decode_centroids(
    logits: torch.Tensor, image_hw: tuple[int, int], conf: float = 0.5, radius: int = 1, max_det: int = 300
) -> list[dict[str, torch.Tensor]]:
    """Object centroids per image from N×(1+C)×h×w logits.

    A cell is a candidate when its most likely object class has softmax probability above
    ``conf``; candidates are kept greedily by decreasing score, each suppressing the
    (class-agnostic) candidates within ``radius`` cells (Chebyshev distance), as LibreYOLO's
    decoder does. The greedy pass is ``torchvision.ops.nms`` on squares of ``radius + 1`` cells,
    which overlap exactly when two cells are within ``radius``.

    Returns dicts with ``points`` (n×2: x, y of the cell centres in input pixels), ``scores`` (n)
    and ``labels`` (n, int64, object classes from 0), sorted by decreasing score.
    """
    if not 0.0 <= conf <= 1.0:
        raise ValueError(f"conf={conf} must be a probability between 0 and 1")
    if radius < 0 or max_det < 1:
        raise ValueError(f"radius must be >= 0 and max_det >= 1, got {radius} and {max_det}")
    grid_h, grid_w = logits.shape[-2:]
    probabilities = logits.float().softmax(dim=1)[:, 1:]
    scores, labels = probabilities.max(dim=1)  # N×h×w
    cell_w, cell_h = image_hw[1] / grid_w, image_hw[0] / grid_h
    half = (radius + 1) / 2
    results = []
    for image_scores, image_labels in zip(scores, labels):
        rows, columns = (image_scores > conf).nonzero(as_tuple=True)
        candidate_scores = image_scores[rows, columns]
        squares = torch.stack((columns - half, rows - half, columns + half, rows + half), dim=1).float()
        keep = nms(squares, candidate_scores, 0.0)[:max_det]
        points = torch.stack(((columns[keep] + 0.5) * cell_w, (rows[keep] + 0.5) * cell_h), dim=1).float()
        results.append({"points": points, "scores": candidate_scores[keep], "labels": image_labels[rows[keep], columns[keep]]})
    return results


class Fomo(nn.Module):
    """The FOMO centroid detector.

    - ``forward(images)`` (N×3×H×W RGB in [0, 1], H and W multiples of 8): logits
      N×(1+C)×H/8×W/8, background first.
    - ``loss(outputs, batch)``: per-cell cross-entropy against ``centroid_targets`` of the batch's
      boxes, object cells weighted ``object_weight`` (100), background 1; the weighted sum over
      the batch's cells divided by the sum of the weights (averaged over DDP ranks).
    - ``postprocess(outputs, conf, iou, max_det, radius=1)``: centroids per image
      (``decode_centroids``); ``iou`` is ignored (suppression is by cell distance).
    """

    def __init__(self, num_classes: int, spec: FomoSpec, *, object_weight: float = OBJECT_WEIGHT) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1 object class, got {num_classes}")
        self.num_classes = num_classes
        self.stride = STRIDE
        self.object_weight = float(object_weight)
        self.backbone = FomoBackbone(spec)
        self.head = nn.Conv2d(self.backbone.out_channels, num_classes + 1, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Per-cell logits (background first) of ``images`` in [0, 1]."""
        if images.dim() != 4 or images.shape[2] % STRIDE or images.shape[3] % STRIDE:
            raise ValueError(f"FOMO takes N×3×H×W images with H and W multiples of {STRIDE}, got {tuple(images.shape)}")
        return self.head(self.backbone(images * 2.0 - 1.0))

    def loss(self, outputs: torch.Tensor, batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, {"ce": loss})``: the weighted per-cell cross-entropy (see the class docstring)."""
        images = batch["images"]
        grid_hw, image_hw = tuple(outputs.shape[-2:]), tuple(images.shape[-2:])
        cells = centroid_targets(batch["targets"].to(outputs.device), int(images.shape[0]), grid_hw, image_hw)
        weights = torch.full((self.num_classes + 1,), self.object_weight, device=outputs.device)
        weights[0] = 1.0
        per_cell = F.cross_entropy(outputs.float(), cells, reduction="none")
        cell_weights = weights[cells]
        # PyTorch's weighted mean (LibreYOLO's), its denominator averaged over DDP ranks so two
        # ranks at batch B/2 give one process's gradient at batch B.
        loss = (per_cell * cell_weights).sum() / mean_over_ranks(cell_weights.sum())
        return loss, {"ce": loss.detach()}

    @torch.no_grad()
    def postprocess(
        self, outputs: torch.Tensor, conf: float = 0.5, iou: float | None = None, max_det: int = 300, *, radius: int = 1
    ) -> list[dict[str, torch.Tensor]]:
        """Centroids per image: ``points`` (n×2 x, y input pixels), ``scores``, ``labels`` (int64)."""
        del iou
        image_hw = (outputs.shape[-2] * STRIDE, outputs.shape[-1] * STRIDE)
        return decode_centroids(outputs, image_hw, conf, radius, max_det)


def build_fomo(request: BuildRequest) -> Fomo:
    """The registry builder of ``fomo``; option ``object_weight`` (default 100) weights object cells."""
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"fomo does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    object_weight = request.options.get("object_weight", OBJECT_WEIGHT)
    if not isinstance(object_weight, (int, float)) or object_weight <= 0:
        raise ValueError(f"fomo option object_weight must be a positive number, got {object_weight!r}")
    spec = FomoSpec.from_config(request.config, where=f"registry.yaml fomo size {request.size!r} config")
    return Fomo(request.num_classes, spec, object_weight=object_weight)
