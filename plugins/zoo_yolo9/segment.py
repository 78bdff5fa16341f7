"""YOLOv9 instance segmentation: the GELAN detector plus YOLACT-style prototype masks (``gelan-c-seg``).

Architecture (WongKinYiu/yolov9 ``models/segment/gelan-c-seg.yaml``, ``Segment`` and ``Proto`` of
``models/yolo.py`` / ``models/common.py``): the GELAN trunk of ``zoo_yolo9.model`` unchanged, and a
``Segment`` head, which is the ``Detect`` head (box branch *not* grouped, unlike DDetect's) plus

- ``Proto``: from the finest (P3) neck map, a 3×3 conv, nearest 2× upsampling, a 3×3 conv and a
  1×1 conv to 32 prototype masks at stride 4 (``mask_features``, N×32×H/4×W/4);
- per level a mask-coefficient branch (3×3, 3×3, 1×1 to 32, width ``max(c0 // 4, 32)``), one
  coefficient vector per anchor (``mask_coefficients``, N×A×32).

Widths: gelan-c-seg's ``Segment(nc, 32, 256)`` has 256 prototype channels, which is its P3 width.
Only the C size is published; zoo builds every size of the detector with the prototype width equal
to that size's P3 width (t 64, s 128, m 240, c 256 as published), the scaling Ultralytics applies
to the same head (256 × the width multiple).

PGI. The published ``yolov9-c-dseg`` (its DualDSegment head, a second prototype branch on an extra
RepNCSPELAN4) has no released weights or parameter figure in the README beyond YOLOv9-C-SEG's; zoo
builds the released ``gelan-c-seg`` form, whose weights ``convert.py`` imports, and has no ``pgi``
option for segmentation.

Loss (``utils/segment/loss_tal.py``): the detector's task-aligned BCE + CIoU + DFL terms, plus for
every positive anchor the BCE of its combined mask against its assigned instance's mask, cropped to
the assigned box and divided by its normalised area (``zoo_core.losses.instance_masks``), averaged
per image and over the batch, gain 2.5; the same nominal-batch scale as the detector.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.assigners.task_aligned import TaskAlignedAssignment
from zoo_core.building import BuildRequest
from zoo_core.data.input_pipeline import logits_to_original
from zoo_core.losses.detection import YOLO_NOMINAL_BATCH_SIZE, target_rows_per_image
from zoo_core.losses.instance_masks import box_normalised_mask_bce
from zoo_core.nn.conv import ConvNormAct
from zoo_core.nn.gelan import GELANSpec
from zoo_core.nn.norm import apply_batchnorm_momentum_option
from zoo_core.ops.boxes import ImagePlacement
from zoo_core.ops.masks import combine_prototypes, crop_masks_to_boxes, downsample_instance_masks
from zoo_core.registry import InputPipeline
from zoo_yolo9.model import YOLOv9

__all__ = [
    "MASK_PROTOTYPES",
    "PROTOTYPE_STRIDE",
    "MASK_LOSS_GAIN",
    "PrototypeMasks",
    "MaskCoefficientBranches",
    "YOLOv9Segmenter",
    "build_yolo9_seg",
]

MASK_PROTOTYPES = 32  # Segment(nc, nm=32, ...)
PROTOTYPE_STRIDE = 4  # Proto upsamples the stride-8 P3 map twice
MASK_LOSS_GAIN = 2.5  # utils/segment/loss_tal.py: loss[1] *= 2.5 / batch_size
MASK_THRESHOLD = 0.5  # utils/segment/general.py process_mask: masks.gt_(0.5)
BUILD_OPTIONS = ("class_channels", "bn_momentum", "prototype_channels")
# The yolo9 families' declared pipeline (registry.yaml): masks are mapped back the way images were placed.
_LETTERBOX = InputPipeline(resize="letterbox", placement="top_left", interpolation="bilinear")


class PrototypeMasks(nn.Module):
    """YOLACT's protonet as YOLOv5/9 build it (``Proto``): 3×3 conv, nearest 2× upsampling, 3×3 conv, 1×1 conv to ``prototypes``."""

    def __init__(self, in_channels: int, hidden_channels: int, prototypes: int = MASK_PROTOTYPES) -> None:
        super().__init__()
        self.cv1 = ConvNormAct(in_channels, hidden_channels, 3)
        self.cv2 = ConvNormAct(hidden_channels, hidden_channels, 3)
        self.cv3 = ConvNormAct(hidden_channels, prototypes, 1)

    def forward(self, finest_level: torch.Tensor) -> torch.Tensor:
        """N×prototypes×2h×2w prototype maps of the N×C×h×w finest pyramid level."""
        return self.cv3(self.cv2(F.interpolate(self.cv1(finest_level), scale_factor=2.0, mode="nearest")))


