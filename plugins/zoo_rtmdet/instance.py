"""RTMDet-Ins (Lyu et al., arXiv:2212.07784, section 3.5): RTMDet with dynamic-kernel instance masks.

The backbone and neck are RTMDet's (``model.CSPNeXtFeatures``). The head follows mmdetection's
``RTMDetInsSepBNHead`` (``mmdet/models/dense_heads/rtmdet_ins_head.py``, ``configs/rtmdet/rtmdet-ins_*.py``):

- **box and class**: one tower of two 3×3 convs shared by the levels with each level's own
  BatchNorms. The published head builds a regression tower too but files the *class* tower under
  both names (``self.reg_convs.append(cls_convs)``), so the class and distance convs read the
  same features; zoo keeps that one tower. Distances are ``relu(output) * stride`` for every size
  (the detector's ``exp`` of m/l/x is not used by the instance head).
- **kernels**: a second tower of two 3×3 conv-BN-SiLU per level (not shared), then a 1×1 conv per
  level predicting each anchor's 169 dynamic-kernel parameters: three 1×1 convs of
  ``(8 + 2) -> 8 -> 8 -> 1`` channels, weights then biases (80 + 64 + 8 weights, 8 + 8 + 1 biases).
- **mask features**: the three neck levels resized bilinearly to stride 8, concatenated, a 1×1
  fusion conv, four 3×3 conv-BN-SiLU and a 1×1 projection to 8 channels.

An anchor's mask logits are its kernels applied (ReLU between the convs) to the 8 mask features
plus 2 relative coordinates: ``(anchor point - pixel position) / (anchor stride × 8)`` at every
stride-8 pixel. Masks are learnt with a dice loss at stride 4 (``loss.RTMDetInsLoss``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import batched_nms

from zoo_core.building import BuildRequest
from zoo_core.nn.conv import ConvNormAct
from zoo_core.nn.detection_head import make_anchor_points
from zoo_core.ops.boxes import ImagePlacement, distances_to_boxes

from .loss import RTMDetInsLoss
from .model import (
    BN_EPS,
    BN_MOMENTUM,
    HEAD_STACKED_CONVS,
    STRIDES,
    CSPNeXtFeatures,
    RTMDetSpec,
    apply_shared_tower,
    initialize_dense_head,
    per_level_norms,
    shared_tower_convs,
)

__all__ = [
    "DynamicKernelLayout",
    "dynamic_mask_logits",
    "MaskFeatureBranch",
    "RTMDetInsHead",
    "RTMDetIns",
    "build_rtmdet_ins",
]

MASK_FEATURE_CONVS = 4  # mmdetection MaskFeatModule(stacked_convs=4)
MASK_FEATURE_CHANNELS = 8  # num_prototypes
# mmdetection's rtmdet-ins test_cfg: nms_pre 1000 (per level), score_thr 0.05, nms iou 0.6, max_per_img 100,
# mask_thr_binary 0.5. LibreYOLO 1.6 keeps nms_pre and max_per_img and takes the caller's conf / iou.
CANDIDATES_PER_LEVEL = 1000
MAX_INSTANCES = 100
MASK_THRESHOLD = 0.5


@dataclass(frozen=True)
class DynamicKernelLayout:
    """How a candidate's parameter vector splits into the dynamic convs (all 1×1): first every conv's
    weights, then every conv's biases (mmdetection's ``parse_dynamic_params``)."""

    feature_channels: int = MASK_FEATURE_CHANNELS
    hidden_channels: int = 8
    convs: int = 3

    @property
    def channels(self) -> list[tuple[int, int]]:
        """``(in, out)`` channels of each dynamic conv: the features plus two coordinates in, one logit out."""
        widths = [self.feature_channels + 2] + [self.hidden_channels] * (self.convs - 1) + [1]
        return list(zip(widths[:-1], widths[1:]))

    @property
    def size(self) -> int:
        """Parameters per candidate (169 for the published layout)."""
        return sum(inputs * outputs + outputs for inputs, outputs in self.channels)

    def split(self, parameters: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(weight n×out×in, bias n×out×1)`` per conv from ``parameters`` (n×size)."""
        count = parameters.shape[0]
        weight_sizes = [inputs * outputs for inputs, outputs in self.channels]
        bias_sizes = [outputs for _, outputs in self.channels]
        pieces = torch.split(parameters, weight_sizes + bias_sizes, dim=1)
        weights, biases = pieces[: self.convs], pieces[self.convs :]
        return [
            (weight.reshape(count, outputs, inputs), bias.reshape(count, outputs, 1))
            for weight, bias, (inputs, outputs) in zip(weights, biases, self.channels)
        ]


