"""One-to-one assignment of predictions to ground truth (DETR's Hungarian matching).

The cost of predicting target ``t`` with query ``q`` is
``cost_bbox·L1(box_q, box_t) + cost_class·focal(p_q[c_t]) − cost_giou·GIoU(box_q, box_t)`` where
the focal class cost is ``α(1−p)^γ(−log p) − (1−α)p^γ(−log(1−p))`` (Deformable DETR). Every
output level of a batch is costed on the device, the costs cross to the host in one transfer,
and ``scipy.optimize.linear_sum_assignment`` solves each (level, image) problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from scipy.optimize import linear_sum_assignment

from zoo_core.detr.geometry import cxcywh_to_xyxy, pairwise_giou
from zoo_core.detr.targets import DETRTargets

__all__ = ["Match", "HungarianMatcher"]


@dataclass
class Match:
    """Matched pairs: image ``batch[k]``, query ``query[k]`` and packed target index ``target[k]``."""

    batch: torch.Tensor
    query: torch.Tensor
    target: torch.Tensor

    def __len__(self) -> int:
        return int(self.batch.shape[0])

    @classmethod
    def empty(cls, device: torch.device) -> "Match":
        none = torch.zeros(0, dtype=torch.int64, device=device)
        return cls(none, none, none)


class HungarianMatcher:
    """Focal class + L1 + GIoU matching costs (defaults: 2, 5, 2 with focal α 0.25, γ 2, as published)."""

    def __init__(self, cost_class: float = 2.0, cost_bbox: float = 5.0, cost_giou: float = 2.0, alpha: float = 0.25, gamma: float = 2.0) -> None:
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("at least one matching cost must be non-zero")
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.alpha, self.gamma = alpha, gamma

    @torch.no_grad()
    def cost_matrix(self, logits: torch.Tensor, boxes: torch.Tensor, targets: DETRTargets) -> torch.Tensor:
        """``(B, Q, T)`` costs of every query against every target of the batch (cxcywh boxes)."""
        batch, queries = logits.shape[:2]
        probability = logits.flatten(0, 1).float().sigmoid()[:, targets.labels]
        boxes = boxes.flatten(0, 1).float()
        negative = (1 - self.alpha) * probability**self.gamma * -(1 - probability + 1e-8).log()
        positive = self.alpha * (1 - probability) ** self.gamma * -(probability + 1e-8).log()
        cost_class = positive - negative
        cost_bbox = (boxes[:, None, :] - targets.boxes[None, :, :]).abs().sum(-1)
        cost_giou = -pairwise_giou(cxcywh_to_xyxy(boxes), cxcywh_to_xyxy(targets.boxes))
        cost = self.cost_bbox * cost_bbox + self.cost_class * cost_class + self.cost_giou * cost_giou
        return cost.reshape(batch, queries, -1)

    @torch.no_grad()
    def match(self, levels: Sequence[tuple[torch.Tensor, torch.Tensor]], targets: DETRTargets,
              extra_costs: Sequence[torch.Tensor | None] | None = None) -> list[Match]:
        """One ``Match`` per ``(logits, boxes)`` level; images without targets match nothing.

        ``extra_costs`` (one per level, or None) are ``(B, Q, T)`` costs added to a level's (a
        segmenter's mask costs, ``zoo_core.detr.mask_losses``); only each image's own block is read.
        """
        device = levels[0][0].device
        if targets.total == 0:
            return [Match.empty(device) for _ in levels]
        if extra_costs is not None and len(extra_costs) != len(levels):
            raise ValueError(f"extra_costs needs one entry per level ({len(levels)}), got {len(extra_costs)}")
        level_costs = [self.cost_matrix(l, b, targets) for l, b in levels]
        if extra_costs is not None:
            level_costs = [cost if extra is None else cost + extra.float() for cost, extra in zip(level_costs, extra_costs)]
        costs = torch.nan_to_num(torch.stack(level_costs), nan=1.0).cpu().numpy()
        offsets = targets.offsets
        results = []
        for level_costs in costs:
            batch_index, query_index, target_index = [], [], []
            for image, count in enumerate(targets.counts):
                if count == 0:
                    continue
                rows, cols = linear_sum_assignment(level_costs[image, :, offsets[image] : offsets[image] + count])
                batch_index.append(torch.full((len(rows),), image, dtype=torch.int64))
                query_index.append(torch.as_tensor(rows, dtype=torch.int64))
                target_index.append(torch.as_tensor(cols, dtype=torch.int64) + offsets[image])
            results.append(Match(torch.cat(batch_index).to(device), torch.cat(query_index).to(device), torch.cat(target_index).to(device)))
        return results
