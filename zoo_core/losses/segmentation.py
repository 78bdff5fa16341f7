"""Semantic-segmentation losses: pixel cross-entropy that honours ``ignore_index``, and its
weighted sum over a main head and auxiliary (deep-supervision) heads.

Both are means over the labelled pixels of the local batch: never scaled by the batch size or
the world size (zoo_core/tasks/base.py). Logits coarser than the masks are first resized
bilinearly to the mask size, as segmentation toolkits do for auxiliary heads, so the loss is
always measured at label resolution.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

from zoo_core.ops.resize import resize_logits

__all__ = ["pixel_cross_entropy", "weighted_pixel_cross_entropy"]


def pixel_cross_entropy(logits: torch.Tensor, masks: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Mean cross-entropy over the pixels of ``masks`` (N×H×W class indices) not equal to ``ignore_index``.

    ``logits`` are N×C×h×w, resized to H×W when they differ. Ignored pixels contribute neither
    to the sum nor to the count, so they get no gradient; a batch with no labelled pixel gives
    a loss of exactly 0 that still back-propagates (zero gradients), instead of 0/0 = NaN.
    """
    if logits.dim() != 4 or masks.dim() != 3:
        raise ValueError(
            f"expected logits N×C×H×W and masks N×H×W, got logits {tuple(logits.shape)} and masks {tuple(masks.shape)}"
        )
    if logits.shape[0] != masks.shape[0]:
        raise ValueError(f"logits have {logits.shape[0]} images but masks have {masks.shape[0]}")
    masks = masks.long()
    logits = resize_logits(logits, masks.shape[-2:])
    summed = F.cross_entropy(logits, masks, ignore_index=ignore_index, reduction="sum")
    # Dividing by a clamped count (rather than testing for emptiness) avoids a host sync on GPU.
    labelled = (masks != ignore_index).sum().clamp_min(1)
    return summed / labelled


def weighted_pixel_cross_entropy(
    outputs: Mapping[str, torch.Tensor],
    masks: torch.Tensor,
    ignore_index: int,
    weights: Mapping[str, float],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``sum(weights[name] * pixel_cross_entropy(outputs[name]))`` over the heads in ``outputs``.

    ``outputs`` maps head names (e.g. ``"main"``, ``"aux"``) to logits; every name needs a weight
    (a head absent from ``outputs``, such as an auxiliary head in eval mode, is simply not
    counted). Returns the total and, for logging, each head's unweighted loss detached under
    ``"<name>_ce"``.
    """
    if not outputs:
        raise ValueError("outputs is empty: pass at least the main head's logits")
    unweighted = set(outputs) - set(weights)
    if unweighted:
        raise ValueError(
            f"no loss weight for head(s) {', '.join(sorted(unweighted))}; weights are given for {', '.join(sorted(weights)) or 'none'}"
        )
    weighted_terms: list[torch.Tensor] = []
    items: dict[str, torch.Tensor] = {}
    for name, logits in outputs.items():
        head_loss = pixel_cross_entropy(logits, masks, ignore_index)
        items[f"{name}_ce"] = head_loss.detach()
        weighted_terms.append(weights[name] * head_loss)
    return torch.stack(weighted_terms).sum(), items
