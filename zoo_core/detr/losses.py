"""Loss terms of the DETR core that zoo_core.losses does not already have.

- ``matchability_aware_loss`` (MAL, DEIM, Huang et al. arXiv:2412.04234): BCE whose positive
  target is ``IoU^γ`` (weight 1) and whose negatives are weighted ``[α]·p^γ``; unlike VFL the
  positive weight does not vanish for low-IoU matches. Varifocal loss is
  ``zoo_core.losses.iou_aware_classification.varifocal_loss``.
- ``fine_grained_localization_loss`` (FGL, D-FINE Eq. 6): cross-entropy of each edge
  distribution against the two bins around the target offset, weighted by their interpolation
  weights and by the prediction's IoU.
- ``distillation_divergence`` (D-FINE's DDF core): ``T²·KL(softmax(teacher/T) ‖ softmax(student/T))``
  per distribution, the teacher detached.

All return element-wise losses; ``SetCriterion`` reduces them as published.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["matchability_aware_loss", "fine_grained_localization_loss", "distillation_divergence"]


def matchability_aware_loss(
    logits: torch.Tensor, iou_targets: torch.Tensor, positive: torch.Tensor, *, gamma: float = 1.5, alpha: float | None = None
) -> torch.Tensor:
    """Element-wise MAL.

    Args:
        logits: class logits ``(..., C)``.
        iou_targets: the match's IoU at positive elements, 0 elsewhere (same shape).
        positive: bool/0-1 one-hot of the matched class (same shape).
        gamma: the exponent of both the target (``IoU^γ``) and the negatives' weight (``p^γ``).
        alpha: optional negatives' factor (None in the published DEIM).
    """
    positive = positive.to(logits.dtype)
    target = iou_targets.to(logits.dtype).pow(gamma)
    with torch.no_grad():
        negative_weight = logits.sigmoid().pow(gamma)
        if alpha is not None:
            negative_weight = alpha * negative_weight
        weight = negative_weight * (1 - positive) + positive
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none") * weight


def fine_grained_localization_loss(
    corner_logits: torch.Tensor, bin_index: torch.Tensor, weight_right: torch.Tensor, weight_left: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-distribution FGL: ``CE(left bin)·w_left + CE(left+1)·w_right`` (times ``weight``).

    ``corner_logits`` is ``(n, reg_max + 1)``; the others are ``(n,)``.
    """
    left = bin_index.long()
    loss = F.cross_entropy(corner_logits, left, reduction="none") * weight_left + F.cross_entropy(
        corner_logits, left + 1, reduction="none"
    ) * weight_right
    return loss if weight is None else loss * weight


def distillation_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 5.0) -> torch.Tensor:
    """``(n, bins)`` → ``(n,)``: ``T² · KL(teacher ‖ student)`` at temperature ``T`` (teacher detached)."""
    log_student = F.log_softmax(student_logits / temperature, dim=1)
    teacher = F.softmax(teacher_logits.detach() / temperature, dim=1)
    return F.kl_div(log_student, teacher, reduction="none").sum(-1) * temperature**2
