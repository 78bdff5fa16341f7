"""YOLO-NAS-Pose (Deci AI, 2023; super-gradients ``yolo_nas_pose_{n,s,m,l}``): YOLO-NAS with a keypoint head.

Backbone and neck are the detector's (``model.YoloNasBackbone``/``YoloNasNeck``, the registry ``config`` of each
size: the same searched layouts LibreYOLO 1.6.0 builds for ``yolo_nas_{n,s,m,l}``). The head, per level
(super-gradients ``YoloNASPoseDFLHead`` with ``pose_conf_in_class_head=True``, ``shared_stem=False``, as every
published checkpoint is configured), has two 1×1 stems:

- a box stem, then one 3×3 conv per branch: class logits *and* one visibility logit per keypoint from the class
  branch (``num_classes + K`` channels of one 1×1 conv), 4 × 17 DFL bins from the box branch;
- a pose stem, then ``pose_blocks`` 3×3 convs and a 1×1 conv of ``2K`` keypoint offsets, measured in strides from
  the cell's corner (``(offset + cell - 0.5) × stride`` in pixels, super-gradients' ``compensate_grid_cell_offset``).

Widths per level: box 128/256/512 and pose 128/512/512 scaled by the size's ``head_width_mult`` (0.33/0.5/0.75/1)
and rounded up to a multiple of 8 (registry ``head``/``pose_head``); pose blocks 2/2/3.

Outputs (``forward``): detection's dense dict (``box_logits``, ``class_logits``, ``anchor_points``,
``anchor_strides``) plus ``keypoint_offsets`` (N×A×K×2) and ``keypoint_logits`` (N×A×K); in eval mode also the
decoded ``boxes``, ``scores`` and ``keypoints`` (N×A×K×3: x, y in input pixels, sigmoid confidence): the pose task's
export outputs. ``postprocess`` is detection's NMS with each kept box's keypoints.

Loss (``YoloNasPoseLoss``): PP-YOLOE's terms on the task-aligned assignment (varifocal class, GIoU, DFL) plus, on the
same positives weighted by their target scores, an OKS keypoint regression term (``1 - exp(-d²/(2·(2σ)²·area))``
per labelled point, scaled by K over the labelled count, as Ultralytics' ``KeypointLoss``) and a BCE visibility term.
Weights are super-gradients' ``YoloNASPoseLoss`` defaults: cls 1.0, iou 2.5, dfl 0.01, pose_cls 1.0, pose_reg 34.0.
zoo's choices, stated: the assigner's metric is PP-YOLOE's (super-gradients multiplies it by the pose OKS), the
class term is PP-YOLOE's varifocal (super-gradients: focal), and the OKS sigmas are COCO's for 17 points, else
uniform ``1/K`` (the model does not see the dataset's ``kpt_sigmas``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.building import BuildRequest
from zoo_core.nn.detection_head import make_anchor_points
from zoo_core.nn.norm import apply_batchnorm_momentum_option
from zoo_core.ops.dense_postprocess import DenseDetectionPostprocess, DenseNMSDefaults
from zoo_yolonas.loss import PPYOLOELoss
from zoo_yolonas.model import (
    CLASS_PRIOR, PRE_NMS_TOP_K, REG_BINS, STRIDES, QARepVGGBlock, YoloNasBackbone, YoloNasNeck, YoloNasSpec, _conv,
    count_published_parameters, decode_yolonas,
)

__all__ = ["YoloNasPoseHead", "YoloNasPose", "YoloNasPoseLoss", "build_yolonas_pose", "COCO_KEYPOINTS"]

COCO_KEYPOINTS = 17  # Deci's published models: COCO's 17 person keypoints, one class
BUILD_OPTIONS = ("num_keypoints", "skeleton", "bn_momentum")


class YoloNasPoseHead(nn.Module):
    """Per level: box stem, class (+ keypoint visibility) and box branches, pose stem and pose branch (module docstring)."""

    def __init__(self, num_classes: int, num_keypoints: int, in_channels: Sequence[int], widths: Sequence[int],
                 pose_widths: Sequence[int], pose_blocks: Sequence[int], strides: Sequence[int], bins: int) -> None:
        super().__init__()
        self.num_classes, self.num_keypoints, self.bins, self.strides = num_classes, num_keypoints, bins, tuple(strides)
        self.stems = nn.ModuleList(_conv(c, w) for c, w in zip(in_channels, widths))
        self.pose_stems = nn.ModuleList(_conv(c, w) for c, w in zip(in_channels, pose_widths))
        self.class_convs = nn.ModuleList(_conv(w, w, 3) for w in widths)
        self.box_convs = nn.ModuleList(_conv(w, w, 3) for w in widths)
        self.pose_convs = nn.ModuleList(nn.Sequential(*(_conv(w, w, 3) for _ in range(depth))) for w, depth in zip(pose_widths, pose_blocks))
        self.class_preds = nn.ModuleList(nn.Conv2d(w, num_classes + num_keypoints, 1) for w in widths)
        self.box_preds = nn.ModuleList(nn.Conv2d(w, 4 * bins, 1) for w in widths)
        self.pose_preds = nn.ModuleList(nn.Conv2d(w, 2 * num_keypoints, 1) for w in pose_widths)
        with torch.no_grad():
            for pred in self.class_preds:  # super-gradients sets the prior bias on every channel, visibility included
                pred.bias.fill_(-math.log((1 - CLASS_PRIOR) / CLASS_PRIOR))

    def forward(self, features: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        box_logits, class_logits, visibility_logits, offsets = [], [], [], []
        for level, x in enumerate(features):
            box_features, pose_features = self.stems[level](x), self.pose_stems[level](x)
            logits = self.class_preds[level](self.class_convs[level](box_features)).flatten(2)
            class_logits.append(logits[:, : self.num_classes])
            visibility_logits.append(logits[:, self.num_classes :])
            box_logits.append(self.box_preds[level](self.box_convs[level](box_features)).flatten(2))
            offsets.append(self.pose_preds[level](self.pose_convs[level](pose_features)).flatten(2))
        anchor_points, anchor_strides = make_anchor_points(
            [tuple(level.shape[2:]) for level in features], self.strides, device=features[0].device
        )
        batch = features[0].shape[0]
        outputs = {
            "box_logits": torch.cat(box_logits, dim=2).transpose(1, 2),
            "class_logits": torch.cat(class_logits, dim=2).transpose(1, 2),
            # 2K channels are (keypoint, x|y) pairs, as super-gradients reshapes them
            "keypoint_offsets": torch.cat(offsets, dim=2).reshape(batch, self.num_keypoints, 2, -1).permute(0, 3, 1, 2),
            "keypoint_logits": torch.cat(visibility_logits, dim=2).transpose(1, 2),
            "anchor_points": anchor_points,
            "anchor_strides": anchor_strides,
        }
        if not self.training:
            outputs["boxes"], outputs["scores"] = decode_yolonas(outputs, self.bins)
            outputs["keypoints"] = decode_keypoints(outputs)
        return outputs


def decode_keypoints(outputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """N×A×K×3 keypoints (x, y in input pixels, sigmoid confidence) of a pose head dict, in super-gradients' op order:
    ``(offset + cell - 0.5) × stride``, the cell's centre in strides."""
    strides = outputs["anchor_strides"]
    cells = (outputs["anchor_points"] / strides)[None, :, None, :]
    xy = (outputs["keypoint_offsets"] + cells - 0.5) * strides[None, :, None, :]
    return torch.cat([xy, outputs["keypoint_logits"].sigmoid()[..., None]], dim=-1)