def dynamic_mask_logits(
    features: torch.Tensor, parameters: torch.Tensor, points: torch.Tensor, strides: torch.Tensor,
    layout: DynamicKernelLayout, feature_stride: float,
) -> torch.Tensor:
    """The n×h×w mask logits of n candidates, each at its own image's mask features.

    ``features`` n×K×h×w (each candidate's image's map; K = ``layout.feature_channels``),
    ``parameters`` n×P kernel parameters, ``points`` n×2 anchor points and ``strides`` n anchor
    strides in input pixels; the map's pixel ``(i, j)`` lies at ``(j, i) * feature_stride`` (no
    half-pixel offset, as mmdetection's prior generator places it). Computed in float32.
    """
    count, _, height, width = features.shape
    if count == 0:
        return features.new_zeros((0, height, width), dtype=torch.float32)
    features, parameters = features.float(), parameters.float()
    xs = torch.arange(width, device=features.device, dtype=torch.float32) * feature_stride
    ys = torch.arange(height, device=features.device, dtype=torch.float32) * feature_stride
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    positions = torch.stack((grid_x, grid_y)).reshape(1, 2, height * width)  # 1×2×hw
    scale = (strides.float().reshape(count, 1, 1) * 8.0)  # mmdetection divides by stride × 8 at every level
    relative = (points.float().reshape(count, 2, 1) - positions) / scale  # n×2×hw
    x = torch.cat((relative, features.reshape(count, -1, height * width)), dim=1)
    convs = layout.split(parameters)
    for index, (weight, bias) in enumerate(convs):
        x = torch.baddbmm(bias, weight, x)
        if index < len(convs) - 1:
            x = F.relu(x)
    return x.reshape(count, height, width)


