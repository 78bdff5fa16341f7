"""YOLOv9 (Wang, Yeh & Liao, ECCV 2024): the GELAN detector, with PGI's auxiliary branch on demand.

Architecture (per size, data from registry.yaml, transcribed from the official
``models/detect/gelan-{t,s,m,c}.yaml``): a GELAN backbone (two stride-2 convs, an ELAN1 or
RepNCSPELAN4 block at P2, then downsample + RepNCSPELAN4 at P3, P4, P5), a PAN neck (SPPELAN,
a top-down path and a bottom-up path of RepNCSPELAN4 blocks) and a decoupled anchor-free head
with DFL (reg_max 16, YOLOv9's grouped box branch) at strides 8, 16, 32. The default build is
the graph of the published ("converted", yolov9-*-converted.pt) inference models in its trainable
form: ``fuse()`` folds its BatchNorms and merges its RepConvN branches, after which its parameter
count and FLOPs are those of the YOLOv9 README (tests/test_yolo9.py).

PGI (programmable gradient information) is training-only. ``pgi=True`` adds the auxiliary branch
of the official ``models/detect/yolov9-{t,s,m,c}.yaml`` and its own head (DualDDetect):

- YOLOv9-T/S: an auxiliary top-down path (its own SPPELAN and two RepNCSPELAN4) fed by the
  backbone's P3-P5;
- YOLOv9-M/C: the multi-level reversible auxiliary branch, a second GELAN backbone from the image
  into which CBLinear projections of the main backbone's P3-P5 are fused (CBFuse) after each
  downsample.

The auxiliary head's loss (its own task-aligned assignment) is weighted 0.25 against the main
head's, as ``utils/loss_tal_dual.py`` does. ``drop_auxiliary_branch()`` removes it, leaving the
exact inference model (same state-dict keys as a ``pgi=False`` build); so does ``fuse()``.
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
    CBLinear,
    GELANBackbone,
    GELANNeck,
    GELANSpec,
    GELANTopDownPath,
    fuse_for_inference,
)
from zoo_core.nn.norm import apply_batchnorm_momentum_option
from zoo_core.ops.dense_postprocess import DenseDetectionPostprocess, DenseNMSDefaults

__all__ = [
    "GELANSpec",
    "GELANBackbone",
    "GELANTopDownPath",
    "GELANNeck",
    "AuxiliaryTopDownBranch",
    "ReversibleAuxiliaryBranch",
    "YOLOv9",
    "build_yolo9",
]

# The GELAN trunk (spec, backbone, neck) is shared with yolo9_e2e and lives in zoo_core.nn.gelan.
STRIDES = GELAN_STRIDES
REG_MAX = DDETECT_REG_MAX
BOX_BRANCH_GROUPS = DDETECT_BOX_GROUPS
AUXILIARY_LOSS_WEIGHT = 0.25  # utils/loss_tal_dual.py: auxiliary head's terms × 0.25, main × 1
ASSIGNER_TOP_K, ASSIGNER_ALPHA, ASSIGNER_BETA = 10, 0.5, 6.0  # utils/loss_tal.py
BUILD_OPTIONS = ("pgi", "class_channels", "bn_momentum")


class ReversibleAuxiliaryBranch(nn.Module):
    """PGI's multi-level reversible auxiliary branch (YOLOv9-M/C): CBLinear projections of the main
    backbone's P3-P5, fused into a second GELAN backbone run on the image."""

    def __init__(self, spec: GELANSpec, backbone_channels: Sequence[int]) -> None:
        super().__init__()
        fuse_widths = [down_width for down_width, *_ in spec.backbone]
        # The main level i feeds every auxiliary level up to i, at that level's downsample width.
        self.routers = nn.ModuleList(
            CBLinear(channels, fuse_widths[: level + 1]) for level, channels in enumerate(backbone_channels)
        )
        self.backbone = GELANBackbone(spec, injectable=True)
        self.out_channels = self.backbone.out_channels

    def forward(self, images: torch.Tensor, backbone_features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Auxiliary P3-P5 maps."""
        routed = [router(feature) for router, feature in zip(self.routers, backbone_features)]
        injections = [[pieces[level] for pieces in routed[level:]] for level in range(len(routed))]
        return self.backbone(images, injections)


class AuxiliaryTopDownBranch(nn.Module):
    """PGI's auxiliary branch of YOLOv9-T/S: a second top-down path on the backbone's P3-P5."""

    def __init__(self, spec: GELANSpec, backbone_channels: Sequence[int]) -> None:
        super().__init__()
        self.top_down = GELANTopDownPath(spec, backbone_channels)
        self.out_channels = self.top_down.out_channels

    def forward(self, images: torch.Tensor, backbone_features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Auxiliary P3-P5 maps (``images`` unused; same signature as the reversible branch)."""
        return self.top_down(backbone_features)


class YOLOv9(DenseDetectionPostprocess, nn.Module):
    """The YOLOv9 detector (GELAN + decoupled DFL head), zoo's detection model contract.

    - ``forward(images)`` (N×3×H×W in [0, 1], H and W multiples of 32) returns the head dict of
      ``zoo_core.nn.detection_head`` (decoded ``boxes``/``scores`` added in eval mode; with PGI
      in train mode, the auxiliary head's dict under ``"auxiliary"``).
    - ``loss(outputs, batch)``: task-aligned assignment, BCE + CIoU + DFL with gains 7.5/0.5/1.5,
      times the constant ``YOLO_NOMINAL_BATCH_SIZE`` (see zoo_core.losses.detection).
    - ``postprocess(outputs, conf, iou, max_det)``: per-class NMS (torchvision ``batched_nms``).
    """

    # Every class above the threshold (the official val.py's and LibreYOLO 1.6's multi-label NMS), 30000 candidates at most.
    nms_defaults = DenseNMSDefaults(iou=0.7, multi_label=True, max_candidates=30000)

    def __init__(
        self, num_classes: int, spec: GELANSpec, *, pgi: bool = False, loss_gains: DetectionLossGains | None = None,
        class_channels: int | None = None, box_groups: int = BOX_BRANCH_GROUPS,
    ) -> None:
        """``box_groups``: groups of the box branch's last two convs (DDetect's 4; the segmentation
        models' Detect-based head has 1)."""
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.strides = STRIDES
        self.max_stride = max(STRIDES)
        self.reg_max = REG_MAX
        self.backbone = GELANBackbone(spec)
        self.neck = GELANNeck(spec, self.backbone.out_channels)
        self.head = DecoupledDetectionHead(
            num_classes, self.neck.out_channels, STRIDES, reg_max=REG_MAX, box_groups=box_groups,
            class_channels=class_channels,
        )
        self.auxiliary_branch: nn.Module | None = None
        self.auxiliary_head: DecoupledDetectionHead | None = None
        if pgi:
            if spec.pgi is None:
                raise ValueError("this GELAN config names no PGI branch ('pgi': auxiliary_neck or reversible_backbone)")
            branch_type = AuxiliaryTopDownBranch if spec.pgi == "auxiliary_neck" else ReversibleAuxiliaryBranch
            branch = branch_type(spec, self.backbone.out_channels)
            self.auxiliary_branch = branch
            self.auxiliary_head = DecoupledDetectionHead(
                num_classes, branch.out_channels, STRIDES, reg_max=REG_MAX, box_groups=BOX_BRANCH_GROUPS
            )
        self.loss_gains = loss_gains or DetectionLossGains()
        self.criterion = TaskAlignedDetectionLoss(
            num_classes,
            REG_MAX,
            TaskAlignedAssigner(num_classes, top_k=ASSIGNER_TOP_K, alpha=ASSIGNER_ALPHA, beta=ASSIGNER_BETA),
        )

    @property
    def has_auxiliary_branch(self) -> bool:
        """Whether the PGI auxiliary branch is present (it only runs in train mode)."""
        return self.auxiliary_branch is not None

    def forward(self, images: torch.Tensor) -> dict[str, Any]:
        """Dense predictions of ``images``; see the class docstring for the dict's keys."""
        if images.dim() != 4 or images.shape[2] % self.max_stride or images.shape[3] % self.max_stride:
            raise ValueError(
                f"YOLOv9 takes N×3×H×W images with H and W multiples of {self.max_stride}, got {tuple(images.shape)}; "
                "letterbox or resize the input"
            )
        features = self.backbone(images)
        outputs: dict[str, Any] = self.head(self.neck(features))
        if self.training and self.auxiliary_branch is not None and self.auxiliary_head is not None:
            outputs["auxiliary"] = self.auxiliary_head(self.auxiliary_branch(images, features))
        return outputs

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)`` for a detection batch (``images``, ``targets`` M×6 in input pixels).

        ``loss`` is the gained sum of the box, cls and dfl terms (each normalised by the local
        batch's soft-target sum, clamped at 1 as in YOLO, so not growing with the batch size)
        times the constant nominal batch 64 under which YOLO's published learning rates hold;
        ``items`` are the gained terms. With PGI the auxiliary head's terms count 0.25.
        """
        batch_size = int(batch["images"].shape[0])
        targets = batch["targets"]
        terms = self.criterion(outputs, targets, batch_size)
        if "auxiliary" in outputs:
            terms = terms.plus(self.criterion(outputs["auxiliary"], targets, batch_size), weight=AUXILIARY_LOSS_WEIGHT)
        weighted = terms.weighted(self.loss_gains)
        items = {"box": weighted.box.detach(), "cls": weighted.cls.detach(), "dfl": weighted.dfl.detach()}
        return weighted.total() * YOLO_NOMINAL_BATCH_SIZE, items

    def decode(self, outputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(boxes N×A×4 xyxy in input pixels, scores N×A×C)`` from the raw head outputs (DFL decoding)."""
        return decode_dense_predictions(dict(outputs), self.reg_max)

    def drop_auxiliary_branch(self) -> "YOLOv9":
        """Remove PGI's auxiliary branch and head: what remains is the published inference model."""
        self.auxiliary_branch = None
        self.auxiliary_head = None
        return self

    def fuse(self) -> "YOLOv9":
        """Inference form: auxiliary branch dropped, RepConvN merged, BatchNorms folded (eval mode)."""
        self.drop_auxiliary_branch()
        fuse_for_inference(self)
        return self


def build_yolo9(request: BuildRequest) -> YOLOv9:
    """The registry builder of ``yolo9``: ``request.config`` is the size's ``GELANSpec`` data.

    Options: ``pgi`` (bool, default False) adds PGI's training-only auxiliary branch;
    ``class_channels`` (int) sets the width of the class towers (default ``max(first neck width,
    min(classes, 100))``; files fine-tuned from COCO keep their 80-wide towers); ``bn_momentum``
    (``zoo_core.nn.norm``) for runs too short for the published 0.03.
    """
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"yolo9 does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    pgi = request.options.get("pgi", False)
    if not isinstance(pgi, bool):
        raise ValueError(f"yolo9 option pgi must be True or False, got {pgi!r}")
    class_channels = request.options.get("class_channels")
    if class_channels is not None and (not isinstance(class_channels, int) or isinstance(class_channels, bool) or class_channels < 1):
        raise ValueError(f"yolo9 option class_channels must be a positive integer, got {class_channels!r}")
    spec = GELANSpec.from_config(request.config, where=f"registry.yaml yolo9 size {request.size!r} config")
    model = YOLOv9(request.num_classes, spec, pgi=pgi, class_channels=class_channels)
    return apply_batchnorm_momentum_option(model, request.options, family="yolo9")
