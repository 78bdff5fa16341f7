"""YOLOv9 end-to-end: GELAN (YOLOv9, arXiv:2402.13616) with YOLOv10's NMS-free dual heads (arXiv:2405.14458).

The network is the `yolo9` family's GELAN backbone and PAN neck (``zoo_core.nn.gelan``, configured
by the same ``GELANSpec`` data, without a PGI branch) with two decoupled DFL heads of identical shape
(``zoo_core.nn.detection_head.DecoupledDetectionHead``, YOLOv9's grouped box branch):

- the **one-to-many** head (``head``) is trained as YOLOv9's head is: task-aligned assignment of
  the top 10 anchors per ground truth;
- the **one-to-one** head (``one_to_one_head``) sees the neck's features *detached* (its loss does
  not reach the backbone) and is trained with the same task-aligned metric (alpha 0.5, beta 6.0:
  YOLOv10's consistent matching metric) but only the single best anchor per ground truth.

Both start from the same initial weights (the one-to-one head is a copy of the one-to-many head,
as in YOLOv10 and LibreYOLO). The loss is the sum of both heads' BCE + CIoU + DFL terms (gains
7.5 / 0.5 / 1.5, times YOLO's nominal batch 64, see ``zoo_core.losses.detection``). Inference runs
the one-to-one head only and needs no NMS: ``postprocess`` keeps the ``max_det`` best
(anchor, class) scores among the ``max_det`` best anchors.

This is LibreYOLO 1.6.0's ``yolo9_e2e`` (``LibreYOLO9E2EModel``), whose eval outputs zoo reproduces
after ``convert.from_libreyolo``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from zoo_core.assigners.task_aligned import TaskAlignedAssigner
from zoo_core.building import BuildRequest
from zoo_core.losses.detection import YOLO_NOMINAL_BATCH_SIZE, DetectionLossGains, TaskAlignedDetectionLoss
from zoo_core.nn.detection_head import DecoupledDetectionHead, decode_dense_predictions
from zoo_core.nn.gelan import (
    DDETECT_BOX_GROUPS,
    DDETECT_REG_MAX,
    GELAN_STRIDES,
    GELANBackbone,
    GELANNeck,
    GELANSpec,
    fuse_for_inference,
)
from zoo_core.nn.norm import apply_batchnorm_momentum_option
from zoo_core.ops.boxes import ImagePlacement, boxes_to_original, drop_empty_boxes

__all__ = ["ONE_TO_MANY_TOP_K", "ONE_TO_ONE_TOP_K", "top_k_detections", "YOLOv9E2E", "build_yolo9_e2e"]

BUILD_OPTIONS = ("class_channels", "bn_momentum")
BN_MOMENTUM = 0.03  # GELAN's ConvNormAct (YOLOv9's, ultralytics' BatchNorm momentum 0.03)
ONE_TO_MANY_TOP_K = 10  # YOLOv10 v10DetectLoss: one2many TAL topk=10 (LibreYOLO YOLO9E2ELoss topk_many)
ONE_TO_ONE_TOP_K = 1  # one2one TAL topk=1 (LibreYOLO topk_one)
# YOLOv10's consistent matching metric s**0.5 * IoU**6 for both heads (LibreYOLO YOLO9E2ELoss
# cls_factor=0.5, iou_factor=6), the same task-aligned metric as YOLOv9's utils/loss_tal.py.
ASSIGNER_ALPHA, ASSIGNER_BETA = 0.5, 6.0
STRIDES = GELAN_STRIDES
REG_MAX = DDETECT_REG_MAX
BOX_BRANCH_GROUPS = DDETECT_BOX_GROUPS


def _check_thresholds(conf: float, max_det: int) -> None:
    if not 0.0 <= conf <= 1.0:
        raise ValueError(f"conf={conf} must be a score threshold between 0 and 1")
    if max_det < 1:
        raise ValueError(f"max_det={max_det} must be at least 1 detection per image")


def top_k_detections(boxes: torch.Tensor, scores: torch.Tensor, conf: float, max_det: int) -> list[dict[str, torch.Tensor]]:
    """NMS-free postprocess of one-to-one predictions (YOLOv10's ``v10postprocess``), batched.

    Stage 1 keeps the ``max_det`` anchors of highest best-class score; stage 2 keeps the
    ``max_det`` highest (anchor, class) scores among them (an anchor may so give several labels).
    Detections scoring at most ``conf`` are then dropped. ``boxes`` N×A×4, ``scores`` N×A×C;
    returns one dict per image (``boxes``, ``scores``, ``labels`` int64), by decreasing score.
    """
    _check_thresholds(conf, max_det)
    if boxes.dim() != 3 or boxes.shape[-1] != 4 or scores.dim() != 3 or scores.shape[:2] != boxes.shape[:2]:
        raise ValueError(
            f"expected boxes N×A×4 and scores N×A×C over the same anchors, got {tuple(boxes.shape)} and {tuple(scores.shape)}"
        )
    num_classes = scores.shape[-1]
    anchors = min(max_det, scores.shape[1])
    anchor_index = scores.amax(dim=-1).topk(anchors, dim=1).indices  # N×k
    candidate_scores = scores.gather(1, anchor_index[..., None].expand(-1, -1, num_classes))
    candidate_boxes = boxes.gather(1, anchor_index[..., None].expand(-1, -1, 4))
    top_scores, flat_index = candidate_scores.flatten(1).topk(min(max_det, anchors * num_classes), dim=1)
    labels = flat_index % num_classes
    top_boxes = candidate_boxes.gather(1, (flat_index // num_classes)[..., None].expand(-1, -1, 4))
    keep = top_scores > conf
    return [
        {"boxes": image_boxes[image_keep].float(), "scores": image_scores[image_keep].float(), "labels": image_labels[image_keep]}
        for image_boxes, image_scores, image_labels, image_keep in zip(top_boxes, top_scores, labels, keep)
    ]


class YOLOv9E2E(nn.Module):
    """YOLOv9 with a one-to-one head for NMS-free inference, zoo's detection model contract.

    - ``forward(images)`` (N×3×H×W in [0, 1], H and W multiples of 32): in train mode the
      one-to-many head's dict (``zoo_core.nn.detection_head``) with the one-to-one head's dict
      under ``"one_to_one"``; in eval mode the one-to-one head's dict only (decoded ``boxes`` and
      ``scores`` included).
    - ``loss(outputs, batch)``: both heads' task-aligned losses (top-10 / top-1), summed.
    - ``postprocess(outputs, conf, iou, max_det)``: ``top_k_detections`` (``iou`` is unused: no NMS).
    """

    def __init__(
        self,
        num_classes: int,
        spec: GELANSpec,
        *,
        loss_gains: DetectionLossGains | None = None,
        class_channels: int | None = None,
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.strides = STRIDES
        self.max_stride = max(STRIDES)
        self.reg_max = REG_MAX
        self.backbone = GELANBackbone(spec)
        self.neck = GELANNeck(spec, self.backbone.out_channels)
        self.head = self._make_head(num_classes, class_channels)
        self.one_to_one_head = self._make_head(num_classes, class_channels)
        self.one_to_one_head.load_state_dict(self.head.state_dict())
        self.loss_gains = loss_gains or DetectionLossGains()
        self.one_to_many_loss = TaskAlignedDetectionLoss(
            num_classes, REG_MAX, TaskAlignedAssigner(num_classes, top_k=ONE_TO_MANY_TOP_K, alpha=ASSIGNER_ALPHA, beta=ASSIGNER_BETA)
        )
        self.one_to_one_loss = TaskAlignedDetectionLoss(
            num_classes, REG_MAX, TaskAlignedAssigner(num_classes, top_k=ONE_TO_ONE_TOP_K, alpha=ASSIGNER_ALPHA, beta=ASSIGNER_BETA)
        )

    def _make_head(self, num_classes: int, class_channels: int | None) -> DecoupledDetectionHead:
        return DecoupledDetectionHead(
            num_classes,
            self.neck.out_channels,
            STRIDES,
            reg_max=REG_MAX,
            box_groups=BOX_BRANCH_GROUPS,
            class_channels=class_channels,
        )

    def forward(self, images: torch.Tensor) -> dict[str, Any]:
        """Dense predictions of ``images``; see the class docstring for what each mode returns."""
        if images.dim() != 4 or images.shape[2] % self.max_stride or images.shape[3] % self.max_stride:
            raise ValueError(
                f"YOLOv9-E2E takes N×3×H×W images with H and W multiples of {self.max_stride}, got {tuple(images.shape)}; "
                "letterbox or resize the input"
            )
        features: Sequence[torch.Tensor] = self.neck(self.backbone(images))
        if not self.training:
            return self.one_to_one_head(features)
        outputs: dict[str, Any] = self.head(features)
        outputs["one_to_one"] = self.one_to_one_head([feature.detach() for feature in features])
        return outputs

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)``: the gained sum of both heads' box, cls and dfl terms (each normalised
        by its own head's soft-target sum) times the nominal batch 64; ``items`` are the gained
        terms of both heads together."""
        if "one_to_one" not in outputs:
            raise ValueError("YOLOv9-E2E's loss needs train-mode outputs (with the one-to-one head's under 'one_to_one')")
        batch_size = int(batch["images"].shape[0])
        targets = batch["targets"]
        terms = self.one_to_many_loss(outputs, targets, batch_size)
        terms = terms.plus(self.one_to_one_loss(outputs["one_to_one"], targets, batch_size))
        weighted = terms.weighted(self.loss_gains)
        items = {"box": weighted.box.detach(), "cls": weighted.cls.detach(), "dfl": weighted.dfl.detach()}
        return weighted.total() * YOLO_NOMINAL_BATCH_SIZE, items

    @torch.no_grad()
    def postprocess(
        self, outputs: Mapping[str, Any], conf: float = 0.25, iou: float = 0.7, max_det: int = 300, *,
        placements: Sequence[ImagePlacement] | None = None,
    ) -> list[dict[str, torch.Tensor]]:
        """Detections per image: ``boxes`` (n×4 xyxy), ``scores``, ``labels`` (int64).

        Reads the one-to-one head's predictions (eval outputs, or the ``"one_to_one"`` entry of
        train outputs). ``iou`` is accepted for the task contract and ignored: there is no NMS.
        The boxes are in input pixels, or with ``placements`` (one per image) mapped back to the
        original image, clipped to it and the empty ones dropped (the reference's order).
        """
        del iou
        head_outputs = outputs.get("one_to_one", outputs)
        if "boxes" in head_outputs and "scores" in head_outputs:
            boxes, scores = head_outputs["boxes"], head_outputs["scores"]
        else:
            boxes, scores = decode_dense_predictions(dict(head_outputs), self.reg_max)
        detections = top_k_detections(boxes, scores, conf, max_det)
        if placements is not None:
            for detection, (ratio_pad, shape) in zip(detections, placements):
                mapped = boxes_to_original(detection["boxes"], ratio_pad, shape)
                inside = drop_empty_boxes(mapped)
                detection.update(boxes=mapped[inside], scores=detection["scores"][inside], labels=detection["labels"][inside])
        return detections

    def drop_one_to_many_head(self) -> "YOLOv9E2E":
        """Remove the one-to-many head (training only): what remains is the inference model
        (its parameter count is YOLOv9's). ``train()``-mode forward then no longer works."""
        self.head = None  # type: ignore[assignment]
        return self

    def fuse(self) -> "YOLOv9E2E":
        """Inference form: one-to-many head dropped, RepConvN merged, BatchNorms folded (eval mode)."""
        self.drop_one_to_many_head()
        fuse_for_inference(self)
        return self


def build_yolo9_e2e(request: BuildRequest) -> YOLOv9E2E:
    """The registry builder of ``yolo9_e2e``: ``request.config`` is the size's ``GELANSpec`` data.

    Option: ``class_channels`` (int) sets the width of both heads' class towers (default
    ``max(first neck width, min(classes, 100))``; files fine-tuned from COCO keep 80-wide towers).
    Option: ``bn_momentum`` (number in (0, 1], default the published 0.03): the BatchNorms'
    running-statistics momentum; a run of a hundred steps needs torch's 0.1, or its eval-mode
    statistics still lag the weights.
    """
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"yolo9_e2e does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    class_channels = request.options.get("class_channels")
    if class_channels is not None and (not isinstance(class_channels, int) or isinstance(class_channels, bool) or class_channels < 1):
        raise ValueError(f"yolo9_e2e option class_channels must be a positive integer, got {class_channels!r}")
    spec = GELANSpec.from_config(request.config, where=f"registry.yaml yolo9_e2e size {request.size!r} config")
    model = YOLOv9E2E(request.num_classes, spec, class_channels=class_channels)
    return apply_batchnorm_momentum_option(model, request.options, family="yolo9_e2e")
