"""SimOTA: dynamic-k label assignment (Ge et al., YOLOX, 2021, arXiv:2107.08430, section 2.2).

SimOTA is a cheap approximation of optimal-transport assignment. For one image with G ground
truths and A anchors (grid cells, or anchor boxes of cells) it needs two G×A matrices, both
computed by the caller from the *current* predictions:

- ``cost[g, a]``: how costly it is to make anchor ``a`` learn ground truth ``g``; every user
  sums a classification cost and ``3 ×`` an IoU cost, plus a large constant for pairs outside a
  geometric prior;
- ``ious[g, a]``: IoU of anchor ``a``'s predicted box with ground truth ``g``.

and a boolean ``eligible[g, a]`` that says which pairs take part at all. Then:

1. **dynamic k**: each ground truth gets ``k_g = max(1, floor(sum of its candidate_top_k (10)
   largest IoUs over eligible anchors))`` positives: a box the predictions already cover well
   gets more anchors;
2. each ground truth takes its ``k_g`` cheapest eligible anchors;
3. an anchor taken by several ground truths keeps only the one with the lowest cost (over all
   real ground truths, as the published code does, not only over those that took it).

The result says, per anchor, whether it is a positive, which ground truth it learns, and the IoU
of its prediction with that ground truth (YOLOX's soft class target).

This module is batched: all images at once, ground truths padded to G per image (``gt_mask``
marks real ones), no Python loop over images or boxes and no host synchronisation. Memory is
O(B·G·A) (a cost and an IoU matrix).

How the families use it
-----------------------
- **YOLOX** (LibreYOLO 1.6.0 / Megvii YOLOX >= 0.3, ``yolo_head.py``): anchors are the grid
  cells of strides 8/16/32 (centre ``(i + 0.5) * stride``). The geometric prior is
  ``centre_prior(..., radius=1.5)`` (cell centre within 1.5 strides of the box centre, a square);
  ``eligible`` is every real ground truth against the *union* of the prior over the image's
  ground truths (YOLOX's "anchor_filter"); ``cost = bce_class_cost(sqrt(sigmoid(cls) *
  sigmoid(obj)), labels) + 3 * iou_cost(ious) + 1e6 * ~prior``. (The original YOLOX 0.1 used
  "inside the box or within 2.5 strides" with a 1e5 penalty on "not inside both"; build that
  from ``inside_boxes`` and ``centre_prior(radius=2.5)`` the same way.)
- **YOLOv7** (``ComputeLossOTA`` of the official code): anchors are the three anchor boxes of
  every cell of every level. Candidates come from YOLOv5's anchor matching (width/height ratio
  to the anchor below 4, the box centre's cell plus its two nearest neighbour cells); ``eligible``
  is every real ground truth against the union of the candidates of the image (no geometric
  penalty), ``cost = bce_class_cost(sqrt(sigmoid(cls) * sigmoid(obj)), labels) + 3 *
  iou_cost(ious)``. (The official code lists the candidates with repetition, one column per
  (ground truth, anchor, cell) triple; here they are a set.)
- **PP-PicoDet** (PaddleDetection ``SimOTAAssigner``, ``center_radius=2.5, candidate_topk=10,
  iou_weight=3, cls_weight=1``): ``eligible`` is every real ground truth against the union over
  ground truths of (anchor centre inside the box *or* within 2.5 strides of its centre);
  ``cost = cls_cost + 3 * iou_cost + 1e8 * ~(inside_boxes & centre_prior(radius=2.5))``, where
  the classification cost is the VFL-style one (varifocal loss of the scores against the one-hot
  label scaled by the IoU, ``zoo_core.losses.iou_aware_classification.varifocal_loss``).

Everything here runs under ``torch.no_grad()``: assignment is not differentiated.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = [
    "SimOTAAssignment",
    "simota_assign",
    "bce_class_cost",
    "iou_cost",
    "centre_prior",
    "inside_boxes",
]

_LOG_FLOOR = -100.0  # torch's binary_cross_entropy clamps its logs here


class SimOTAAssignment(NamedTuple):
    """What each anchor learns (B images, A anchors).

    ``foreground`` (B×A bool) marks positives; ``gt_index`` (B×A int64) is the matched slot in
    the padded ground truths (0 for background, read it through ``foreground``);
    ``matched_iou`` (B×A) is the IoU of the anchor's prediction with its ground truth (0 for
    background); ``num_foreground`` is the number of positives of the batch (0-d int64 tensor,
    on the device: no synchronisation).
    """

    foreground: torch.Tensor
    gt_index: torch.Tensor
    matched_iou: torch.Tensor
    num_foreground: torch.Tensor


@torch.no_grad()
def simota_assign(
    cost: torch.Tensor,
    ious: torch.Tensor,
    eligible: torch.Tensor,
    gt_mask: torch.Tensor,
    *,
    candidate_top_k: int = 10,
) -> SimOTAAssignment:
    """Dynamic-k matching of a padded batch of ground truths to anchors.

    Args:
        cost: B×G×A matching cost (lower is better); penalties for pairs outside a prior are
            the caller's (they must stay finite where ``eligible``).
        ious: B×G×A IoU of each anchor's predicted box with each ground truth (in [0, 1]).
        eligible: boolean, broadcastable to B×G×A (B×1×A for a per-image candidate set): pairs
            that may be matched; other pairs neither count towards dynamic k nor get matched.
        gt_mask: B×G bool, True for real (non-padding) ground truths.
        candidate_top_k: how many of a ground truth's best IoUs are summed into its k (10 in
            YOLOX, YOLOv7 and PicoDet). Also the largest possible k.

    Returns:
        ``SimOTAAssignment``; see its docstring.
    """
    if cost.dim() != 3 or ious.shape != cost.shape:
        raise ValueError(f"cost and ious must both be B×G×A, got {tuple(cost.shape)} and {tuple(ious.shape)}")
    if candidate_top_k < 1:
        raise ValueError(f"candidate_top_k must be at least 1, got {candidate_top_k}")
    batch_size, num_gt, num_anchors = cost.shape
    if gt_mask.shape != (batch_size, num_gt):
        raise ValueError(f"gt_mask must be B×G = {(batch_size, num_gt)}, got {tuple(gt_mask.shape)}")
    device = cost.device
    if num_gt == 0 or num_anchors == 0:
        return SimOTAAssignment(
            foreground=torch.zeros(batch_size, num_anchors, dtype=torch.bool, device=device),
            gt_index=torch.zeros(batch_size, num_anchors, dtype=torch.int64, device=device),
            matched_iou=torch.zeros(batch_size, num_anchors, dtype=ious.dtype, device=device),
            num_foreground=torch.zeros((), dtype=torch.int64, device=device),
        )
    pairs = (eligible.to(torch.bool) & gt_mask.to(torch.bool)[:, :, None]).expand(batch_size, num_gt, num_anchors)

    # 1. Dynamic k: floor of the sum of the best IoUs over eligible anchors, at least 1.
    top = min(candidate_top_k, num_anchors)
    best_ious = ious.masked_fill(~pairs, 0.0).topk(top, dim=-1).values
    dynamic_k = best_ious.sum(dim=-1).int().clamp(min=1)  # B×G; never above `top`

    # 2. Each ground truth takes its k cheapest eligible anchors. The k's differ per ground
    # truth, so take the `top` cheapest of every row and keep the first k of each.
    masked_cost = cost.masked_fill(~pairs, float("inf"))
    cheapest = masked_cost.topk(top, dim=-1, largest=False).indices  # B×G×top
    rank = torch.arange(top, device=device)
    take = (rank < dynamic_k[..., None]) & pairs.gather(-1, cheapest)
    matching = torch.zeros_like(pairs).scatter_(-1, cheapest, take)

    # 3. An anchor claimed by several ground truths goes to the cheapest real ground truth.
    claims = matching.sum(dim=1)  # B×A
    contested = claims > 1
    cheapest_gt = masked_cost.argmin(dim=1)  # B×A
    # a comparison, not one_hot (which synchronises on CUDA)
    resolved = cheapest_gt[:, None, :] == torch.arange(num_gt, device=device)[None, :, None]
    matching = torch.where(contested[:, None, :], resolved, matching)

    foreground = claims > 0
    gt_index = matching.to(torch.uint8).argmax(dim=1)
    matched_iou = (ious * matching).sum(dim=1)
    return SimOTAAssignment(
        foreground=foreground, gt_index=gt_index, matched_iou=matched_iou, num_foreground=foreground.sum()
    )


@torch.no_grad()
def bce_class_cost(probabilities: torch.Tensor, gt_labels: torch.Tensor) -> torch.Tensor:
    """Summed binary cross-entropy of every anchor's class probabilities against every ground
    truth's one-hot label: B×A×C probabilities and B×G labels → B×G×A.

    Equal to ``F.binary_cross_entropy(p, one_hot(label)).sum(-1)`` per pair (logs clamped at
    -100 the same way) but computed without the B×G×A×C tensor: the cost of a pair is the
    all-negative cost of the anchor, corrected at the ground truth's class.
    """
    if probabilities.dim() != 3 or gt_labels.dim() != 2 or gt_labels.shape[0] != probabilities.shape[0]:
        raise ValueError(
            f"expected B×A×C probabilities and B×G labels, got {tuple(probabilities.shape)} and {tuple(gt_labels.shape)}"
        )
    probabilities = probabilities.float()
    log_positive = probabilities.log().clamp(min=_LOG_FLOOR)
    log_negative = torch.log1p(-probabilities).clamp(min=_LOG_FLOOR)
    all_negative = -log_negative.sum(dim=-1)  # B×A
    num_anchors, num_classes = probabilities.shape[1:]
    labels = gt_labels.long().clamp(0, num_classes - 1)[:, :, None].expand(-1, -1, num_anchors)
    at_label_positive = log_positive.transpose(1, 2).gather(1, labels)  # B×G×A
    at_label_negative = log_negative.transpose(1, 2).gather(1, labels)
    return all_negative[:, None, :] + at_label_negative - at_label_positive


def iou_cost(ious: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """SimOTA's regression cost ``-log(IoU + eps)``."""
    return -torch.log(ious + eps)


