"""The decoupled anchor-free detection head with Distribution Focal Loss box regression.

This is the head of YOLOv8 and YOLOv9 ("DDetect"): at every level (stride) of a feature
pyramid, each cell is one anchor point; a box branch predicts, for each of the four sides, a
distribution over ``reg_max`` distance bins (Li et al., Generalized Focal Loss, 2020) and a class
branch predicts one logit per class. Decoding takes the expectation of each distribution (in
strides) and measures it from the anchor point.

The head's output is a dict of tensors (DDP-friendly, picklable) that both a loss and a
postprocess consume:

- ``box_logits``: N×A×(4·reg_max), the raw distance-bin logits, sides in l, t, r, b order;
- ``class_logits``: N×A×C;
- ``anchor_points``: A×2 anchor centres in input pixels; ``anchor_strides``: A×1.

In eval mode it also holds ``boxes`` (N×A×4 xyxy in input pixels) and ``scores`` (N×A×C
probabilities), what NMS needs.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from zoo_core.nn.conv import ConvNormAct
from zoo_core.ops.boxes import distances_to_boxes

__all__ = [
    "DecoupledDetectionHead",
    "make_anchor_points",
    "distribution_to_distances",
    "decode_dense_predictions",
]


def make_anchor_points(
    feature_sizes: Sequence[tuple[int, int]],
    strides: Sequence[int],
    *,
    offset: float = 0.5,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor centres of every cell of every level, in input pixels, and the stride of each.

    Cells are enumerated level by level, row-major inside a level (the order in which a head
    flattens its N×C×H×W maps). ``offset=0.5`` puts each anchor at its cell's centre.
    Returns ``(points A×2 as x, y; strides A×1)``.
    """
    if len(feature_sizes) != len(strides):
        raise ValueError(f"got {len(feature_sizes)} feature sizes but {len(strides)} strides; give one stride per level")
    points, point_strides = [], []
    for (height, width), stride in zip(feature_sizes, strides):
        ys = (torch.arange(height, device=device, dtype=dtype) + offset) * stride
        xs = (torch.arange(width, device=device, dtype=dtype) + offset) * stride
        grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
        points.append(torch.stack((grid_x, grid_y), dim=-1).reshape(-1, 2))
        point_strides.append(torch.full((height * width, 1), float(stride), device=device, dtype=dtype))
    return torch.cat(points), torch.cat(point_strides)


def distribution_to_distances(box_logits: torch.Tensor, reg_max: int) -> torch.Tensor:
    """Expected distance (in bins, i.e. strides) of each side: ``(..., 4·reg_max)`` logits → ``(..., 4)``."""
    if box_logits.shape[-1] != 4 * reg_max:
        raise ValueError(f"box logits end in {box_logits.shape[-1]} values; expected 4 sides × reg_max={reg_max}")
    if box_logits.dim() == 3:
        # A head's N×A×(4·R) output is a transposed view of N×(4·R)×A maps: reduce the bins there
        # (N×4×R×A, anchors innermost), as LibreYOLO's and the official DFL modules do. Same
        # arithmetic in the same order, so decoded boxes match theirs bit for bit (a matmul over the
        # bins rounds differently: up to 1-2 float32 steps of a box coordinate).
        per_side = box_logits.transpose(1, 2).unflatten(1, (4, reg_max))
        probabilities = per_side.softmax(dim=2)
        bins = torch.arange(reg_max, device=box_logits.device, dtype=probabilities.dtype).view(1, 1, reg_max, 1)
        return (probabilities * bins).sum(dim=2).transpose(1, 2)
    probabilities = box_logits.unflatten(-1, (4, reg_max)).softmax(dim=-1)
    bins = torch.arange(reg_max, device=box_logits.device, dtype=probabilities.dtype)
    return probabilities @ bins