class MaskFeatureBranch(nn.Module):
    """mmdetection's ``MaskFeatModule``: every neck level at stride 8, fused, four conv-BN-SiLU, projected."""

    def __init__(self, in_channels: int, width: int, levels: int = len(STRIDES), out_channels: int = MASK_FEATURE_CHANNELS) -> None:
        super().__init__()
        self.levels = levels
        self.fusion = nn.Conv2d(levels * in_channels, in_channels, 1)
        self.convs = nn.Sequential(*(
            ConvNormAct(in_channels if index == 0 else width, width, 3, bn_eps=BN_EPS, bn_momentum=BN_MOMENTUM)
            for index in range(MASK_FEATURE_CONVS)
        ))
        self.projection = nn.Conv2d(width, out_channels, 1)

    def forward(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """The K×h×w mask features at the finest level's resolution."""
        size = features[0].shape[-2:]
        resized = [features[0], *(F.interpolate(level, size=size, mode="bilinear", align_corners=False)
                                   for level in features[1 : self.levels])]
        return self.projection(self.convs(self.fusion(torch.cat(resized, dim=1))))


class RTMDetInsHead(nn.Module):
    """RTMDet-Ins's head (module docstring). Output dict:

    - ``class_logits`` N×A×C, ``box_distances`` N×A×4 (input pixels), ``mask_coefficients`` N×A×P
      (each anchor's dynamic-kernel parameters), ``mask_features`` N×K×h×w (stride 8),
      ``anchor_points`` A×2 (cell corners), ``anchor_strides`` A×1;
    - in eval mode also ``boxes`` (N×A×4 xyxy) and ``scores`` (N×A×C probabilities).
    """

    def __init__(self, num_classes: int, width: int, strides: Sequence[int] = STRIDES, *,
                 stacked_convs: int = HEAD_STACKED_CONVS, layout: DynamicKernelLayout = DynamicKernelLayout()) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.strides = tuple(int(stride) for stride in strides)
        self.layout = layout
        levels = len(self.strides)
        self.cls_convs = shared_tower_convs(width, width, stacked_convs)
        self.cls_norms = per_level_norms(width, stacked_convs, levels)
        self.kernel_convs = nn.ModuleList(
            nn.ModuleList(ConvNormAct(width, width, 3, bn_eps=BN_EPS, bn_momentum=BN_MOMENTUM) for _ in range(stacked_convs))
            for _ in range(levels)
        )
        self.cls_preds = nn.ModuleList(nn.Conv2d(width, num_classes, 1) for _ in range(levels))
        self.reg_preds = nn.ModuleList(nn.Conv2d(width, 4, 1) for _ in range(levels))
        self.kernel_preds = nn.ModuleList(nn.Conv2d(width, layout.size, 1) for _ in range(levels))
        self.mask_features = MaskFeatureBranch(width, width, levels, layout.feature_channels)
        self.activation = nn.SiLU(inplace=True)
        self.initialize_weights()

    @torch.no_grad()
    def initialize_weights(self) -> None:
        """mmdetection's ``RTMDetInsSepBNHead.init_weights``: RTMDet's, plus distance biases of 1 (one stride)."""
        initialize_dense_head(self, self.cls_preds)
        for conv in self.reg_preds:
            nn.init.constant_(conv.bias, 1.0)

    def forward(self, features: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Raw (and in eval mode decoded) dense predictions of the pyramid ``features``."""
        if len(features) != len(self.strides):
            raise ValueError(f"the head expects {len(self.strides)} feature levels, got {len(features)}")
        mask_features = self.mask_features(features)
        class_maps, distance_maps, kernel_maps = [], [], []
        for level, (feature, stride) in enumerate(zip(features, self.strides)):
            shared = apply_shared_tower(feature, self.cls_convs, self.cls_norms[level], self.activation)
            class_maps.append(self.cls_preds[level](shared).flatten(2))
            distance_maps.append((F.relu(self.reg_preds[level](shared)) * stride).flatten(2))
            kernel_feature = feature
            for conv in self.kernel_convs[level]:
                kernel_feature = conv(kernel_feature)
            kernel_maps.append(self.kernel_preds[level](kernel_feature).flatten(2))
        class_logits = torch.cat(class_maps, dim=2).transpose(1, 2)
        anchor_points, anchor_strides = make_anchor_points(
            [tuple(feature.shape[2:]) for feature in features], self.strides, offset=0.0, device=class_logits.device
        )
        outputs = {
            "class_logits": class_logits,
            "box_distances": torch.cat(distance_maps, dim=2).transpose(1, 2),
            "mask_coefficients": torch.cat(kernel_maps, dim=2).transpose(1, 2),
            "mask_features": mask_features,
            "anchor_points": anchor_points,
            "anchor_strides": anchor_strides,
        }
        if not self.training:
            outputs["boxes"] = distances_to_boxes(outputs["box_distances"].float(), anchor_points)
            outputs["scores"] = class_logits.sigmoid()
        return outputs


class RTMDetIns(CSPNeXtFeatures):
    """RTMDet-Ins, zoo's segment-task model contract (``zoo_core/tasks/base.py``, the segment task).

    - ``forward(images)`` (N×3×H×W RGB in [0, 1], H and W multiples of 32): ``RTMDetInsHead``'s dict.
    - ``loss(outputs, batch)``: RTMDet's (quality focal + GIoU, dynamic soft-label assignment with
      the masks' centres of mass as the centre prior) plus dice on the positives' masks.
    - ``postprocess(outputs, conf, iou, max_det, placements)``: boxes, scores, labels and masks
      per image, in LibreYOLO 1.6's (and mmdetection's) order; see ``postprocess``.
    """

    def __init__(self, num_classes: int, spec: RTMDetSpec) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        super().__init__(spec)
        self.num_classes = num_classes
        self.head = RTMDetInsHead(num_classes, spec.head_width, STRIDES)
        self.criterion = RTMDetInsLoss(num_classes, self.head.layout)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Dense predictions of ``images``; see ``RTMDetInsHead`` for the dict's keys."""
        return self.head(self.pyramid(images))

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)`` for a segment batch (``images``, ``targets`` M×6 in input pixels, ``masks`` M×H×W)."""
        if "masks" not in batch:
            raise ValueError("RTMDet-Ins learns from instance masks: the batch needs 'masks' (M×H×W), as the segment task's has")
        terms = self.criterion(outputs, batch["targets"], batch["masks"], int(batch["images"].shape[0]))
        items = {"cls": terms.cls.detach(), "box": terms.box.detach(), "mask": terms.mask.detach()}
        return terms.cls + terms.box + terms.mask, items

    @torch.no_grad()
    def postprocess(
        self,
        outputs: Mapping[str, Any],
        conf: float = 0.25,
        iou: float = 0.6,
        max_det: int = MAX_INSTANCES,
        placements: Sequence[ImagePlacement] | None = None,
    ) -> list[dict[str, torch.Tensor]]:
        """Instances per image: ``boxes`` n×4, ``scores`` n, ``labels`` n (int64), ``masks`` n×H×W bool.

        LibreYOLO 1.6's RTMDet-Ins predict, per image: every (anchor, class) score above ``conf``,
        the best 1000 of each level; boxes clipped to the input and empty ones dropped; per-class
        NMS at ``iou`` in input pixels; at most ``min(max_det, 100)`` kept (mmdetection's
        ``max_per_img``); their masks decoded at stride 8 and upsampled ×8. With ``placements`` the
        mask logits of the whole input are resized by ``1 / ratio`` (rounded up), the original
        image cut out at the letterbox offset, boxes mapped and clipped; masks are the logits'
        sigmoid above 0.5.
        """
        if not 0.0 <= conf <= 1.0 or not 0.0 <= iou <= 1.0 or max_det < 1:
            raise ValueError(f"postprocess needs conf and iou in [0, 1] and max_det >= 1, got {conf}, {iou}, {max_det}")
        scores_all = outputs["scores"] if "scores" in outputs else outputs["class_logits"].sigmoid()
        if "boxes" in outputs:
            boxes_all = outputs["boxes"]
        else:
            boxes_all = distances_to_boxes(outputs["box_distances"].float(), outputs["anchor_points"])
        coefficients, mask_features = outputs["mask_coefficients"], outputs["mask_features"]
        input_h, input_w = (int(side) * self.strides[0] for side in mask_features.shape[-2:])
        points, strides = self._anchors(outputs, mask_features, input_h, input_w)
        level_of_anchor = torch.unique_consecutive(strides.reshape(-1), return_inverse=True)[1]
        if placements is not None and len(placements) != len(scores_all):
            raise ValueError(f"{len(placements)} placements for {len(scores_all)} images; give one per image")
        results = []
        for image in range(len(scores_all)):
            anchors, labels, scores = self._candidates(scores_all[image], level_of_anchor, conf)
            boxes = boxes_all[image][anchors].float().clone()
            boxes[:, 0::2] = boxes[:, 0::2].clamp(0, input_w)
            boxes[:, 1::2] = boxes[:, 1::2].clamp(0, input_h)
            usable = (torch.isfinite(boxes).all(dim=1) & torch.isfinite(scores)
                      & torch.isfinite(coefficients[image][anchors]).all(dim=1)
                      & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1]))
            anchors, labels, scores, boxes = anchors[usable], labels[usable], scores[usable].float(), boxes[usable]
            keep = batched_nms(boxes, scores, labels, iou)[: min(max_det, MAX_INSTANCES)]
            anchors, labels, scores, boxes = anchors[keep], labels[keep], scores[keep], boxes[keep]
            logits = dynamic_mask_logits(
                mask_features[image].expand(len(anchors), -1, -1, -1), coefficients[image][anchors],
                points[anchors], strides.reshape(-1)[anchors], self.head.layout, float(self.strides[0]),
            )
            if len(logits):
                logits = F.interpolate(logits[None], scale_factor=float(self.strides[0]), mode="bilinear", align_corners=False)[0]
            else:
                logits = logits.new_zeros((0, input_h, input_w))
            if placements is not None:
                logits, boxes = self._to_original(logits, boxes, placements[image])
            results.append({"boxes": boxes, "scores": scores, "labels": labels.to(torch.int64),
                            "masks": logits.sigmoid() > MASK_THRESHOLD})
        return results

    def _anchors(self, outputs: Mapping[str, Any], mask_features: torch.Tensor, height: int,
                 width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The anchors of the outputs, or (exported graphs carry none) rebuilt from the input size."""
        if "anchor_points" in outputs and "anchor_strides" in outputs:
            return outputs["anchor_points"], outputs["anchor_strides"]
        sizes = [(height // stride, width // stride) for stride in self.strides]
        return make_anchor_points(sizes, self.strides, offset=0.0, device=mask_features.device)

    @staticmethod
    def _candidates(scores: torch.Tensor, level_of_anchor: torch.Tensor,
                    conf: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(anchor, class, score)`` of the (anchor, class) pairs above ``conf``, the best 1000 of each level."""
        anchors, labels, values = [], [], []
        for level in range(int(level_of_anchor.max()) + 1):
            in_level = (level_of_anchor == level).nonzero(as_tuple=True)[0]
            level_scores = scores[in_level]
            pairs = (level_scores > conf).nonzero(as_tuple=False)
            if not len(pairs):
                continue
            ranked, order = level_scores[pairs[:, 0], pairs[:, 1]].sort(descending=True)
            pairs = pairs[order[:CANDIDATES_PER_LEVEL]]
            anchors.append(in_level[pairs[:, 0]])
            labels.append(pairs[:, 1])
            values.append(ranked[:CANDIDATES_PER_LEVEL])
        if not anchors:
            empty = torch.zeros(0, dtype=torch.int64, device=scores.device)
            return empty, empty, scores.new_zeros(0)
        return torch.cat(anchors), torch.cat(labels), torch.cat(values)

    @staticmethod
    def _to_original(logits: torch.Tensor, boxes: torch.Tensor, placement: ImagePlacement) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask logits and boxes of the input mapped onto the original image (LibreYOLO's order: resize, then cut)."""
        (ratio_x, ratio_y), (pad_left, pad_top) = placement.ratio_pad
        height, width = placement.shape
        size = (math.ceil(logits.shape[-2] / ratio_y), math.ceil(logits.shape[-1] / ratio_x))
        if len(logits):
            logits = F.interpolate(logits[None], size=size, mode="bilinear", align_corners=False)[0]
        else:
            logits = logits.new_zeros((0, *size))
        top, left = round(pad_top / ratio_y), round(pad_left / ratio_x)
        logits = logits[:, top : top + height, left : left + width]
        if logits.shape[-2:] != (height, width):  # a canvas that rounds short of the image: pad with background
            logits = F.pad(logits, (0, width - logits.shape[-1], 0, height - logits.shape[-2]), value=-1e4)
        boxes = (boxes - boxes.new_tensor([pad_left, pad_top, pad_left, pad_top])) / boxes.new_tensor([ratio_x, ratio_y, ratio_x, ratio_y])
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
        return logits, boxes


def build_rtmdet_ins(request: BuildRequest) -> RTMDetIns:
    """The registry builder of ``rtmdet_ins``: ``request.config`` holds the size's backbone and neck widths and depths."""
    if request.options:
        raise ValueError(f"rtmdet_ins takes no build options, got {sorted(request.options)}")
    # The instance head regresses relu(distance) * stride at every size: the detector's exp_on_reg does not apply.
    spec = RTMDetSpec.from_config({**request.config, "exp_on_reg": False},
                                  where=f"registry.yaml rtmdet_ins size {request.size!r} config")
    return RTMDetIns(request.num_classes, spec)