class YoloNasPoseLoss:
    """YOLO-NAS-Pose's training loss (stateless, picklable); see the module docstring."""

    def __init__(self, num_classes: int, num_keypoints: int, *, pose_cls_weight: float = 1.0, pose_reg_weight: float = 34.0) -> None:
        from zoo_core.data.keypoints import default_sigmas

        self.detection = PPYOLOELoss(num_classes, REG_BINS, dfl_weight=0.01)
        self.sigmas = torch.tensor(default_sigmas(num_keypoints), dtype=torch.float32)
        self.pose_cls_weight, self.pose_reg_weight = pose_cls_weight, pose_reg_weight

    def __call__(self, outputs: Mapping[str, torch.Tensor], targets: torch.Tensor, keypoints: torch.Tensor, batch_size: int,
                 level_sizes: Sequence[int]) -> dict[str, torch.Tensor]:
        from zoo_core.losses.detection import target_rows_per_image

        terms, assignment, normaliser = self.detection.compute(outputs, targets, batch_size, level_sizes)
        offsets = outputs["keypoint_offsets"].float()
        predicted = decode_keypoints({**outputs, "keypoint_offsets": offsets, "keypoint_logits": outputs["keypoint_logits"].float()})
        image_index = targets[:, 0].long()
        most = int(torch.bincount(image_index, minlength=batch_size).max()) if len(targets) else 0
        rows = target_rows_per_image(targets, batch_size, most)  # B×G: the targets row in each padded slot
        foreground = assignment.foreground
        weight = assignment.scores.sum(dim=-1) * foreground  # B×A, zero off the positives
        if rows.shape[1] == 0 or len(keypoints) == 0:
            zero = offsets.sum() * 0.0 + outputs["keypoint_logits"].sum() * 0.0
            return {"cls": terms.cls, "iou": terms.iou, "dfl": terms.dfl, "pose_cls": zero, "pose_reg": zero}
        row = rows.gather(1, assignment.gt_index).clamp(min=0)  # B×A: the targets row each anchor learns
        truth = keypoints.to(offsets.device, torch.float32)[row]  # B×A×K×3
        boxes = targets.to(offsets.device, torch.float32)[row, 2:6]
        area = ((boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])).clamp(min=1.0)
        labelled = (truth[..., 2] > 0).float()
        squared = ((predicted[..., :2] - truth[..., :2]) ** 2).sum(-1)
        sigmas = self.sigmas.to(offsets.device)
        error = squared / ((2 * sigmas) ** 2 * (area[..., None] + 1e-9) * 2)
        count = labelled.shape[-1]
        scale = count / (labelled.sum(-1) + 1e-9)
        oks_loss = (scale * ((1 - torch.exp(-error)) * labelled).mean(-1))  # B×A
        visibility = F.binary_cross_entropy_with_logits(outputs["keypoint_logits"].float(), labelled, reduction="none").mean(-1)
        return {
            "cls": terms.cls, "iou": terms.iou, "dfl": terms.dfl,
            "pose_cls": self.pose_cls_weight * (visibility * weight).sum() / normaliser,
            "pose_reg": self.pose_reg_weight * (oks_loss * weight).sum() / normaliser,
        }


