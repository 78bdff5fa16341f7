"""Contrastive denoising queries (DN-DETR, Li et al. 2022; contrastive form of DINO, Zhang et al. 2023).

During training the decoder also receives noised copies of the ground truth. The queries come in
``G`` groups; each group holds every image's boxes twice (padded to the batch's largest count):
a *positive* copy with box noise below half the box size (to be reconstructed) and a *negative*
copy with noise between one half and one box size (to be rejected: classified as background).
Labels are flipped to a random class with probability ``label_noise_ratio / 2``.

The self-attention mask (True = blocked) keeps the matching queries from seeing any denoising
query and each denoising group from seeing the others. ``G = num_denoising // max_boxes``
(at least 1), so the number of denoising queries adapts to the batch.

Random numbers are drawn in the published order (label flips, new labels, box signs, box
magnitudes) from torch's global generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zoo_core.detr.geometry import cxcywh_to_xyxy, inverse_sigmoid, xyxy_to_cxcywh
from zoo_core.detr.targets import DETRTargets

__all__ = ["DenoisingQueries", "make_denoising_queries"]


@dataclass
class DenoisingQueries:
    """Noised ground truth for one batch.

    Attributes:
        labels: ``(B, N)`` noised classes (``num_classes`` at padded slots: the embedding's padding row).
        box_logits: ``(B, N, 4)`` inverse-sigmoid of the noised cxcywh boxes.
        attention_mask: ``(N + Q, N + Q)`` bool, True where attention is blocked.
        num_groups: ``G``.
        group_size: ``2 · max_boxes`` (positive then negative copies).
        positive_batch, positive_query, positive_target: the positive queries' image, query index
            (within the N denoising queries) and packed target index, ``G · T`` of each.
    """

    labels: torch.Tensor
    box_logits: torch.Tensor
    attention_mask: torch.Tensor
    num_groups: int
    group_size: int
    positive_batch: torch.Tensor
    positive_query: torch.Tensor
    positive_target: torch.Tensor

    @property
    def num_queries(self) -> int:
        return self.labels.shape[1]


def make_denoising_queries(
    targets: DETRTargets,
    num_classes: int,
    num_queries: int,
    num_denoising: int = 100,
    label_noise_ratio: float = 0.5,
    box_noise_scale: float = 1.0,
    absolute_sizes: bool = False,
) -> DenoisingQueries | None:
    """Build the denoising queries, or None when there is no ground truth (or ``num_denoising`` is 0).

    Args:
        targets: the batch's ground truth.
        num_classes: classes of the detector (also the padding label).
        num_queries: the decoder's matching queries (for the mask size).
        num_denoising: the target number of denoising queries.
        label_noise_ratio: twice the probability of flipping a label.
        box_noise_scale: noise amplitude relative to half the box size.
        absolute_sizes: make noised widths/heights non-negative before the logit (D-FINE and
            descendants); RT-DETR leaves inverted boxes to the logit's clipping.
    """
    max_boxes = max(targets.counts, default=0)
    if num_denoising <= 0 or max_boxes == 0:
        return None
    device = targets.boxes.device
    batch = targets.batch_size
    groups = max(num_denoising // max_boxes, 1)
    group_size = 2 * max_boxes
    total = group_size * groups

    image = targets.image_index()
    offsets = torch.tensor(targets.offsets[:-1], device=device)
    slot = torch.arange(targets.total, device=device) - offsets[image]
    labels = torch.full((batch, max_boxes), num_classes, dtype=torch.int32, device=device)
    boxes = torch.zeros(batch, max_boxes, 4, device=device)
    real = torch.zeros(batch, max_boxes, dtype=torch.bool, device=device)
    labels[image, slot] = targets.labels.to(torch.int32)
    boxes[image, slot] = targets.boxes.to(boxes.dtype)
    real[image, slot] = True
    labels, boxes, real = labels.repeat(1, 2 * groups), boxes.repeat(1, 2 * groups, 1), real.repeat(1, 2 * groups)
    negative = ((torch.arange(total, device=device) % group_size) >= max_boxes).to(boxes.dtype)[None, :, None]

    if label_noise_ratio > 0:
        flip = torch.rand_like(labels, dtype=torch.float) < label_noise_ratio * 0.5
        random_labels = torch.randint_like(flip, 0, num_classes, dtype=labels.dtype)
        labels = torch.where(flip & real, random_labels, labels)
    if box_noise_scale > 0:
        corners = cxcywh_to_xyxy(boxes)
        half_sizes = (boxes[..., 2:] * 0.5).repeat(1, 1, 2) * box_noise_scale
        sign = torch.randint_like(boxes, 0, 2) * 2.0 - 1.0
        magnitude = torch.rand_like(boxes)
        magnitude = (magnitude + 1.0) * negative + magnitude * (1 - negative)  # negatives: [1, 2)
        corners = (corners + magnitude * sign * half_sizes).clamp(0.0, 1.0)
        boxes = xyxy_to_cxcywh(corners)
        if absolute_sizes:
            boxes = boxes.abs()
    box_logits = inverse_sigmoid(boxes)

    size = total + num_queries
    group_of = torch.arange(total, device=device) // group_size
    mask = torch.zeros(size, size, dtype=torch.bool, device=device)
    mask[total:, :total] = True
    mask[:total, :total] = group_of[:, None] != group_of[None, :]

    group_start = torch.arange(groups, device=device) * group_size
    positive_query = (group_start[None, :] + slot[:, None]).reshape(-1)
    positive_batch = image[:, None].expand(-1, groups).reshape(-1)
    positive_target = torch.arange(targets.total, device=device)[:, None].expand(-1, groups).reshape(-1)
    return DenoisingQueries(
        labels=labels.long(),
        box_logits=box_logits,
        attention_mask=mask,
        num_groups=groups,
        group_size=group_size,
        positive_batch=positive_batch,
        positive_query=positive_query,
        positive_target=positive_target,
    )
