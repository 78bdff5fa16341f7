"""PP-LiteSeg training losses, over the main head and the three auxiliary heads.

Two recipes, chosen by ``PPLiteSegConfig.loss``:

``dice_ce_edge`` (default; the LibreYOLO 1.6.0 / SuperGradients Cityscapes recipe its checkpoints
were trained with). For each head: ``ce_weight · CE_edge + dice_weight · Dice`` where

- ``CE_edge = w_all · mean over all pixels of the per-pixel cross-entropy (ignored pixels count
  as 0) + w_edge · mean of it over label-edge pixels``, with ``(w_all, w_edge) = (0.5, 0.5)``;
  a pixel is an edge pixel when the ``edge_kernel``×``edge_kernel`` window around it (border
  replicated) holds more than one label value;
- ``Dice = 1 − mean over classes of (2·Σ p·y + 1) / (Σ p + Σ y + 1 + 1e-5)`` with softmax
  probabilities ``p`` and one-hot labels ``y``, sums over the batch's labelled pixels.

``ohem_ce`` (PaddleSeg's published configs ``pp_liteseg_stdc{1,2}_cityscapes_1024x512_*``):
online hard example mining cross-entropy per head. Pixels whose softmax probability of the true
class is below ``max(ohem_thresh, p_k)`` are kept, where ``p_k`` is the k-th smallest such
probability in the batch and ``k = ohem_min_kept_ratio · pixels in the batch`` (PaddleSeg keeps
``min_kept = batch · 1024 · 512 / 16``); when the batch has no more than ``k`` labelled pixels,
or ``k`` is 0, all of them are kept. The loss is the mean cross-entropy over kept pixels.

The total is the main head's loss plus ``aux_weights[i]`` times each auxiliary head's (1, 1, 1
published). Every head's logits are bilinearly resized to the masks first.

Normalisation: cross-entropy terms are means over the local batch's pixels (a per-sample mean).
Dice and OHEM's threshold are, as published, statistics of the whole local batch, so they are not
exactly a mean of per-sample losses. Nothing here synchronises the host with the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import torch
import torch.nn.functional as F

from zoo_core.ops.resize import resize_logits

if TYPE_CHECKING:
    from zoo_ppliteseg.model import PPLiteSegConfig

__all__ = ["label_edges", "dice_loss", "edge_weighted_cross_entropy", "ohem_cross_entropy", "ppliteseg_loss"]

_DICE_SMOOTH = 1.0
_DICE_EPS = 1e-5


def label_edges(masks: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """N×H×W bool: pixels whose ``kernel_size`` window (edge-replicated) contains two or more label values.

    Ignored pixels count as a value of their own, so the border of an ignored region is an edge
    and its inside is not (the one-hot dilation-minus-erosion definition gives the same map).
    """
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"edge kernel_size must be a positive odd int, got {kernel_size}")
    pad = kernel_size // 2
    values = F.pad(masks.unsqueeze(1).float(), (pad, pad, pad, pad), mode="replicate")
    highest = F.max_pool2d(values, kernel_size, stride=1)
    lowest = -F.max_pool2d(-values, kernel_size, stride=1)
    return (highest != lowest).squeeze(1)


def dice_loss(logits: torch.Tensor, masks: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Soft multi-class Dice (see the module docstring) of N×C×H×W ``logits`` over labelled pixels of ``masks``."""
    probabilities = logits.softmax(dim=1)
    classes = torch.arange(logits.shape[1], device=logits.device).view(1, -1, 1, 1)
    labelled = (masks != ignore_index).unsqueeze(1)
    one_hot = masks.unsqueeze(1) == classes  # an ignored pixel matches no class
    dims = (0, 2, 3)
    overlap = (probabilities * one_hot).sum(dims)
    total = (probabilities * labelled).sum(dims) + one_hot.sum(dims)
    return 1.0 - ((2.0 * overlap + _DICE_SMOOTH) / (total + _DICE_SMOOTH + _DICE_EPS)).mean()


def edge_weighted_cross_entropy(
    logits: torch.Tensor, masks: torch.Tensor, edges: torch.Tensor, ignore_index: int, weights: tuple[float, float]
) -> torch.Tensor:
    """``weights[0]`` · mean CE over all pixels + ``weights[1]`` · mean CE over ``edges`` (0 when there are none)."""
    per_pixel = F.cross_entropy(logits, masks, ignore_index=ignore_index, reduction="none")
    on_edges = (per_pixel * edges).sum() / edges.sum().clamp_min(1)
    return weights[0] * per_pixel.mean() + weights[1] * on_edges


def ohem_cross_entropy(
    logits: torch.Tensor, masks: torch.Tensor, ignore_index: int, thresh: float, min_kept: int
) -> torch.Tensor:
    """Mean cross-entropy over the hard pixels (see the module docstring); 0 for a batch without labels."""
    per_pixel = F.cross_entropy(logits, masks, ignore_index=ignore_index, reduction="none")
    labelled = masks != ignore_index
    with torch.no_grad():
        # exp(-CE) is the softmax probability of the true class; ignored pixels sort last.
        true_probability = torch.where(labelled, torch.exp(-per_pixel), torch.full_like(per_pixel, 2.0))
        if min_kept < 1:  # PaddleSeg mines only with a positive min_kept
            kept = labelled
        else:
            kth = true_probability.flatten().kthvalue(min(min_kept, true_probability.numel())).values
            hard = labelled & (true_probability < kth.clamp_min(thresh))
            kept = torch.where(labelled.sum() > min_kept, hard, labelled)
    return (per_pixel * kept).sum() / kept.sum().clamp_min(1)


def ppliteseg_loss(
    outputs: Mapping[str, torch.Tensor], masks: torch.Tensor, ignore_index: int, config: "PPLiteSegConfig"
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The configured loss over the heads in ``outputs`` (``main`` and any of ``aux8``/``aux16``/``aux32``).

    Returns the weighted total and, detached for logging, each head's unweighted loss under
    ``"<head>_loss"``.
    """
    from zoo_ppliteseg.model import AUX_HEAD_NAMES

    if masks.dim() != 3:
        raise ValueError(f"masks must be N×H×W class indices, got shape {tuple(masks.shape)}")
    weights = {"main": 1.0, **dict(zip(AUX_HEAD_NAMES, config.aux_weights))}
    unknown = set(outputs) - set(weights)
    if unknown or "main" not in outputs:
        raise ValueError(
            f"PP-LiteSeg outputs must be 'main' and optionally {', '.join(AUX_HEAD_NAMES)}; got {', '.join(outputs)}"
        )
    masks = masks.long()
    size = masks.shape[-2:]
    edges = label_edges(masks, config.edge_kernel) if config.loss == "dice_ce_edge" else None
    min_kept = int(config.ohem_min_kept_ratio * masks.numel())
    total = None
    items: dict[str, torch.Tensor] = {}
    for name, logits in outputs.items():
        logits = resize_logits(logits, size)
        if edges is not None:
            cross_entropy = edge_weighted_cross_entropy(logits, masks, edges, ignore_index, config.edge_ce_weights)
            head_loss = config.ce_weight * cross_entropy + config.dice_weight * dice_loss(logits, masks, ignore_index)
        else:
            head_loss = ohem_cross_entropy(logits, masks, ignore_index, config.ohem_thresh, min_kept)
        items[f"{name}_loss"] = head_loss.detach()
        weighted = weights[name] * head_loss
        total = weighted if total is None else total + weighted
    return total, items