class YoloNasPose(DenseDetectionPostprocess, nn.Module):
    """YOLO-NAS-Pose, the pose task's model contract (``zoo_core/tasks/pose.py``).

    - ``forward(images)`` (N×3×H×W RGB in [0, 1], sides multiples of 32): the head dict (module docstring).
    - ``loss(outputs, batch)``: ``YoloNasPoseLoss`` on ``targets`` and ``keypoints``.
    - ``postprocess(outputs, conf, iou, max_det, placements)``: per-class NMS over the 1000 best candidates, each kept
      box with its keypoints (n×K×3), mapped to the original image with the boxes.
    - ``fuse()`` / ``published_parameter_count()``: as the detector's.
    """

    nms_defaults = DenseNMSDefaults(iou=0.7, max_candidates=PRE_NMS_TOP_K)

    def __init__(self, num_classes: int, spec: YoloNasSpec, pose_widths: Sequence[int], pose_blocks: Sequence[int],
                 num_keypoints: int = COCO_KEYPOINTS, skeleton: Sequence[Sequence[int]] = ()) -> None:
        super().__init__()
        if num_classes < 1 or num_keypoints < 1:
            raise ValueError(f"num_classes and num_keypoints must be at least 1, got {num_classes} and {num_keypoints}")
        self.num_classes, self.num_keypoints = num_classes, num_keypoints
        self.skeleton = tuple((int(a), int(b)) for a, b in skeleton)
        self.strides, self.max_stride, self.reg_bins = STRIDES, max(STRIDES), REG_BINS
        self.backbone = YoloNasBackbone(spec)
        self.neck = YoloNasNeck(spec, self.backbone.out_channels)
        self.head = YoloNasPoseHead(num_classes, num_keypoints, self.neck.out_channels, spec.head, pose_widths, pose_blocks,
                                    STRIDES, REG_BINS)
        self.criterion = YoloNasPoseLoss(num_classes, num_keypoints)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Dense predictions of ``images``; see the class docstring."""
        if images.dim() != 4 or images.shape[2] % self.max_stride or images.shape[3] % self.max_stride:
            raise ValueError(f"YOLO-NAS-Pose takes N×3×H×W images with H and W multiples of {self.max_stride}, got "
                             f"{tuple(images.shape)}; letterbox or resize the input")
        return self.head(self.neck(self.backbone(images)))

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)``: PP-YOLOE's three terms plus the keypoint visibility and OKS terms."""
        if "keypoints" not in batch:
            raise ValueError("YOLO-NAS-Pose trains on pose batches: batch['keypoints'] (M×K×3) is missing (use task=pose data)")
        if batch["keypoints"].shape[1] != self.num_keypoints:
            raise ValueError(f"the batch has {batch['keypoints'].shape[1]} keypoints per object but the model predicts "
                             f"{self.num_keypoints}; build it with the option num_keypoints={batch['keypoints'].shape[1]}")
        images = batch["images"]
        height, width = images.shape[2:]
        level_sizes = [(height // s) * (width // s) for s in self.strides]
        terms = self.criterion(outputs, batch["targets"], batch["keypoints"], int(images.shape[0]), level_sizes)
        total = sum(terms.values())
        return total, {name: value.detach() for name, value in terms.items()}

    def decode(self, outputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(boxes N×A×4 xyxy in input pixels, scores N×A×C)`` from the raw head outputs."""
        return decode_yolonas(outputs, self.reg_bins)

    @torch.no_grad()
    def postprocess(self, outputs: Mapping[str, Any], conf: float | None = None, iou: float | None = None,
                    max_det: int | None = None, *, placements: Any = None, **options: Any) -> list[dict[str, torch.Tensor]]:
        """Detection's NMS (``DenseDetectionPostprocess``) with each kept box's keypoints, in the boxes' pixels."""
        found = super().postprocess(outputs, conf, iou, max_det, placements=placements, return_anchor_indices=True, **options)
        keypoints = outputs["keypoints"] if "keypoints" in outputs else decode_keypoints(outputs)
        for position, item in enumerate(found):
            points = keypoints[position][item.pop("anchor_indices")].clone()
            if placements is not None:
                (ratio_x, ratio_y), (pad_x, pad_y) = placements[position].ratio_pad
                points[..., 0] = (points[..., 0] - pad_x) / ratio_x
                points[..., 1] = (points[..., 1] - pad_y) / ratio_y
            item["keypoints"] = points
        return found

    def published_parameter_count(self) -> int:
        """The count Deci publishes (9.9M / 22.2M / 58.2M / 79.4M at 1 class, 17 keypoints): every parameter of
        super-gradients' module as it is built, where each QARepVGG block holds its re-parameterised 3×3 conv
        (``rbr_reparam``, weight and bias) beside the training branches: zoo's trainable count plus one merged
        kernel per unfused block (LibreYOLO 1.6's pose model counts the same, to the digit). Works on the meta device."""
        total = sum(parameter.numel() for parameter in self.parameters())
        for module in self.modules():
            if isinstance(module, QARepVGGBlock) and module.fused is None:
                total += module.kernel3.weight.numel() + module.out_channels
        return total

    def reparameterised_parameter_count(self) -> int:
        """The count of the re-parameterised model (every QARepVGG block one biased 3×3 conv plus its post-BatchNorm)."""
        return count_published_parameters(self)

    @torch.no_grad()
    def fuse(self) -> "YoloNasPose":
        """Inference form: every QARepVGG block merged, every conv's BatchNorm folded (eval mode)."""
        from zoo_core.nn.gelan import fuse_for_inference

        self.eval()
        for module in list(self.modules()):
            if isinstance(module, QARepVGGBlock):
                module.fuse()
        fuse_for_inference(self)
        return self


def _int_list(value: Any, key: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) != len(STRIDES) or not all(isinstance(v, int) and v > 0 for v in value):
        raise ValueError(f"{where}: '{key}' must list {len(STRIDES)} positive integers (one per level), got {value!r}")
    return tuple(value)


def build_yolonas_pose(request: BuildRequest) -> YoloNasPose:
    """The registry builder of ``yolonas_pose``: ``request.config`` is the detector's ``YoloNasSpec`` data plus
    ``pose_head`` (pose widths per level) and ``pose_blocks`` (3×3 convs per level).

    Options: ``num_keypoints`` (default 17, COCO's; a pose dataset sets its own when training), ``skeleton`` (index
    pairs drawn by predictions), ``bn_momentum`` (as the detector's).
    """
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"yolonas_pose does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    where = f"registry.yaml yolonas_pose size {request.size!r} config"
    config = dict(request.config)
    pose_widths = _int_list(config.pop("pose_head", None), "pose_head", where)
    pose_blocks = _int_list(config.pop("pose_blocks", None), "pose_blocks", where)
    count = request.options.get("num_keypoints", COCO_KEYPOINTS)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"yolonas_pose option num_keypoints must be a positive integer, got {count!r}")
    skeleton = request.options.get("skeleton") or ()
    model = YoloNasPose(request.num_classes, YoloNasSpec.from_config(config, where=where), pose_widths, pose_blocks,
                        num_keypoints=count, skeleton=skeleton)
    return apply_batchnorm_momentum_option(model, request.options, family="yolonas_pose")
