"""RF-DETR's LW-DETR decoder: two-stage query initialisation, Group DETR, box re-parameterisation.

- **Proposals** (two-stage, one set per group): every memory token gets an anchor box (its cell
  centre, side 0.05; tokens whose anchor leaves (0.01, 0.99) are zeroed), a per-group
  ``Linear + LayerNorm`` of the memory, a class head and a box head predicting a *re-parameterised*
  delta: ``cxcy = δxy · wh_a + cxcy_a``, ``wh = exp(δwh) · wh_a``. Each group keeps its
  ``min(Q, tokens)`` best tokens (max class logit); their boxes (detached) anchor the group's queries.
- **Queries**: learned content (``Q · G`` embeddings) and learned reference offsets, composed with
  the proposals the same re-parameterised way; at inference only group 0 runs. The query position
  is ``MLP(sine(reference))`` (DAB-DETR's 4-D sine embedding, 128 features per coordinate), once:
  the references stay fixed through the layers (``lite_refpoint_refine``).
- **Layers**: ``zoo_core.detr.decoder.DecoderLayer`` (self-attention, deformable cross-attention
  with value/output projections on the single P4 level, ReLU feed-forward, post-norm), whose
  self-attention runs each group separately in training (``GroupedSelfAttention``); every layer's
  output passes a shared LayerNorm and the shared class / box heads (box = re-parameterised delta
  on the fixed reference).
- The class head has ``num_classes + 1`` outputs (RF-DETR's convention); the last one is never a
  target and is left out of the detector's scores.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from zoo_core.detr.decoder import MLP, DecoderLayer, lower_token_first, prior_bias

__all__ = ["GroupedSelfAttention", "LWDETRDecoder", "sine_box_embedding", "reparameterised_boxes"]


def sine_box_embedding(boxes: torch.Tensor, features: int = 128, temperature: float = 10000.0) -> torch.Tensor:
    """``(..., 4)`` cxcywh → ``(..., 4·features)``: sin/cos interleaved per coordinate, ordered y, x, w, h."""
    steps = torch.arange(features, dtype=boxes.dtype, device=boxes.device)
    periods = temperature ** (2 * torch.div(steps, 2, rounding_mode="floor") / features)
    angles = boxes[..., None] * (2 * math.pi) / periods  # (..., 4, features)
    embedded = torch.stack([angles[..., 0::2].sin(), angles[..., 1::2].cos()], dim=-1).flatten(-2)
    x, y, w, h = embedded.unbind(-2)
    return torch.cat([y, x, w, h], dim=-1)


def reparameterised_boxes(delta: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``cxcy = δxy · wh_ref + cxcy_ref``, ``wh = exp(δwh) · wh_ref``."""
    return torch.cat([delta[..., :2] * reference[..., 2:] + reference[..., :2], delta[..., 2:].exp() * reference[..., 2:]], dim=-1)


class GroupedSelfAttention(nn.MultiheadAttention):
    """Self-attention that, in training, runs each of ``groups`` equal query groups on its own (Group DETR)."""

    def __init__(self, dim: int, num_heads: int, groups: int) -> None:
        super().__init__(dim, num_heads, batch_first=True)
        self.groups = groups

    def forward(self, query, key, value, **kwargs):
        if not self.training or self.groups == 1:
            return super().forward(query, key, value, **kwargs)
        batch, length = query.shape[:2]
        size = length // self.groups

        def fold(x: torch.Tensor) -> torch.Tensor:
            return torch.cat(x.split(size, dim=1), dim=0)

        attended, weights = super().forward(fold(query), fold(key), fold(value), **kwargs)
        return torch.cat(attended.split(batch, dim=0), dim=1), weights


