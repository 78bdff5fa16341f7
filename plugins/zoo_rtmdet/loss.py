"""RTMDet's loss: dynamic soft-label assignment, quality focal loss (weight 1) + GIoU loss (weight 2);
RTMDet-Ins's adds a dice loss on the positives' masks (weight 2).

Following mmdetection's ``RTMDetHead.loss_by_feat`` (``configs/rtmdet/rtmdet_l_8xb32-300e_coco.py``:
``QualityFocalLoss(beta=2.0, loss_weight=1.0)``, ``GIoULoss(loss_weight=2.0)``,
``DynamicSoftLabelAssigner(topk=13)``):

- the class target of a positive is the IoU of its predicted box with its ground truth (0
  elsewhere), learnt with the quality focal loss summed over anchors and classes;
- the box term is ``1 - GIoU`` of the positives' predicted boxes, each weighted by that IoU;
- both are divided by the sum of the positives' IoUs, averaged over the ranks of a distributed
  run (mmdetection's ``reduce_mean``) and clamped at 1: the normaliser is then the same on every
  rank, so DDP's gradient average equals the single-process gradient of the whole batch.

The loss is computed for the whole padded batch with tensor operations only: no loop over
images, no host synchronisation (background anchors carry a zero box weight instead of being
filtered out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, NamedTuple

import torch
import torch.nn.functional as F

from zoo_core.assigners.dynamic_soft_label import DynamicSoftLabelAssigner, DynamicSoftLabelAssignment
from zoo_core.losses.detection import pad_targets_per_image, target_rows_per_image
from zoo_core.losses.dice import dice_loss
from zoo_core.losses.iou_aware_classification import quality_focal_loss
from zoo_core.ops.boxes import aligned_box_iou, distances_to_boxes
from zoo_core.ops.distributed import mean_over_ranks

if TYPE_CHECKING:
    from .instance import DynamicKernelLayout

__all__ = ["RTMDetLossTerms", "RTMDetLoss", "RTMDetInsLossTerms", "RTMDetInsLoss", "mask_centres_of_mass"]

CLASS_WEIGHT, BOX_WEIGHT, QFL_BETA = 1.0, 2.0, 2.0
# mmdetection configs/rtmdet/rtmdet-ins_s_8xb32-300e_coco.py: DiceLoss(loss_weight=2.0, eps=5e-6, reduction='mean'),
# RTMDetInsHead(mask_loss_stride=4).
MASK_WEIGHT, DICE_EPS, MASK_LOSS_STRIDE = 2.0, 5e-6, 4


class RTMDetLossTerms(NamedTuple):
    """The two weighted, normalised loss terms (scalars)."""

    cls: torch.Tensor
    box: torch.Tensor


class RTMDetLoss:
    """The loss terms of RTMDet head outputs against the task's M×6 pixel targets (picklable)."""

    def __init__(
        self,
        num_classes: int,
        assigner: DynamicSoftLabelAssigner | None = None,
        *,
        class_weight: float = CLASS_WEIGHT,
        box_weight: float = BOX_WEIGHT,
        beta: float = QFL_BETA,
    ) -> None:
        self.num_classes = num_classes
        self.assigner = assigner or DynamicSoftLabelAssigner(num_classes, top_k=13, iou_weight=3.0, soft_center_radius=3.0)
        self.class_weight = class_weight
        self.box_weight = box_weight
        self.beta = beta

    def __call__(self, outputs: Mapping[str, torch.Tensor], targets: torch.Tensor, batch_size: int) -> RTMDetLossTerms:
        """Weighted loss terms of ``outputs`` (the head dict) against ``targets`` (M×6, input pixels)."""
        terms, _, _ = self.terms_and_assignment(outputs, targets, batch_size)
        return terms

    def terms_and_assignment(
        self, outputs: Mapping[str, torch.Tensor], targets: torch.Tensor, batch_size: int,
        gt_centres: torch.Tensor | None = None,
    ) -> tuple[RTMDetLossTerms, DynamicSoftLabelAssignment, int]:
        """The loss terms, the assignment they came from and the padded ground-truth count per image.

        ``gt_centres`` (B×G×2, the padded layout of ``pad_targets_per_image``) replaces the boxes'
        centres in the assigner's centre prior.
        """
        class_logits = outputs["class_logits"].float()
        distances = outputs["box_distances"].float()
        anchor_points, anchor_strides = outputs["anchor_points"], outputs["anchor_strides"]
        if class_logits.shape[-1] != self.num_classes:
            raise ValueError(f"the head predicts {class_logits.shape[-1]} classes but the loss was built for {self.num_classes}")
        gt_labels, gt_boxes, gt_mask = pad_targets_per_image(
            targets.to(class_logits.device, torch.float32), batch_size, num_classes=self.num_classes
        )
        pred_boxes = distances_to_boxes(distances, anchor_points)
        assignment = self.assigner(
            class_logits.detach(), pred_boxes.detach(), anchor_points, anchor_strides, gt_labels, gt_boxes, gt_mask, gt_centres
        )
        normaliser = mean_over_ranks(assignment.quality.sum()).clamp(min=1.0)

        cls_loss = quality_focal_loss(class_logits, assignment.scores, beta=self.beta).sum() / normaliser
        # Every anchor enters the GIoU term; background anchors weigh 0, so no data-dependent filtering
        # (and no host sync) is needed and the regression branch always stays in the graph.
        giou = aligned_box_iou(pred_boxes, assignment.boxes, kind="giou")
        box_loss = ((1.0 - giou) * assignment.quality).sum() / normaliser
        terms = RTMDetLossTerms(cls=cls_loss * self.class_weight, box=box_loss * self.box_weight)
        return terms, assignment, int(gt_boxes.shape[1])


