"""RF-DETR's training criterion: IA-BCE class loss + L1 + GIoU, Hungarian matching per Group DETR group.

For every output level (final layer, auxiliary layers, two-stage proposals) and every query group
separately, queries are matched one-to-one to the image's targets (``GroupHungarianMatcher``:
focal class cost 2 with α 0.25, γ 2, L1 5, GIoU 2 — RF-DETR's matcher, the class cost computed
with log-sigmoids). Terms, each summed over the level and divided by ``targets × groups``
(averaged over ranks, at least 1, as published):

- **IA-BCE** (RF-DETR's ``ia_bce_loss``): BCE over all classes with per-element weights: negatives
  ``p²`` (not detached), the matched class of a matched query a soft target
  ``t = max(p^α · IoU^(1−α), 0.01)`` (α 0.25, detached) with weight 1 split as ``t`` positive,
  ``1 − t`` negative: ``(1−t+p²…)`` reformulated as ``w_neg · x − logσ(x) · (w_pos + w_neg)``;
- **L1** on normalised cxcywh and **1 − GIoU** of the matched boxes.

Weights 1, 5, 2 on every level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from zoo_core.detr.criterion import average_box_count
from zoo_core.detr.geometry import cxcywh_to_xyxy, paired_giou, paired_iou, pairwise_giou
from zoo_core.detr.matcher import Match
from zoo_core.detr.targets import DETRTargets

__all__ = ["GroupHungarianMatcher", "RFDETRCriterion", "RFDETRCriterionConfig"]


@dataclass(frozen=True)
class RFDETRCriterionConfig:
    """RF-DETR's published weights and costs (``rfdetr/config.py`` / LibreYOLO 1.6's ``_make_args``)."""

    weight_class: float = 1.0
    weight_l1: float = 5.0
    weight_giou: float = 2.0
    focal_alpha: float = 0.25
    cost_class: float = 2.0
    cost_bbox: float = 5.0
    cost_giou: float = 2.0


class GroupHungarianMatcher:
    """One-to-one matching of each query group to all targets of its image (Group DETR)."""

    def __init__(self, cost_class: float = 2.0, cost_bbox: float = 5.0, cost_giou: float = 2.0, alpha: float = 0.25, gamma: float = 2.0) -> None:
        self.cost_class, self.cost_bbox, self.cost_giou, self.alpha, self.gamma = cost_class, cost_bbox, cost_giou, alpha, gamma

    @torch.no_grad()
    def cost_matrix(self, logits: torch.Tensor, boxes: torch.Tensor, targets: DETRTargets) -> torch.Tensor:
        """``(B, N, T)`` costs of every query against every target of the batch."""
        batch, queries = logits.shape[:2]
        flat = logits.flatten(0, 1).float()
        probability = flat.sigmoid()
        negative = (1 - self.alpha) * probability**self.gamma * -F.logsigmoid(-flat)
        positive = self.alpha * (1 - probability) ** self.gamma * -F.logsigmoid(flat)
        cost_class = (positive - negative)[:, targets.labels]
        flat_boxes = boxes.flatten(0, 1).float()
        cost_bbox = (flat_boxes[:, None, :] - targets.boxes[None, :, :]).abs().sum(-1)
        cost_giou = -pairwise_giou(cxcywh_to_xyxy(flat_boxes), cxcywh_to_xyxy(targets.boxes))
        cost = self.cost_bbox * cost_bbox + self.cost_class * cost_class + self.cost_giou * cost_giou
        return cost.reshape(batch, queries, -1)

    @torch.no_grad()
    def match(self, levels: Sequence[tuple[torch.Tensor, torch.Tensor]], targets: DETRTargets, groups: int) -> list[Match]:
        """One ``Match`` per ``(logits, boxes)`` level; query indices run over all groups."""
        device = levels[0][0].device
        if targets.total == 0:
            return [Match.empty(device) for _ in levels]
        costs = [self.cost_matrix(logits, boxes, targets) for logits, boxes in levels]
        sizes = [cost.shape[1] for cost in costs]
        host = torch.cat(costs, dim=1).cpu().numpy()  # one transfer for every level
        finite = np.isfinite(host)
        if not finite.all():  # RF-DETR: non-finite costs become a sentinel above every finite one
            sentinel = (np.abs(host[finite]).max() if finite.any() else 0.0) * 2 + 1
            host = np.where(finite, host, sentinel)
        offsets, results, start = targets.offsets, [], 0
        for size in sizes:
            level = host[:, start : start + size]
            start += size
            per_group = size // groups
            batch_index, query_index, target_index = [], [], []
            for image, count in enumerate(targets.counts):
                if count == 0:
                    continue
                block = level[image, :, offsets[image] : offsets[image] + count]
                for g in range(groups):
                    rows, cols = linear_sum_assignment(block[g * per_group : (g + 1) * per_group])
                    batch_index.append(np.full(len(rows), image))
                    query_index.append(rows + g * per_group)
                    target_index.append(cols + offsets[image])
            results.append(Match(*(torch.as_tensor(np.concatenate(part), dtype=torch.int64, device=device) for part in (batch_index, query_index, target_index))))
        return results


class RFDETRCriterion:
    """See the module docstring. ``distributed=False`` keeps the box count rank-local."""

    def __init__(self, num_classes: int, config: RFDETRCriterionConfig | None = None, *, distributed: bool = True) -> None:
        self.num_classes = num_classes
        self.config = config or RFDETRCriterionConfig()
        self.distributed = distributed
        c = self.config
        self.matcher = GroupHungarianMatcher(c.cost_class, c.cost_bbox, c.cost_giou, c.focal_alpha)

    def classification(self, output: Mapping[str, torch.Tensor], match: Match, targets: DETRTargets, normaliser: torch.Tensor) -> torch.Tensor:
        logits = output["logits"]
        probability = logits.sigmoid()
        positive_weight = torch.zeros_like(logits)
        negative_weight = probability**2
        if len(match):
            labels = targets.labels[match.target]
            with torch.no_grad():
                iou = paired_iou(cxcywh_to_xyxy(output["boxes"][match.batch, match.query]), cxcywh_to_xyxy(targets.boxes[match.target]))
                alpha = self.config.focal_alpha
                soft = (probability[match.batch, match.query, labels].pow(alpha) * iou.pow(1 - alpha)).clamp(min=0.01)
            positive_weight = positive_weight.index_put((match.batch, match.query, labels), soft.to(logits.dtype))
            negative_weight = negative_weight.index_put((match.batch, match.query, labels), (1 - soft).to(logits.dtype))
        loss = negative_weight * logits - F.logsigmoid(logits) * (positive_weight + negative_weight)
        return loss.sum() / normaliser

    def boxes(self, output: Mapping[str, torch.Tensor], match: Match, targets: DETRTargets, normaliser: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if len(match) == 0:
            zero = output["boxes"].sum() * 0
            return zero, zero
        predicted = output["boxes"][match.batch, match.query]
        target = targets.boxes[match.target]
        l1 = (predicted - target).abs().sum() / normaliser
        giou = (1 - paired_giou(cxcywh_to_xyxy(predicted), cxcywh_to_xyxy(target))).sum() / normaliser
        return l1, giou

    def __call__(self, outputs: Mapping[str, Any], targets: DETRTargets) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        layers = [{k: v.float() for k, v in item.items()} for item in outputs["layers"]]
        encoder = [{k: v.float() for k, v in item.items()} for item in outputs.get("encoder", [])]
        device = layers[-1]["logits"].device
        targets = targets.to(device)
        groups = int(outputs.get("groups", 1))
        levels = [layers[-1], *layers[:-1], *encoder]
        matches = self.matcher.match([(item["logits"], item["boxes"]) for item in levels], targets, groups)
        normaliser = average_box_count(targets.total * groups, device, self.distributed)
        sums = {"cls": 0.0, "l1": 0.0, "giou": 0.0}
        for item, match in zip(levels, matches):
            sums["cls"] = sums["cls"] + c.weight_class * self.classification(item, match, targets, normaliser)
            l1, giou = self.boxes(item, match, targets, normaliser)
            sums["l1"] = sums["l1"] + c.weight_l1 * l1
            sums["giou"] = sums["giou"] + c.weight_giou * giou
        sums = {k: torch.nan_to_num(torch.as_tensor(v, device=device), nan=0.0) for k, v in sums.items()}
        total = sum(sums.values())
        return total, {k: v.detach() for k, v in sums.items()}