class LWDETRDecoder(nn.Module):
    """See the module docstring. ``num_classes`` are the user's classes (heads have one more output)."""

    def __init__(
        self,
        num_classes: int,
        dim: int = 256,
        num_queries: int = 300,
        num_layers: int = 3,
        *,
        groups: int = 13,
        self_heads: int = 8,
        cross_heads: int = 16,
        points: int = 2,
        ffn_dim: int = 2048,
    ) -> None:
        super().__init__()
        self.num_classes, self.dim, self.num_queries, self.num_layers, self.groups = num_classes, dim, num_queries, num_layers, groups
        self.token_order = False  # DETRDetector.fuse: ties broken towards the lower token in the inference form
        outputs = num_classes + 1
        self.query_content = nn.Embedding(num_queries * groups, dim)
        self.query_boxes = nn.Embedding(num_queries * groups, 4)
        self.proposal_linear = nn.ModuleList(nn.Linear(dim, dim) for _ in range(groups))
        self.proposal_norm = nn.ModuleList(nn.LayerNorm(dim) for _ in range(groups))
        self.proposal_class_heads = nn.ModuleList(nn.Linear(dim, outputs) for _ in range(groups))
        self.proposal_box_heads = nn.ModuleList(MLP(dim, dim, 4, 3, "relu") for _ in range(groups))
        self.layers = nn.ModuleList()
        for _ in range(num_layers):
            layer = DecoderLayer(dim, cross_heads, ffn_dim, (points,), activation="relu", gated=False, value_projection=True)
            layer.self_attn = GroupedSelfAttention(dim, self_heads, groups)
            self.layers.append(layer)
        self.norm = nn.LayerNorm(dim)
        self.query_position = MLP(2 * dim, dim, dim, 2, "relu")
        self.class_head = nn.Linear(dim, outputs)
        self.box_head = MLP(dim, dim, 4, 3, "relu")
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # RF-DETR: Xavier on the transformer's matrices, deformable attention's own init, zero reference
        # offsets and box-head outputs, focal prior on every class head.
        for module in [*self.layers, *self.proposal_linear, self.query_position]:
            for parameter in module.parameters():
                if parameter.dim() > 1:
                    nn.init.xavier_uniform_(parameter)
        for layer in self.layers:
            layer.cross_attn.reset_parameters()
        nn.init.zeros_(self.query_boxes.weight)
        for head in [self.box_head, *self.proposal_box_heads]:
            nn.init.zeros_(head.layers[-1].weight)
            nn.init.zeros_(head.layers[-1].bias)
        for head in [self.class_head, *self.proposal_class_heads]:
            nn.init.constant_(head.bias, prior_bias(0.01))

    @staticmethod
    def anchors(height: int, width: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h·w, 4)`` cxcywh cell anchors (side 0.05; invalid ones zero) and the ``(h·w, 1)`` validity."""
        ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float32, device=device), torch.arange(width, dtype=torch.float32, device=device), indexing="ij")
        centres = torch.stack([(xs + 0.5) / width, (ys + 0.5) / height], dim=-1).reshape(-1, 2)
        boxes = torch.cat([centres, torch.full_like(centres, 0.05)], dim=-1)
        valid = ((boxes > 0.01) & (boxes < 0.99)).all(-1, keepdim=True)
        return torch.where(valid, boxes, torch.zeros_like(boxes)).to(dtype), valid

    def forward(self, features: Sequence[torch.Tensor], targets: Any = None) -> dict[str, Any]:
        del targets  # no denoising queries in RF-DETR
        (level,) = features
        batch, _, height, width = level.shape
        memory = level.flatten(2).transpose(1, 2)
        anchor_boxes, valid = self.anchors(height, width, memory.device, memory.dtype)
        memory = memory * valid.to(memory.dtype)
        groups = self.groups if self.training else 1
        keep = min(self.num_queries, memory.shape[1])
        proposal_boxes, proposal_logits = [], []
        for g in range(groups):
            projected = self.proposal_norm[g](self.proposal_linear[g](memory))
            logits = self.proposal_class_heads[g](projected)
            boxes = reparameterised_boxes(self.proposal_box_heads[g](projected), anchor_boxes)
            if self.token_order:
                # The inference form (DETRDetector.fuse): ties to the lower token, but the proposals stay in score
                # order: each query slot pairs its learned content and box offset with the proposal in that slot,
                # so a reordered list would change the detections, not only list them differently.
                index = torch.topk(lower_token_first(logits.max(-1).values), keep, dim=1).indices
            else:
                index = torch.topk(logits.max(-1).values, keep, dim=1).indices
            proposal_boxes.append(boxes.gather(1, index[..., None].expand(-1, -1, 4)))
            proposal_logits.append(logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1])))
        proposals = torch.cat(proposal_boxes, dim=1)  # (B, groups·keep, 4)
        count = self.num_queries * groups
        offsets = self.query_boxes.weight[:count].unsqueeze(0).expand(batch, -1, -1)
        anchored = reparameterised_boxes(offsets[:, : proposals.shape[1]], proposals.detach())
        references = torch.cat([anchored, offsets[:, proposals.shape[1] :]], dim=1)
        position = self.query_position(sine_box_embedding(references, self.dim // 2))
        queries = self.query_content.weight[:count].unsqueeze(0).expand(batch, -1, -1)
        reference_points = references[:, :, None]
        layers = []
        for index, layer in enumerate(self.layers):
            queries = layer(queries, reference_points, memory, [(height, width)], position=position)
            if self.training or index == self.num_layers - 1:
                normed = self.norm(queries)
                layers.append({"logits": self.class_head(normed), "boxes": reparameterised_boxes(self.box_head(normed), references)})
        if not self.training:
            return {"logits": layers[-1]["logits"], "boxes": layers[-1]["boxes"]}
        return {
            "layers": layers,
            "encoder": [{"logits": torch.cat(proposal_logits, dim=1), "boxes": proposals}],
            "groups": groups,
            "logits": layers[-1]["logits"],
            "boxes": layers[-1]["boxes"],
        }