def mask_centres_of_mass(masks: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """n×2 ``(x, y)`` centres of mass of n binary masks (mmdetection's ``center_of_mass``), in mask pixels.

    An empty mask (an object too thin to cover a pixel) takes its box's centre instead of mmdetection's
    ``(0, 0)``, which would pull the centre prior to the image corner.
    """
    masks = masks.float()
    height, width = masks.shape[-2:]
    area = masks.sum(dim=(1, 2))
    centre_y = (masks.sum(dim=2) * torch.arange(height, device=masks.device, dtype=torch.float32)).sum(dim=1)
    centre_x = (masks.sum(dim=1) * torch.arange(width, device=masks.device, dtype=torch.float32)).sum(dim=1)
    centres = torch.stack((centre_x, centre_y), dim=1) / area.clamp(min=1e-7)[:, None]
    box_centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    return torch.where((area > 0)[:, None], centres, box_centres.float())


class RTMDetInsLossTerms(NamedTuple):
    """The three weighted, normalised loss terms (scalars)."""

    cls: torch.Tensor
    box: torch.Tensor
    mask: torch.Tensor


class RTMDetInsLoss(RTMDetLoss):
    """RTMDet-Ins's loss (mmdetection ``RTMDetInsHead.loss_by_feat``), picklable.

    RTMDet's two terms, with the masks' centres of mass in the assigner's centre prior; then for
    every positive anchor its mask logits (its dynamic kernels on its image's stride-8 mask
    features) upsampled ×2 to stride 4, against its ground-truth mask sampled at stride 4 (the
    pixel at offset 2 of each 4×4 cell), dice loss summed over the positives and divided by their
    count averaged over the ranks (at least 1), weight 2.
    """

    def __init__(self, num_classes: int, layout: "DynamicKernelLayout", *, mask_weight: float = MASK_WEIGHT, **options) -> None:
        super().__init__(num_classes, **options)
        self.layout = layout
        self.mask_weight = mask_weight

    def __call__(  # type: ignore[override]
        self, outputs: Mapping[str, torch.Tensor], targets: torch.Tensor, masks: torch.Tensor, batch_size: int,
    ) -> RTMDetInsLossTerms:
        """Weighted loss terms of ``outputs`` against ``targets`` (M×6, input pixels) and ``masks`` (M×H×W, row i of target i)."""
        from .instance import dynamic_mask_logits

        features = outputs["mask_features"]
        masks = masks.to(features.device)
        if masks.dim() != 3 or len(masks) != len(targets):
            raise ValueError(f"masks must be M×H×W with one row per target row, got {tuple(masks.shape)} for {len(targets)} targets")
        targets = targets.to(features.device, torch.float32)
        rows = None
        centres = None
        if len(targets):
            _, _, gt_mask = pad_targets_per_image(targets, batch_size)
            rows = target_rows_per_image(targets, batch_size, gt_mask.shape[1])
            row_centres = mask_centres_of_mass(masks, targets[:, 2:6])
            centres = row_centres[rows.clamp(min=0)]
        terms, assignment, _ = self.terms_and_assignment(outputs, targets, batch_size, centres)

        image_index, anchor_index = assignment.foreground.nonzero(as_tuple=True)
        positives = mean_over_ranks(features.new_tensor(float(len(image_index)))).clamp(min=1.0)
        # Keeps the kernel and mask branches in the graph when there is nothing to learn (DDP needs every gradient).
        untouched = 0.0 * (features.sum() + outputs["mask_coefficients"].sum())
        if rows is None or not len(image_index):
            return RTMDetInsLossTerms(terms.cls, terms.box, untouched)
        stride = float(masks.shape[-1]) / features.shape[-1]
        logits = dynamic_mask_logits(
            features[image_index], outputs["mask_coefficients"][image_index, anchor_index],
            outputs["anchor_points"][anchor_index], outputs["anchor_strides"].reshape(-1)[anchor_index], self.layout, stride,
        )
        upsample = stride / MASK_LOSS_STRIDE
        logits = F.interpolate(logits[None], scale_factor=upsample, mode="bilinear", align_corners=False)[0]
        gt = masks[rows[image_index, assignment.gt_index[image_index, anchor_index]]]
        offset = MASK_LOSS_STRIDE // 2
        gt = gt[:, offset::MASK_LOSS_STRIDE, offset::MASK_LOSS_STRIDE][:, : logits.shape[-2], : logits.shape[-1]]
        mask_loss = dice_loss(logits, gt, eps=DICE_EPS).sum() / positives
        return RTMDetInsLossTerms(terms.cls, terms.box, mask_loss * self.mask_weight + untouched)