def decode_dense_predictions(outputs: dict[str, torch.Tensor], reg_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(boxes N×A×4 xyxy in input pixels, scores N×A×C probabilities)`` from a head's raw outputs.

    LibreYOLO and the official code decode in grid units and multiply by the stride last,
    ``(anchor / s ∓ d) · s``; with power-of-two strides that is bit-identical to ``anchor ∓ d · s``
    computed here (scaling by 2^k is exact in floating point), so the order is left as it is.
    """
    distances = distribution_to_distances(outputs["box_logits"], reg_max) * outputs["anchor_strides"]
    boxes = distances_to_boxes(distances, outputs["anchor_points"])
    return boxes, outputs["class_logits"].sigmoid()


def _round_up(value: int, multiple: int) -> int:
    return math.ceil(value / multiple) * multiple


class DecoupledDetectionHead(nn.Module):
    """Per level: a box branch (3×3, 3×3, 1×1 to 4·reg_max) and a class branch (3×3, 3×3, 1×1 to C).

    Widths, unless given, with ``c0`` the channels of the first (finest) level: the box branch
    has ``max(round_up(c0 // 4, 4), 4·reg_max, 16)`` channels and the class branch
    ``max(c0, min(C, 100))`` (YOLOv8's rule, and the one behind the published YOLOv9 models:
    with it YOLOv9-T has its published 2.0M parameters and 7.7 GFLOPs, while the
    ``max(c0, min(2·C, 128))`` of the original DDetect code would give 2.4M and 9.8 GFLOPs; the
    two rules agree for YOLOv9-S/M/C). ``box_groups`` makes the box branch's second 3×3 and final
    1×1 grouped convolutions (YOLOv9's DDetect uses 4, one group per side; YOLOv8 uses 1).
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: Sequence[int],
        strides: Sequence[int],
        *,
        reg_max: int = 16,
        box_groups: int = 1,
        box_channels: int | None = None,
        class_channels: int | None = None,
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        if len(in_channels) != len(strides):
            raise ValueError(f"got {len(in_channels)} input levels but {len(strides)} strides; give one stride per level")
        if reg_max < 2:
            raise ValueError(f"reg_max must be at least 2 distance bins, got {reg_max}")
        self.num_classes = num_classes
        self.reg_max = reg_max
        self.strides = tuple(int(stride) for stride in strides)
        first = in_channels[0]
        box_channels = box_channels or max(_round_up(first // 4, 4), 4 * reg_max, 16)
        class_channels = class_channels or max(first, min(num_classes, 100))
        self.box_branches = nn.ModuleList(
            nn.Sequential(
                ConvNormAct(channels, box_channels, 3),
                ConvNormAct(box_channels, box_channels, 3, groups=box_groups),
                nn.Conv2d(box_channels, 4 * reg_max, 1, groups=box_groups),
            )
            for channels in in_channels
        )
        self.class_branches = nn.ModuleList(
            nn.Sequential(
                ConvNormAct(channels, class_channels, 3),
                ConvNormAct(class_channels, class_channels, 3),
                nn.Conv2d(class_channels, num_classes, 1),
            )
            for channels in in_channels
        )
        self.initialize_biases()

    @torch.no_grad()
    def initialize_biases(self, reference_size: int = 640, objects_per_image: float = 5.0) -> None:
        """YOLO's prior: box logits start flat (bias 1) and class probabilities near the expected
        density of ``objects_per_image`` objects spread over classes and cells of a
        ``reference_size`` image, so early training is not swamped by false positives."""
        for box_branch, class_branch, stride in zip(self.box_branches, self.class_branches, self.strides):
            box_branch[-1].bias.fill_(1.0)
            cells = (reference_size / stride) ** 2
            class_branch[-1].bias.fill_(math.log(objects_per_image / self.num_classes / cells))

    def forward(self, features: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Raw (and in eval mode decoded) dense predictions of the pyramid ``features``."""
        if len(features) != len(self.strides):
            raise ValueError(f"the head expects {len(self.strides)} feature levels, got {len(features)}")
        box_logits = torch.cat(
            [branch(level).flatten(2) for branch, level in zip(self.box_branches, features)], dim=2
        ).transpose(1, 2)
        class_logits = torch.cat(
            [branch(level).flatten(2) for branch, level in zip(self.class_branches, features)], dim=2
        ).transpose(1, 2)
        # Anchors stay float32 under autocast: half precision cannot hold pixel centres of large inputs.
        anchor_points, anchor_strides = make_anchor_points(
            [tuple(level.shape[2:]) for level in features], self.strides, device=box_logits.device
        )
        outputs = {
            "box_logits": box_logits,
            "class_logits": class_logits,
            "anchor_points": anchor_points,
            "anchor_strides": anchor_strides,
        }
        if not self.training:
            outputs["boxes"], outputs["scores"] = decode_dense_predictions(outputs, self.reg_max)
        return outputs
