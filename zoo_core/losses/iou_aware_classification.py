"""Classification losses whose target is a localisation quality (an IoU), not a hard 0/1 label.

Dense detectors and DETRs score each prediction by how well its box fits, so the class target
of a positive is a soft score in [0, 1] (usually the IoU of the predicted box with its ground
truth) and negatives target 0. Two published ways to weight the binary cross-entropy:

- **Varifocal loss** (Zhang et al., VarifocalNet, CVPR 2021): positives are weighted by their
  target score, negatives by ``alpha * p**gamma`` (down-weighting easy negatives only). Used by
  PP-YOLOE/YOLO-NAS, PP-PicoDet and the RT-DETR family.
- **Quality focal loss** (Li et al., Generalized Focal Loss, NeurIPS 2020): every element is
  weighted by ``|target - p| ** beta``. Used by RTMDet and GFL heads.

Both return the *element-wise* loss (same shape as the logits); each family reduces it the way
its published recipe does (sum over classes and anchors divided by the number of positives, a
mean over queries, ...).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

__all__ = ["varifocal_loss", "quality_focal_loss"]


def varifocal_loss(
    logits: torch.Tensor,
    target_scores: torch.Tensor,
    positive: torch.Tensor | None = None,
    *,
    alpha: float = 0.75,
    gamma: float = 2.0,
    detach_weight: bool = True,
) -> torch.Tensor:
    """Element-wise varifocal loss of class ``logits`` against soft ``target_scores``.

    Args:
        logits: raw class scores, any shape.
        target_scores: the same shape; the quality target (IoU) at positive elements, 0 elsewhere.
        positive: boolean mask of positive elements (the one-hot of the assigned class); by default
            the elements whose target is above zero.
        alpha, gamma: the negatives' weight ``alpha * sigmoid(logits) ** gamma`` (paper: 0.75, 2).
        detach_weight: treat the weight as a constant for the gradient (the default; RT-DETR's
            code, whose BCE ``weight=`` argument is not differentiated). ``False`` lets the
            negatives' weight ``alpha * p ** gamma`` carry its gradient, as the official code of
            VarifocalNet (mmdet), PP-YOLOE, YOLO-NAS (super-gradients) and PP-PicoDet computes it.
    """
    if logits.shape != target_scores.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and target_scores {tuple(target_scores.shape)} must have one shape")
    target_scores = target_scores.to(logits.dtype)
    if positive is None:
        positive = target_scores > 0
    with torch.set_grad_enabled(torch.is_grad_enabled() and not detach_weight):
        probability = logits.sigmoid()
        weight = torch.where(positive, target_scores, alpha * probability.pow(gamma))
    return F.binary_cross_entropy_with_logits(logits, target_scores, reduction="none") * weight


def quality_focal_loss(logits: torch.Tensor, target_scores: torch.Tensor, *, beta: float = 2.0) -> torch.Tensor:
    """Element-wise quality focal loss: ``BCE(sigmoid(logits), target) * |target - sigmoid(logits)| ** beta``.

    ``target_scores`` holds the quality (IoU) at the assigned class of positives and 0 elsewhere.
    Unlike the varifocal weight, the modulating factor keeps its gradient (as published).
    """
    if logits.shape != target_scores.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and target_scores {tuple(target_scores.shape)} must have one shape")
    target_scores = target_scores.to(logits.dtype)
    modulation = (target_scores - logits.sigmoid()).abs().pow(beta)
    return F.binary_cross_entropy_with_logits(logits, target_scores, reduction="none") * modulation