class MaskCoefficientBranches(nn.Module):
    """One branch per pyramid level (3×3, 3×3, 1×1 to ``prototypes``): each anchor's mask coefficients, N×A×prototypes."""

    def __init__(self, in_channels: Sequence[int], prototypes: int = MASK_PROTOTYPES) -> None:
        super().__init__()
        width = max(in_channels[0] // 4, prototypes)  # Segment: c4 = max(ch[0] // 4, nm)
        self.branches = nn.ModuleList(
            nn.Sequential(ConvNormAct(channels, width, 3), ConvNormAct(width, width, 3), nn.Conv2d(width, prototypes, 1))
            for channels in in_channels
        )

    def forward(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """Coefficients of every anchor, levels in the head's order (finest first, row-major)."""
        return torch.cat([branch(level).flatten(2) for branch, level in zip(self.branches, features)], dim=2).transpose(1, 2)


class YOLOv9Segmenter(YOLOv9):
    """YOLOv9 instance segmentation (gelan-c-seg form), zoo's segment-task model contract.

    - ``forward(images)``: the detector's head dict plus ``mask_coefficients`` (N×A×32) and
      ``mask_features`` (the prototypes, N×32×H/4×W/4); eval mode adds decoded ``boxes``/``scores``.
    - ``loss(outputs, batch)``: the detector's terms and the box-cropped mask BCE (module docstring),
      reading ``batch["targets"]`` and ``batch["masks"]`` (M×H×W, row i the mask of target row i).
    - ``postprocess(...)``: the detector's NMS, then per detection sigmoid(coefficients · prototypes),
      cropped to its box, upsampled bilinearly to the input, with ``placements`` mapped to the
      original image (letterbox padding cut, bilinear resize), thresholded at 0.5.
    """

    def __init__(
        self, num_classes: int, spec: GELANSpec, *, class_channels: int | None = None, prototype_channels: int | None = None,
    ) -> None:
        super().__init__(num_classes, spec, class_channels=class_channels, box_groups=1)
        pyramid_channels = self.neck.out_channels
        self.prototypes = PrototypeMasks(pyramid_channels[0], prototype_channels or pyramid_channels[0])
        self.mask_coefficient_branches = MaskCoefficientBranches(pyramid_channels)
        self.mask_loss_gain = MASK_LOSS_GAIN

    def forward(self, images: torch.Tensor) -> dict[str, Any]:
        """Dense boxes, classes and mask parameters of ``images`` (class docstring)."""
        if images.dim() != 4 or images.shape[2] % self.max_stride or images.shape[3] % self.max_stride:
            raise ValueError(
                f"YOLOv9-seg takes N×3×H×W images with H and W multiples of {self.max_stride}, got {tuple(images.shape)}; "
                "letterbox or resize the input"
            )
        pyramid = self.neck(self.backbone(images))
        outputs: dict[str, Any] = self.head(pyramid)
        outputs["mask_coefficients"] = self.mask_coefficient_branches(pyramid)
        outputs["mask_features"] = self.prototypes(pyramid[0])
        return outputs

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)``: the detector's gained terms plus ``seg``, times the nominal batch 64.

        The mask term is each image's mean over its positive anchors (an image without any adds
        zero), averaged over the local batch, so it is normalised per sample as base.py requires.
        """
        images, targets = batch["images"], batch["targets"]
        if "masks" not in batch:
            raise KeyError("a YOLOv9-seg batch needs 'masks' (M×H×W, one per target row); train it with the segment task")
        batch_size = int(images.shape[0])
        terms, assignment = self.criterion.terms_and_assignment(outputs, targets, batch_size)
        weighted = terms.weighted(self.loss_gains)
        mask_term = self._mask_loss(outputs, targets, batch["masks"], assignment, tuple(images.shape[-2:]), batch_size)
        seg = mask_term * self.mask_loss_gain
        items = {"box": weighted.box.detach(), "seg": seg.detach(), "cls": weighted.cls.detach(), "dfl": weighted.dfl.detach()}
        return (weighted.total() + seg) * YOLO_NOMINAL_BATCH_SIZE, items

    def _mask_loss(
        self, outputs: Mapping[str, Any], targets: torch.Tensor, masks: torch.Tensor, assignment: TaskAlignedAssignment,
        input_size: tuple[int, int], batch_size: int,
    ) -> torch.Tensor:
        """The un-gained mask term: per image the mean box-normalised BCE of its positive anchors, over the batch."""
        prototypes = outputs["mask_features"].float()
        coefficients = outputs["mask_coefficients"].float()
        if len(masks) != len(targets):
            raise ValueError(f"batch['masks'] holds {len(masks)} masks for {len(targets)} targets; give one per target row")
        # Zero-valued terms keep both mask branches in the graph on a rank without positives (DDP
        # expects every parameter to get a gradient).
        total = (prototypes.sum() + coefficients.sum()) * 0.0
        if not len(targets):
            return total
        mask_h, mask_w = prototypes.shape[-2:]
        input_h, input_w = input_size
        target_masks = downsample_instance_masks(masks.to(prototypes.device), (mask_h, mask_w))
        most_per_image = int(torch.bincount(targets[:, 0].long(), minlength=batch_size).max())
        rows = target_rows_per_image(targets.to(prototypes.device), batch_size, most_per_image)
        to_mask_pixels = prototypes.new_tensor([mask_w / input_w, mask_h / input_h, mask_w / input_w, mask_h / input_h])
        for image in range(batch_size):
            anchors = assignment.foreground[image].nonzero(as_tuple=True)[0]
            if not len(anchors):
                continue
            instance_rows = rows[image, assignment.gt_index[image, anchors]]
            boxes = assignment.boxes[image, anchors].float()
            areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / (input_w * input_h)
            logits = combine_prototypes(coefficients[image, anchors], prototypes[image])
            total = total + box_normalised_mask_bce(logits, target_masks[instance_rows], boxes * to_mask_pixels, areas).mean()
        return total / batch_size

    @torch.no_grad()
    def postprocess(
        self,
        outputs: Mapping[str, Any],
        conf: float | None = None,
        iou: float | None = None,
        max_det: int | None = None,
        *,
        multi_label: bool | None = None,
        placements: Sequence[ImagePlacement] | None = None,
        return_anchor_indices: bool = False,
    ) -> list[dict[str, torch.Tensor]]:
        """Detections per image as the detector gives them plus ``masks`` (n×H×W bool): at the input
        size, or with ``placements`` at each original image's size (class docstring)."""
        detections = super().postprocess(
            outputs, conf, iou, max_det, multi_label=multi_label, placements=placements, return_anchor_indices=True
        )
        input_boxes, _ = self.dense_candidates(outputs)
        prototypes = outputs["mask_features"]
        mask_h, mask_w = prototypes.shape[-2:]
        input_h, input_w = mask_h * PROTOTYPE_STRIDE, mask_w * PROTOTYPE_STRIDE
        to_mask_pixels = input_boxes.new_tensor([mask_w / input_w, mask_h / input_h, mask_w / input_w, mask_h / input_h])
        for image, detection in enumerate(detections):
            anchors = detection["anchor_indices"] if return_anchor_indices else detection.pop("anchor_indices")
            out_h, out_w = placements[image].shape if placements is not None else (input_h, input_w)
            if not len(anchors):
                detection["masks"] = torch.zeros((0, out_h, out_w), dtype=torch.bool, device=prototypes.device)
                continue
            coefficients = outputs["mask_coefficients"][image, anchors].float()
            probabilities = combine_prototypes(coefficients, prototypes[image].float()).sigmoid()
            probabilities = crop_masks_to_boxes(probabilities, input_boxes[image, anchors].float() * to_mask_pixels)
            probabilities = F.interpolate(probabilities[None], size=(input_h, input_w), mode="bilinear", align_corners=False)[0]
            if placements is not None:
                probabilities = logits_to_original(probabilities, placements[image].ratio_pad, (out_h, out_w), _LETTERBOX)
            detection["masks"] = probabilities > MASK_THRESHOLD
        return detections


def build_yolo9_seg(request: BuildRequest) -> YOLOv9Segmenter:
    """The registry builder of ``yolo9_seg``: ``request.config`` is the size's ``GELANSpec`` data.

    Options: ``class_channels`` (int, the class towers' width, as for yolo9); ``prototype_channels``
    (int, the protonet's width; default the P3 width, gelan-c-seg's 256 at C); ``bn_momentum``.
    """
    if "pgi" in request.options:
        raise ValueError(
            "yolo9_seg builds the released gelan-c-seg form, which has no PGI auxiliary branch; drop the pgi option"
        )
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"yolo9_seg does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    widths = {}
    for option in ("class_channels", "prototype_channels"):
        value = request.options.get(option)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"yolo9_seg option {option} must be a positive integer, got {value!r}")
        widths[option] = value
    spec = GELANSpec.from_config(request.config, where=f"registry.yaml yolo9_seg size {request.size!r} config")
    model = YOLOv9Segmenter(request.num_classes, spec, **widths)
    return apply_batchnorm_momentum_option(model, request.options, family="yolo9_seg")
