"""The dynamic soft-label assigner of RTMDet (Lyu et al., arXiv:2212.07784, section 3.3), batched.

Candidates of a ground truth are the anchor points lying strictly inside *some* real ground-truth
box of the image. For every (ground truth, candidate) pair a matching cost adds three terms:

- a **soft classification cost**: the quality-focal-style binary cross-entropy of the candidate's
  class logits against the soft label ``one_hot(class) * IoU``, each class weighted by
  ``|soft label - sigmoid(logit)| ** 2``, summed over the classes;
- a **regression cost** ``-log(IoU + 1e-7) * iou_weight`` (IoU of the candidate's predicted box
  with the ground truth);
- a **soft centre prior** ``10 ** (d - soft_center_radius)``, ``d`` the distance from the anchor
  point to the box centre measured in the anchor's stride.

Each ground truth then takes its ``k`` cheapest candidates, ``k`` being the integer part of the sum
of its ``top_k`` (13) largest candidate IoUs, at least 1 (SimOTA's dynamic k). A candidate taken by
several ground truths keeps the one of lowest cost (over every ground truth of the image). A
positive learns its ground truth's class with the soft target ``IoU`` (quality focal loss) and its
box with a weight of that same IoU.

Everything is computed for the whole padded batch at once (B×G×A tensors), with no loop over
images or boxes and no device synchronisation. The classification cost is not materialised per
class: only the label's class has a non-zero soft target, so the sum over classes is the sum of
every class's negative term (one B×A vector) minus the label class's negative term plus its
positive term, which keeps memory at B×A×C + B×G×A instead of B×G×A×C.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from zoo_core.ops.boxes import aligned_box_iou

__all__ = ["DynamicSoftLabelAssignment", "DynamicSoftLabelAssigner"]

_LOG_EPS = 1e-7  # inside the regression cost's logarithm


class DynamicSoftLabelAssignment(NamedTuple):
    """What each anchor of a batch learns (B images, A anchors, C classes).

    Same fields as ``zoo_core.assigners.task_aligned.TaskAlignedAssignment`` (a loss can read
    either), plus ``quality``:

    - ``labels`` (B×A int64) and ``boxes`` (B×A×4 xyxy) of the assigned ground truth (ground
      truth 0's for background anchors: read them through ``foreground``);
    - ``scores`` (B×A×C): the soft classification target, the IoU at the assigned class of a
      positive, zero elsewhere;
    - ``foreground`` (B×A bool) marks positives; ``gt_index`` (B×A int64) is the assigned slot
      in the padded ground-truth tensors;
    - ``quality`` (B×A): the IoU of a positive's predicted box with its ground truth (0 for
      background), what RTMDet weights the box loss and normalises the losses with.
    """

    labels: torch.Tensor
    boxes: torch.Tensor
    scores: torch.Tensor
    foreground: torch.Tensor
    gt_index: torch.Tensor
    quality: torch.Tensor


def _negative_term(logits: torch.Tensor) -> torch.Tensor:
    """Soft classification cost of a class whose soft label is 0: ``BCE(x, 0) * sigmoid(x)**2``."""
    return F.softplus(logits) * logits.sigmoid().square()


def _positive_term(logits: torch.Tensor, soft_labels: torch.Tensor) -> torch.Tensor:
    """Soft classification cost of a class whose soft label is ``t``: ``BCE(x, t) * |t - sigmoid(x)|**2``."""
    cross_entropy = F.binary_cross_entropy_with_logits(logits, soft_labels, reduction="none")
    return cross_entropy * (soft_labels - logits.sigmoid()).square()


class DynamicSoftLabelAssigner:
    """RTMDet's label assignment for a padded batch (stateless, picklable).

    RTMDet uses ``top_k=13, iou_weight=3.0, soft_center_radius=3.0`` (mmdetection's
    ``rtmdet_*`` configs, ``DynamicSoftLabelAssigner(topk=13)`` with its defaults).
    """

    def __init__(self, num_classes: int, top_k: int = 13, iou_weight: float = 3.0, soft_center_radius: float = 3.0) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1 candidate per box, got {top_k}")
        self.num_classes = num_classes
        self.top_k = top_k
        self.iou_weight = iou_weight
        self.soft_center_radius = soft_center_radius

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_classes={self.num_classes}, top_k={self.top_k}, "
            f"iou_weight={self.iou_weight}, soft_center_radius={self.soft_center_radius})"
        )

    def _empty(self, class_logits: torch.Tensor, gt_boxes: torch.Tensor) -> DynamicSoftLabelAssignment:
        batch_size, num_anchors, _ = class_logits.shape
        device = class_logits.device
        return DynamicSoftLabelAssignment(
            labels=torch.zeros(batch_size, num_anchors, dtype=torch.int64, device=device),
            boxes=torch.zeros(batch_size, num_anchors, 4, dtype=gt_boxes.dtype, device=device),
            scores=torch.zeros_like(class_logits),
            foreground=torch.zeros(batch_size, num_anchors, dtype=torch.bool, device=device),
            gt_index=torch.zeros(batch_size, num_anchors, dtype=torch.int64, device=device),
            quality=torch.zeros(batch_size, num_anchors, dtype=class_logits.dtype, device=device),
        )

    def cost_matrix(
        self,
        class_logits: torch.Tensor,
        pred_boxes: torch.Tensor,
        anchor_points: torch.Tensor,
        anchor_strides: torch.Tensor,
        gt_labels: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_mask: torch.Tensor,
        gt_centres: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(cost, ious, candidate)``, each B×G×A: the matching cost (+inf where the anchor is no
        candidate of the image or the ground truth is padding), the predicted boxes' IoUs with the
        ground truths, and the candidate mask (anchor inside some real ground truth of its image).
        ``gt_centres`` (B×G×2) replaces the boxes' centres in the centre prior."""
        batch_size, num_anchors, _ = class_logits.shape
        num_gt = gt_boxes.shape[1]
        points = anchor_points[None, None]  # 1×1×A×2
        boxes = gt_boxes[:, :, None, :]  # B×G×1×4
        inside = torch.cat((points - boxes[..., :2], boxes[..., 2:] - points), dim=-1).amin(dim=-1) > 0
        inside = inside & gt_mask[:, :, None]
        candidate = inside.any(dim=1, keepdim=True).expand(-1, num_gt, -1)  # B×G×A

        ious = aligned_box_iou(pred_boxes[:, None, :, :], boxes, kind="iou").clamp(min=0)  # B×G×A
        regression_cost = -torch.log(ious + _LOG_EPS) * self.iou_weight

        centres = (gt_boxes[..., :2] + gt_boxes[..., 2:]) / 2 if gt_centres is None else gt_centres.float()  # B×G×2
        distance = (points - centres[:, :, None, :]).norm(dim=-1) / anchor_strides.reshape(1, 1, num_anchors)
        centre_prior = torch.pow(10.0, distance - self.soft_center_radius)

        logits = class_logits.float()
        label_index = gt_labels.clamp(0, self.num_classes - 1)[:, :, None].expand(-1, -1, num_anchors)
        label_logits = logits.transpose(1, 2).gather(1, label_index)  # B×G×A
        negative_sum = _negative_term(logits).sum(dim=-1)  # B×A
        classification_cost = (
            negative_sum[:, None, :] - _negative_term(label_logits) + _positive_term(label_logits, ious.to(label_logits.dtype))
        )

        cost = classification_cost + regression_cost + centre_prior
        usable = candidate & gt_mask[:, :, None]
        cost = cost.masked_fill(~usable, float("inf"))
        return cost, ious, candidate

    @torch.no_grad()
    def __call__(
        self,
        class_logits: torch.Tensor,
        pred_boxes: torch.Tensor,
        anchor_points: torch.Tensor,
        anchor_strides: torch.Tensor,
        gt_labels: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_mask: torch.Tensor,
        gt_centres: torch.Tensor | None = None,
    ) -> DynamicSoftLabelAssignment:
        """Assign a padded batch of ground truths to anchors.

        Args:
            class_logits: B×A×C predicted class logits (before the sigmoid).
            pred_boxes: B×A×4 predicted xyxy boxes, in the units of ``gt_boxes``.
            anchor_points: A×2 anchor points (x, y), same units (RTMDet: the cells' top-left corners).
            anchor_strides: A×1 (or A) stride of each anchor, same units.
            gt_labels: B×G class indices (any integer or float dtype), padded.
            gt_boxes: B×G×4 xyxy ground-truth boxes, padded.
            gt_mask: B×G bool, True for real (non-padding) ground truths.
            gt_centres: B×G×2 centres for the soft centre prior, default the boxes' centres
                (mmdetection's instance heads give the masks' centres of mass).
        """
        batch_size, num_anchors, num_classes = class_logits.shape
        if num_classes != self.num_classes:
            raise ValueError(f"class_logits has {num_classes} classes but the assigner was built for {self.num_classes}")
        num_gt = gt_boxes.shape[1]
        if num_gt == 0 or num_anchors == 0:
            return self._empty(class_logits, gt_boxes)
        gt_labels = gt_labels.reshape(batch_size, num_gt).long()
        gt_mask = gt_mask.reshape(batch_size, num_gt).bool()
        class_logits, pred_boxes, gt_boxes = class_logits.float(), pred_boxes.float(), gt_boxes.float()

        cost, ious, candidate = self.cost_matrix(
            class_logits, pred_boxes, anchor_points.float(), anchor_strides.float(), gt_labels, gt_boxes, gt_mask, gt_centres
        )

        # Dynamic k per ground truth: integer part of the sum of its top_k candidate IoUs, at least 1.
        top_k = min(self.top_k, num_anchors)
        candidate_ious = ious * candidate
        dynamic_k = candidate_ious.topk(top_k, dim=-1).values.sum(dim=-1).int().clamp(min=1)  # B×G
        # k never exceeds top_k (IoUs are at most 1), so the top_k cheapest candidates hold the k cheapest.
        cheapest = cost.topk(top_k, dim=-1, largest=False).indices  # B×G×top_k
        ranks = torch.arange(top_k, device=cost.device)
        taken = torch.zeros_like(candidate).scatter_(-1, cheapest, ranks < dynamic_k[..., None])
        taken = taken & candidate & gt_mask[:, :, None]

        # A candidate taken by several ground truths keeps the cheapest ground truth (of all).
        contested = taken.sum(dim=1) > 1  # B×A
        cheapest_gt = F.one_hot(cost.argmin(dim=1), num_gt).transpose(1, 2).bool()  # B×G×A
        taken = torch.where(contested[:, None, :], cheapest_gt, taken)

        foreground = taken.any(dim=1)
        gt_index = taken.to(torch.uint8).argmax(dim=1)  # B×A
        labels = gt_labels.gather(1, gt_index)
        boxes = gt_boxes.gather(1, gt_index[..., None].expand(-1, -1, 4))
        quality = ious.gather(1, gt_index[:, None, :]).squeeze(1) * foreground
        scores = F.one_hot(labels.clamp(0, num_classes - 1), num_classes).to(quality.dtype) * quality[..., None]
        return DynamicSoftLabelAssignment(
            labels=labels, boxes=boxes, scores=scores, foreground=foreground, gt_index=gt_index, quality=quality
        )
