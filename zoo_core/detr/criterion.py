"""The set-prediction loss of the RT-DETR family, configurable for each published variant.

``SetCriterion(config)(outputs, targets)`` matches every output level (Hungarian, one transfer
to the host per step) and sums, with the configured weights:

- **classification**: varifocal (``"vfl"``: RT-DETR, D-FINE) or matchability-aware (``"mal"``:
  DEIM, RT-DETRv4), the positive target being the matched prediction's IoU; summed over queries
  and classes and divided by the number of boxes;
- **boxes**: L1 on normalised cxcywh and 1 − GIoU, divided by the number of boxes;
- **local** (when the outputs carry FDR ``corners``): FGL on every layer and DDF on every layer
  but the last (its teacher), D-FINE §3.3;
- these terms for the **final layer**, every **auxiliary** layer, FDR's **initial** boxes, the
  **encoder** proposals, and the **denoising** queries (matched to their own ground truth,
  normalised by boxes × groups).

``go_union=True`` (D-FINE's GO-LSD) matches box and local terms with the union of every level's
matches (for each query, its most often matched target) instead of each level's own.

The number of boxes is averaged over ranks (``zoo_core.ops.distributed.mean_over_ranks``) when
``torch.distributed`` is initialised (then clamped at 1), as the official code does: each rank divides its sum by the global mean count,
so DDP's gradient average equals one process over the whole batch.

Returns ``(total, items)`` where ``items`` holds the detached weighted sums per kind
(``cls``, ``l1``, ``giou`` and, with FDR, ``fgl``, ``ddf``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from zoo_core.detr.distribution import boxes_to_offsets
from zoo_core.detr.geometry import cxcywh_to_xyxy, paired_giou, paired_iou
from zoo_core.detr.losses import distillation_divergence, fine_grained_localization_loss, matchability_aware_loss
from zoo_core.detr.matcher import HungarianMatcher, Match
from zoo_core.detr.targets import DETRTargets
from zoo_core.losses.iou_aware_classification import varifocal_loss
from zoo_core.ops.distributed import mean_over_ranks

__all__ = ["CriterionConfig", "SetCriterion", "average_box_count", "global_optimal_union"]


@dataclass(frozen=True)
class CriterionConfig:
    """Weights and options of ``SetCriterion`` (defaults: RT-DETR's published values)."""

    classification: str = "vfl"  # "vfl" or "mal"
    alpha: float = 0.75  # VFL negatives' factor
    gamma: float = 2.0  # VFL / MAL exponent (DEIM: 1.5)
    mal_alpha: float | None = None
    weight_class: float = 1.0
    weight_l1: float = 5.0
    weight_giou: float = 2.0
    weight_fgl: float = 0.15
    weight_ddf: float = 1.5
    distillation_temperature: float = 5.0
    go_union: bool = False
    cost_class: float = 2.0
    cost_bbox: float = 5.0
    cost_giou: float = 2.0
    matcher_alpha: float = 0.25
    matcher_gamma: float = 2.0


def average_box_count(count: int | torch.Tensor, device: torch.device, distributed: bool = True) -> torch.Tensor:
    """The loss normaliser: the box count averaged over ranks (``mean_over_ranks``, when distributed), at least 1."""
    value = torch.as_tensor(count, dtype=torch.float32, device=device).reshape(())
    if distributed:
        value = mean_over_ranks(value)
    return value.clamp(min=1.0)


def global_optimal_union(matches: list[Match], num_queries: int, num_targets: int) -> Match:
    """GO-LSD's union of matches: each (image, query) matched anywhere keeps its most frequent target.

    Ties go to the lowest target index. Vectorised; one host sync for the result's size.
    """
    device = matches[0].batch.device
    batch = torch.cat([m.batch for m in matches])
    if batch.numel() == 0:
        return Match.empty(device)
    slot = batch * num_queries + torch.cat([m.query for m in matches])
    key = slot * num_targets + torch.cat([m.target for m in matches])
    unique, counts = torch.unique(key, return_counts=True)  # sorted: by slot, then target
    unique_slot = torch.div(unique, num_targets, rounding_mode="floor")
    order = torch.argsort(-counts, stable=True)
    order = order[torch.argsort(unique_slot[order], stable=True)]
    chosen_slot, chosen = unique_slot[order], unique[order]
    first = torch.ones_like(chosen_slot, dtype=torch.bool)
    first[1:] = chosen_slot[1:] != chosen_slot[:-1]
    chosen, chosen_slot = chosen[first], chosen_slot[first]
    return Match(
        torch.div(chosen_slot, num_queries, rounding_mode="floor"), chosen_slot % num_queries, chosen % num_targets
    )


def _float(item: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if item is None:
        return None
    return {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in item.items()}


class SetCriterion:
    """See the module docstring. ``distributed=False`` keeps the box count rank-local (rank-0 validation)."""

    def __init__(self, num_classes: int, config: CriterionConfig | None = None, *, distributed: bool = True) -> None:
        self.num_classes = num_classes
        self.config = config or CriterionConfig()
        if self.config.classification not in ("vfl", "mal"):
            raise ValueError(f"classification must be 'vfl' or 'mal', got {self.config.classification!r}")
        self.distributed = distributed
        c = self.config
        self.matcher = HungarianMatcher(c.cost_class, c.cost_bbox, c.cost_giou, c.matcher_alpha, c.matcher_gamma)

    # ------------------------------------------------------------------ terms
    def classification(self, output: Mapping[str, torch.Tensor], match: Match, targets: DETRTargets, normaliser: torch.Tensor) -> torch.Tensor:
        logits = output["logits"]
        positive = torch.zeros_like(logits, dtype=torch.bool)
        iou_targets = torch.zeros_like(logits)
        if len(match):
            labels = targets.labels[match.target]
            with torch.no_grad():
                iou = paired_iou(cxcywh_to_xyxy(output["boxes"][match.batch, match.query]), cxcywh_to_xyxy(targets.boxes[match.target]))
            positive[match.batch, match.query, labels] = True
            iou_targets[match.batch, match.query, labels] = iou.to(iou_targets.dtype)
        c = self.config
        if c.classification == "vfl":
            loss = varifocal_loss(logits, iou_targets, positive, alpha=c.alpha, gamma=c.gamma)
        else:
            loss = matchability_aware_loss(logits, iou_targets, positive, gamma=c.gamma, alpha=c.mal_alpha)
        return loss.sum() / normaliser

    def boxes(self, output: Mapping[str, torch.Tensor], match: Match, targets: DETRTargets, normaliser: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        predicted = output["boxes"][match.batch, match.query]
        target = targets.boxes[match.target]
        if len(match) == 0:
            zero = output["boxes"].sum() * 0
            return zero, zero
        l1 = (predicted - target).abs().sum() / normaliser
        giou = (1 - paired_giou(cxcywh_to_xyxy(predicted), cxcywh_to_xyxy(target))).sum() / normaliser
        return l1, giou

    def local(
        self,
        outputs: Mapping[str, Any],
        layers: list[dict[str, torch.Tensor]],
        match: Match,
        targets: DETRTargets,
        normaliser: torch.Tensor,
        positives_scale: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """FGL over ``layers`` and DDF over all but the last; returns the scale used for DDF's halves."""
        zero = layers[-1]["corners"].sum() * 0
        if len(match) == 0:
            return zero, zero, positives_scale
        weights = outputs["edge_weights"].float()
        bins = weights.shape[0]
        target_xyxy = cxcywh_to_xyxy(targets.boxes[match.target])
        reference = layers[-1]["reference"][match.batch, match.query].detach()
        with torch.no_grad():
            index, weight_right, weight_left = boxes_to_offsets(reference, target_xyxy, weights, outputs["reg_scale"].float())
        teacher = layers[-1]
        batch, queries = teacher["logits"].shape[:2]
        fgl, ddf = zero, zero
        for position, layer in enumerate(layers):
            with torch.no_grad():
                iou = paired_iou(cxcywh_to_xyxy(layer["boxes"][match.batch, match.query]), target_xyxy)
            corners = layer["corners"][match.batch, match.query].reshape(-1, bins)
            fgl = fgl + fine_grained_localization_loss(corners, index, weight_right, weight_left, iou.repeat_interleave(4)).sum() / normaliser
            if position == len(layers) - 1:
                continue
            with torch.no_grad():
                local_weight = teacher["logits"].sigmoid().max(-1).values
                local_weight[match.batch, match.query] = iou.to(local_weight.dtype)
                matched = torch.zeros(batch, queries, dtype=torch.bool, device=local_weight.device)
                matched[match.batch, match.query] = True
                local_weight, matched = local_weight.repeat_interleave(4, dim=1).reshape(-1), matched.repeat_interleave(4, dim=1).reshape(-1)
            divergence = local_weight * distillation_divergence(
                layer["corners"].reshape(-1, bins), teacher["corners"].reshape(-1, bins), self.config.distillation_temperature
            )
            if positives_scale is None:
                scale = 8 / batch
                positives_scale = ((matched.sum() * scale) ** 0.5, ((~matched).sum() * scale) ** 0.5)
            num_pos, num_neg = positives_scale
            positive_mean = (divergence * matched).sum() / matched.sum().clamp(min=1)
            negative_mean = (divergence * ~matched).sum() / (~matched).sum().clamp(min=1)
            ddf = ddf + (positive_mean * num_pos + negative_mean * num_neg) / (num_pos + num_neg)
        return fgl, ddf, positives_scale

    # ------------------------------------------------------------------ hooks
    def extra_match_costs(self, levels: list[dict[str, torch.Tensor]], targets: DETRTargets) -> list[torch.Tensor | None] | None:
        """Costs added to the matching costs of ``levels`` (final, auxiliary, initial, encoder): None here.

        A subclass (``zoo_core.detr.mask_losses.MaskSetCriterion``) returns one ``(B, Q, T)`` cost or
        None per level.
        """
        return None

    def extra_terms(
        self, levels: list[dict[str, torch.Tensor]], matches: list[Match], denoising_layers: list[dict[str, torch.Tensor]],
        denoising_match: Match | None, targets: DETRTargets,
    ) -> dict[str, torch.Tensor]:
        """Further weighted loss sums by name (added to ``items`` and the total): none here.

        ``matches[k]`` is the own match of ``levels[k]``; ``denoising_layers`` (maybe empty) share
        ``denoising_match``.
        """
        return {}

    # ------------------------------------------------------------------ total
    def __call__(self, outputs: Mapping[str, Any], targets: DETRTargets) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        layers = [_float(item) for item in outputs["layers"]]
        initial = _float(outputs.get("initial"))
        encoder = [_float(item) for item in outputs.get("encoder", [])]
        device = layers[-1]["logits"].device
        targets = targets.to(device)
        # Levels in the published order: final layer, auxiliary layers, initial boxes, encoder proposals.
        levels = [layers[-1], *layers[:-1], *([initial] if initial is not None else []), *encoder]
        matches = self.matcher.match([(item["logits"], item["boxes"]) for item in levels], targets,
                                     self.extra_match_costs(levels, targets))
        own = dict(zip(map(id, levels), matches))
        num_boxes = average_box_count(targets.total, device, self.distributed)
        if c.go_union:
            box_match = global_optimal_union(matches, layers[-1]["logits"].shape[1], max(targets.total, 1))
            num_box_matches = average_box_count(len(box_match), device, self.distributed)
        else:
            box_match, num_box_matches = None, num_boxes
        has_corners = "corners" in layers[-1]

        sums = {"cls": 0.0, "l1": 0.0, "giou": 0.0}
        if has_corners:
            sums.update(fgl=0.0, ddf=0.0)

        def add_terms(item: dict[str, torch.Tensor], class_match: Match, geometry_match: Match, class_norm, box_norm) -> None:
            sums["cls"] = sums["cls"] + c.weight_class * self.classification(item, class_match, targets, class_norm)
            l1, giou = self.boxes(item, geometry_match, targets, box_norm)
            sums["l1"] = sums["l1"] + c.weight_l1 * l1
            sums["giou"] = sums["giou"] + c.weight_giou * giou

        for item in levels:
            geometry = box_match if box_match is not None else own[id(item)]
            add_terms(item, own[id(item)], geometry, num_boxes, num_box_matches)
        scale = None
        if has_corners:
            local_match = box_match if box_match is not None else own[id(layers[-1])]
            fgl, ddf, scale = self.local(outputs, layers, local_match, targets, num_box_matches, None)
            sums["fgl"] = sums["fgl"] + c.weight_fgl * fgl
            sums["ddf"] = sums["ddf"] + c.weight_ddf * ddf

        denoising = outputs.get("denoising")
        dn_match, dn_layers = None, []
        if denoising is not None:
            queries = denoising["queries"]
            dn_match = Match(queries.positive_batch, queries.positive_query, queries.positive_target)
            dn_norm = num_boxes * queries.num_groups
            dn_layers = [_float(item) for item in denoising["layers"]]
            dn_initial = _float(denoising.get("initial"))
            for item in [*dn_layers, *([dn_initial] if dn_initial is not None else [])]:
                add_terms(item, dn_match, dn_match, dn_norm, dn_norm)
            if has_corners:
                fgl, ddf, _ = self.local(outputs, dn_layers, dn_match, targets, dn_norm, scale)
                sums["fgl"] = sums["fgl"] + c.weight_fgl * fgl
                sums["ddf"] = sums["ddf"] + c.weight_ddf * ddf

        for name, value in self.extra_terms(levels, matches, dn_layers, dn_match, targets).items():
            sums[name] = sums.get(name, 0.0) + value
        sums = {k: torch.nan_to_num(torch.as_tensor(v, device=device), nan=0.0) for k, v in sums.items()}
        total = sum(sums.values())
        return total, {k: v.detach() for k, v in sums.items()}