def centre_prior(
    anchor_centres: torch.Tensor, anchor_strides: torch.Tensor, gt_boxes: torch.Tensor, radius: float
) -> torch.Tensor:
    """B×G×A: anchor centre strictly within ``radius`` strides of the box centre (a square window).

    ``anchor_centres`` A×2 (x, y), ``anchor_strides`` A or A×1, ``gt_boxes`` B×G×4 xyxy, all in
    the same units.
    """
    half = (anchor_strides.reshape(-1) * radius)[:, None]  # A×1
    gt_centres = (gt_boxes[..., :2] + gt_boxes[..., 2:])[:, :, None] / 2  # B×G×1×2
    # Window sides measured the way YOLOX does (centre ± half, then distances), so that anchors
    # lying exactly on a side are decided alike.
    left_top = anchor_centres - (gt_centres - half)
    right_bottom = (gt_centres + half) - anchor_centres
    return torch.cat((left_top, right_bottom), dim=-1).amin(dim=-1) > 0


def inside_boxes(anchor_centres: torch.Tensor, gt_boxes: torch.Tensor) -> torch.Tensor:
    """B×G×A: anchor centre strictly inside the xyxy box."""
    left_top = anchor_centres[None, None] - gt_boxes[:, :, None, :2]
    right_bottom = gt_boxes[:, :, None, 2:] - anchor_centres[None, None]
    return torch.cat((left_top, right_bottom), dim=-1).amin(dim=-1) > 0
