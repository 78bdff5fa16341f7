"""The RT-DETR-family transformer decoder: query selection, decoder layers, box refinement.

Pipeline (shared by every family of the RT-DETR line):

1. **Memory**: the encoder's maps are projected to ``dim`` (1×1 conv-BN) and flattened into one
   token sequence with their ``(h, w)`` shapes.
2. **Query selection** (``QuerySelector``, RT-DETR §4.3): every memory token gets a class score
   and a box (a delta on a fixed anchor, in logit space); the ``num_queries`` tokens with the
   highest class score become the decoder's initial queries (their features, detached) and
   reference boxes. The training loss sees these proposals too (the "encoder" terms), which
   makes selection IoU-aware once the class target is an IoU (VFL) or an IoU power (MAL) — the
   uncertainty-minimal selection of the paper.
3. **Denoising** (training, with targets): noised ground-truth queries are prepended
   (``zoo_core.detr.denoising``) with their attention mask.
4. **Layers** (``DecoderLayer``): self-attention, multi-scale deformable cross-attention around
   the reference box, feed-forward; each layer's box is the next layer's reference (iterative
   refinement, references detached between layers).

Two refinement heads:

- ``DeltaRefinementDecoder`` (RT-DETR): each layer predicts a logit-space delta to its reference.
- ``DistributionRefinementDecoder`` (D-FINE, DEIM, RT-DETRv4): layer 0 also predicts an initial
  box; every layer then refines the four edge distributions of that fixed initial box (FDR,
  ``zoo_core.detr.distribution``), adding its residual logits to the previous layer's; the
  class score gets a localisation-quality term from the distribution's top-k statistics (LQE);
  layers use a gated cross-attention residual and sample the memory without value projection.

Outputs: in eval mode ``{"logits": (B, Q, C), "boxes": (B, Q, 4)}`` of layer ``eval_index``
(boxes are normalised cxcywh). In training mode additionally ``"layers"`` (every layer's
``logits``/``boxes`` and, for FDR, ``corners``/``reference``), ``"encoder"`` (the selected
proposals), ``"initial"`` (FDR's layer-0 initial boxes), ``"denoising"`` (the same for the
denoising queries, with ``"queries"``: the ``DenoisingQueries``) — what ``SetCriterion`` reads.
A new family subclasses ``DETRDecoderBase`` and implements ``run_layers``.

Mask heads (``zoo_core.detr.mask_head``) need each layer's query features: with ``return_queries``
set, every layer item also holds ``"queries"`` (B×Q×dim, the layer's output features, split into the
matching and denoising parts like the boxes), and the eval outputs gain ``"queries"`` of layer
``eval_index``.
"""

from __future__ import annotations

import abc
import math
from collections import OrderedDict
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.detr.deformable_attention import MultiScaleDeformableAttention
from zoo_core.detr.denoising import DenoisingQueries, make_denoising_queries
from zoo_core.detr.distribution import edge_weighting, expected_offsets, offsets_to_boxes
from zoo_core.detr.fusion_blocks import conv_bn
from zoo_core.detr.geometry import inverse_sigmoid
from zoo_core.detr.targets import DETRTargets
from zoo_core.nn.conv import make_activation

__all__ = [
    "MLP",
    "GatedResidual",
    "DecoderLayer",
    "QuerySelector",
    "DETRDecoderBase",
    "DeltaRefinementDecoder",
    "DistributionRefinementDecoder",
    "prior_bias",
]

SpatialShapes = list[tuple[int, int]]
_ANCHOR_CACHE_SIZE = 16
INVALID_ANCHOR_LOGIT = 1e4  # finite (fp16-safe) stand-in for +inf: sigmoid saturates to exactly 1


def prior_bias(probability: float = 0.01) -> float:
    """Bias giving a sigmoid output of ``probability`` (focal-loss prior initialisation)."""
    return -math.log((1 - probability) / probability)


class MLP(nn.Module):
    """``num_layers`` linear layers with ``activation`` between them (none after the last)."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, activation: str = "relu") -> None:
        super().__init__()
        widths = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.act = make_activation(activation, inplace=False)  # after nn.Linear: see make_activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index < last:
                x = self.act(x)
        return x


class GatedResidual(nn.Module):
    """D-FINE's gateway: ``LayerNorm(g1·x + g2·y)`` with ``(g1, g2) = sigmoid(Linear([x, y]))``, gates starting at 0.5."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2 * dim, 2 * dim)
        self.norm = nn.LayerNorm(dim)
        nn.init.zeros_(self.linear.weight)
        nn.init.constant_(self.linear.bias, prior_bias(0.5))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        gate_x, gate_y = torch.sigmoid(self.linear(torch.cat([x, y], dim=-1))).chunk(2, dim=-1)
        return self.norm(gate_x * x + gate_y * y)


class DecoderLayer(nn.Module):
    """Self-attention → deformable cross-attention → feed-forward, post-norm.

    Args:
        dim, num_heads, ffn_dim: widths.
        points_per_level: deformable sampling points per level.
        activation: the feed-forward activation.
        gated: D-FINE's gated cross-attention residual instead of add-and-norm.
        value_projection: projections inside the deformable attention (False for D-FINE).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        ffn_dim: int,
        points_per_level: Sequence[int],
        *,
        activation: str = "relu",
        gated: bool = False,
        value_projection: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.norm_self = nn.LayerNorm(dim)
        self.cross_attn = MultiScaleDeformableAttention(dim, num_heads, points_per_level, value_projection=value_projection)
        self.gate = GatedResidual(dim) if gated else None
        self.norm_cross = None if gated else nn.LayerNorm(dim)
        self.ffn_in = nn.Linear(dim, ffn_dim)
        self.ffn_act = make_activation(activation, inplace=False)  # after nn.Linear: see make_activation
        self.ffn_out = nn.Linear(ffn_dim, dim)
        self.norm_ffn = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        if gated:  # D-FINE initialises its feed-forward with Xavier
            nn.init.xavier_uniform_(self.ffn_in.weight)
            nn.init.xavier_uniform_(self.ffn_out.weight)

    def forward(
        self,
        queries: torch.Tensor,
        reference_boxes: torch.Tensor,
        memory: torch.Tensor | None,
        spatial_shapes: SpatialShapes,
        *,
        position: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        value_levels: Sequence[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        with_position = queries if position is None else queries + position
        attended = self.self_attn(with_position, with_position, queries, attn_mask=attention_mask, need_weights=False)[0]
        queries = self.norm_self(queries + self.dropout(attended))
        with_position = queries if position is None else queries + position
        sampled = self.cross_attn(with_position, reference_boxes, memory, spatial_shapes, value_levels)
        if self.gate is not None:
            queries = self.gate(queries, self.dropout(sampled))
        else:
            queries = self.norm_cross(queries + self.dropout(sampled))
        hidden = self.ffn_out(self.dropout(self.ffn_act(self.ffn_in(queries))))
        return self.norm_ffn((queries + self.dropout(hidden)).clamp(min=-65504, max=65504))


def lower_token_first(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` (N×T) in float64 minus ``1e-12 · token``: equal scores rank the lower token first, distinct
    float32 scores (at least one float32 step, ~1e-7 and more, apart) keep their order. A key every
    runtime's top-k orders alike (a stable sort has no ONNX export)."""
    position = torch.ones_like(scores[:1], dtype=torch.float64).cumsum(1)
    return scores.double() - 1e-12 * position


class QuerySelector(nn.Module):
    """Scores every memory token and keeps the ``num_queries`` best as initial queries.

    Anchors: a box at each token's cell centre with side ``anchor_size · 2^level``; anchors with a
    coordinate outside ``(eps, 1 − eps)`` are invalid (their memory is zeroed and their box logit
    pushed to ``INVALID_ANCHOR_LOGIT``).
    """

    def __init__(self, dim: int, num_classes: int, num_queries: int, *, mlp_activation: str = "relu", anchor_size: float = 0.05, eps: float = 1e-2) -> None:
        super().__init__()
        self.num_queries = num_queries
        self.anchor_size, self.eps = anchor_size, eps
        self.memory_linear = nn.Linear(dim, dim)
        self.memory_norm = nn.LayerNorm(dim)
        self.class_head = nn.Linear(dim, num_classes)
        self.box_head = MLP(dim, dim, 4, 3, mlp_activation)
        nn.init.xavier_uniform_(self.memory_linear.weight)
        nn.init.constant_(self.class_head.bias, prior_bias(0.01))
        nn.init.zeros_(self.box_head.layers[-1].weight)
        nn.init.zeros_(self.box_head.layers[-1].bias)
        self._anchors: "OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]]" = OrderedDict()
        # Both set by an inference form (DETRDetector.fuse, DETRSegmenter.fuse): ties to the lower token and,
        # unless keep_score_order, the kept queries listed in token order.
        self.token_order = False
        self.keep_score_order = False

    def anchors(self, spatial_shapes: SpatialShapes, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(1, tokens, 4)`` anchor logits and ``(1, tokens, 1)`` validity, cached per shape."""
        key = (tuple(spatial_shapes), device, dtype)
        cached = self._anchors.get(key)
        if cached is not None:
            return cached
        levels = []
        for level, (height, width) in enumerate(spatial_shapes):
            ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32), indexing="ij")
            centres = torch.stack([(xs + 0.5) / float(width), (ys + 0.5) / float(height)], -1)
            sizes = torch.full_like(centres, self.anchor_size * 2.0**level)
            levels.append(torch.cat([centres, sizes], -1).reshape(-1, 4))
        boxes = torch.cat(levels)[None]
        valid = ((boxes > self.eps) & (boxes < 1 - self.eps)).all(-1, keepdim=True)
        logits = torch.log(boxes / (1 - boxes))
        logits = torch.where(valid, logits, torch.full_like(logits, INVALID_ANCHOR_LOGIT))
        cached = (logits.to(device=device, dtype=dtype), valid.to(device))
        self._anchors[key] = cached
        while len(self._anchors) > _ANCHOR_CACHE_SIZE:
            self._anchors.popitem(last=False)
        return cached

    def forward(self, memory: torch.Tensor, spatial_shapes: SpatialShapes) -> dict[str, torch.Tensor]:
        """``content`` (detached features), ``box_logits`` (detached), ``logits`` and ``boxes`` of the proposals."""
        if memory.shape[1] < self.num_queries:
            raise ValueError(
                f"the input gives {memory.shape[1]} encoder tokens for {self.num_queries} queries: use a larger input "
                "(the model's minimum_input_size) or build the model with fewer queries (options={'num_queries': n})"
            )
        anchor_logits, valid = self.anchors(spatial_shapes, memory.device, memory.dtype)
        features = self.memory_norm(self.memory_linear(valid.to(memory.dtype) * memory))
        token_logits = self.class_head(features)
        if self.token_order:  # the inference form: ties to the lower token, queries in token order unless keep_score_order
            index = torch.topk(lower_token_first(token_logits.max(-1).values), self.num_queries, dim=1).indices
            if not self.keep_score_order:
                index = index.sort(dim=1).values
        else:
            index = torch.topk(token_logits.max(-1).values, self.num_queries, dim=1).indices
        selected = features.gather(1, index[..., None].expand(-1, -1, features.shape[-1]))
        selected_anchors = anchor_logits.expand(memory.shape[0], -1, -1).gather(1, index[..., None].expand(-1, -1, 4))
        box_logits = self.box_head(selected) + selected_anchors
        logits = token_logits.gather(1, index[..., None].expand(-1, -1, token_logits.shape[-1]))
        return {"content": selected.detach(), "box_logits": box_logits.detach(), "logits": logits, "boxes": box_logits.sigmoid()}


class DETRDecoderBase(nn.Module, metaclass=abc.ABCMeta):
    """Input projections, query selection, denoising and the output assembly; subclasses run the layers.

    Args:
        num_classes: detector classes.
        in_channels: channels of the encoder maps (finest first).
        dim: decoder width.
        num_queries: matching queries.
        num_layers: decoder layers (built by the subclass).
        eval_index: the layer whose output is used at inference (negative: from the end).
        num_denoising, label_noise_ratio, box_noise_scale, absolute_denoising_sizes: denoising.
        project_inputs: ``"always"`` (RT-DETR: conv-BN on every level) or ``"when_needed"``
            (D-FINE: only where the channels differ from ``dim``).
        mlp_activation: activation of the box/position MLPs.
        position_clamp: clamp of the query position embedding (D-FINE: 10), None for none.
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: Sequence[int],
        dim: int,
        num_queries: int,
        num_layers: int,
        *,
        eval_index: int = -1,
        num_denoising: int = 100,
        label_noise_ratio: float = 0.5,
        box_noise_scale: float = 1.0,
        absolute_denoising_sizes: bool = False,
        project_inputs: str = "always",
        mlp_activation: str = "relu",
        position_clamp: float | None = None,
    ) -> None:
        super().__init__()
        if project_inputs not in ("always", "when_needed"):
            raise ValueError(f"project_inputs must be 'always' or 'when_needed', got {project_inputs!r}")
        self.num_classes, self.dim, self.num_queries, self.num_layers = num_classes, dim, num_queries, num_layers
        self.eval_index = eval_index if eval_index >= 0 else num_layers + eval_index
        if not 0 <= self.eval_index < num_layers:
            raise ValueError(f"eval_index {eval_index} is outside the {num_layers} decoder layers")
        self.num_denoising, self.label_noise_ratio, self.box_noise_scale = num_denoising, label_noise_ratio, box_noise_scale
        self.absolute_denoising_sizes = absolute_denoising_sizes
        self.position_clamp = position_clamp
        self.input_projections = nn.ModuleList(
            conv_bn(c, dim) if project_inputs == "always" or c != dim else nn.Identity() for c in in_channels
        )
        for projection, channels in zip(self.input_projections, in_channels):
            if project_inputs == "when_needed" and channels != dim:
                nn.init.xavier_uniform_(projection[0].weight)
        self.query_selector = QuerySelector(dim, num_classes, num_queries, mlp_activation=mlp_activation)
        self.denoising_embedding = nn.Embedding(num_classes + 1, dim, padding_idx=num_classes) if num_denoising > 0 else None
        self.query_position = MLP(4, 2 * dim, dim, 2, mlp_activation)
        nn.init.xavier_uniform_(self.query_position.layers[0].weight)
        nn.init.xavier_uniform_(self.query_position.layers[1].weight)
        # Set by a segmenter (zoo_core.detr.segmenter): run_layers then keeps each layer's query features.
        self.return_queries = False

    def flatten(self, features: Sequence[torch.Tensor]) -> tuple[torch.Tensor, SpatialShapes]:
        """Project and flatten the maps: ``(B, Σ h·w, dim)`` memory and the ``(h, w)`` shapes."""
        if len(features) != len(self.input_projections):
            raise ValueError(f"the decoder takes {len(self.input_projections)} feature maps, got {len(features)}")
        maps = [projection(x) for projection, x in zip(self.input_projections, features)]
        shapes = [(int(m.shape[2]), int(m.shape[3])) for m in maps]
        return torch.cat([m.flatten(2).transpose(1, 2) for m in maps], dim=1), shapes

    def position_embedding(self, reference_boxes: torch.Tensor) -> torch.Tensor:
        position = self.query_position(reference_boxes)
        return position.clamp(-self.position_clamp, self.position_clamp) if self.position_clamp is not None else position

    @abc.abstractmethod
    def run_layers(
        self, queries: torch.Tensor, box_logits: torch.Tensor, memory: torch.Tensor, spatial_shapes: SpatialShapes, attention_mask: torch.Tensor | None
    ) -> dict[str, Any]:
        """Run the decoder layers; see the subclasses for the returned per-layer lists."""

    def inference_unused_parameter_count(self) -> int:
        """Parameters the published deployed form drops (training-only heads); 0 unless a subclass says otherwise."""
        return 0

    def forward(self, features: Sequence[torch.Tensor], targets: DETRTargets | None = None) -> dict[str, Any]:
        memory, shapes = self.flatten(features)
        denoising: DenoisingQueries | None = None
        if self.training and targets is not None and self.denoising_embedding is not None:
            denoising = make_denoising_queries(
                targets, self.num_classes, self.num_queries, self.num_denoising, self.label_noise_ratio,
                self.box_noise_scale, self.absolute_denoising_sizes,
            )
        proposals = self.query_selector(memory, shapes)
        queries, box_logits, mask = proposals["content"], proposals["box_logits"], None
        if denoising is not None:
            queries = torch.cat([self.denoising_embedding(denoising.labels).to(queries.dtype), queries], dim=1)
            box_logits = torch.cat([denoising.box_logits.to(box_logits.dtype), box_logits], dim=1)
            mask = denoising.attention_mask
        result = self.run_layers(queries, box_logits, memory, shapes, mask)
        layers: list[dict[str, torch.Tensor]] = result["layers"]
        if not self.training:
            final = {"logits": layers[-1]["logits"], "boxes": layers[-1]["boxes"]}
            if "queries" in layers[-1]:
                final["queries"] = layers[-1]["queries"]
            return final
        split = denoising.num_queries if denoising is not None else 0

        def part(item: dict[str, torch.Tensor] | None, first: bool) -> dict[str, torch.Tensor] | None:
            if item is None:
                return None
            return {k: (v[:, :split] if first else v[:, split:]) for k, v in item.items()}

        outputs: dict[str, Any] = {
            "layers": [part(item, False) for item in layers],
            "initial": part(result.get("initial"), False),
            "encoder": [{"logits": proposals["logits"], "boxes": proposals["boxes"]}],
            "denoising": None,
        }
        outputs.update(result.get("extras", {}))
        outputs["logits"], outputs["boxes"] = outputs["layers"][-1]["logits"], outputs["layers"][-1]["boxes"]
        if denoising is not None:
            outputs["denoising"] = {
                "layers": [part(item, True) for item in layers],
                "initial": part(result.get("initial"), True),
                "queries": denoising,
            }
        return outputs


class DeltaRefinementDecoder(DETRDecoderBase):
    """RT-DETR's decoder: each layer adds a logit-space delta to its (detached) reference box.

    Extra args: ``num_heads``, ``ffn_dim``, ``points_per_level``, ``activation`` (feed-forward).
    In training the box of layer ``i > 0`` is also computed against the previous layer's
    un-detached box, so gradients flow through the refinement chain (as published).
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: Sequence[int],
        dim: int = 256,
        num_queries: int = 300,
        num_layers: int = 6,
        *,
        num_heads: int = 8,
        ffn_dim: int = 1024,
        points_per_level: Sequence[int] = (4, 4, 4),
        activation: str = "relu",
        **kwargs: Any,
    ) -> None:
        super().__init__(num_classes, in_channels, dim, num_queries, num_layers, **kwargs)
        self.layers = nn.ModuleList(
            DecoderLayer(dim, num_heads, ffn_dim, points_per_level, activation=activation) for _ in range(num_layers)
        )
        self.class_heads = nn.ModuleList(nn.Linear(dim, num_classes) for _ in range(num_layers))
        self.box_heads = nn.ModuleList(MLP(dim, dim, 4, 3, "relu") for _ in range(num_layers))
        for class_head, box_head in zip(self.class_heads, self.box_heads):
            nn.init.constant_(class_head.bias, prior_bias(0.01))
            nn.init.zeros_(box_head.layers[-1].weight)
            nn.init.zeros_(box_head.layers[-1].bias)

    def run_layers(self, queries, box_logits, memory, spatial_shapes, attention_mask):
        reference = box_logits.sigmoid()
        reference_with_grad = reference
        layers = []
        for index, layer in enumerate(self.layers):
            queries = layer(
                queries, reference[:, :, None], memory, spatial_shapes,
                position=self.position_embedding(reference), attention_mask=attention_mask,
            )
            delta = self.box_heads[index](queries)
            refined = torch.sigmoid(delta + inverse_sigmoid(reference))
            extra = {"queries": queries} if self.return_queries else {}
            if self.training:
                boxes = refined if index == 0 else torch.sigmoid(delta + inverse_sigmoid(reference_with_grad))
                layers.append({"logits": self.class_heads[index](queries), "boxes": boxes, **extra})
            elif index == self.eval_index:
                layers.append({"logits": self.class_heads[index](queries), "boxes": refined, **extra})
                break
            reference_with_grad = refined
            reference = refined.detach() if self.training else refined
        return {"layers": layers}


class LocalizationQuality(nn.Module):
    """D-FINE's LQE: adds ``MLP(top-k bin probabilities and their mean)`` to the class logits."""

    def __init__(self, reg_max: int, top_k: int = 4, hidden_dim: int = 64, activation: str = "relu") -> None:
        super().__init__()
        self.reg_max, self.top_k = reg_max, top_k
        self.mlp = MLP(4 * (top_k + 1), hidden_dim, 1, 2, activation)
        nn.init.zeros_(self.mlp.layers[-1].weight)
        nn.init.zeros_(self.mlp.layers[-1].bias)

    def forward(self, logits: torch.Tensor, corners: torch.Tensor) -> torch.Tensor:
        batch, queries, _ = corners.shape
        probabilities = F.softmax(corners.reshape(batch, queries, 4, self.reg_max + 1), dim=-1)
        top = probabilities.topk(self.top_k, dim=-1).values
        statistics = torch.cat([top, top.mean(dim=-1, keepdim=True)], dim=-1)
        return logits + self.mlp(statistics.reshape(batch, queries, -1))


class DistributionRefinementDecoder(DETRDecoderBase):
    """D-FINE's decoder (fine-grained distribution refinement), also DEIM's and RT-DETRv4's.

    Extra args: ``num_heads``, ``ffn_dim``, ``points_per_level``, ``activation`` (feed-forward and
    LQE), ``reg_max`` (bins − 1, 32 published), ``reg_scale`` (W(n) curvature: 4, 8 for X) and
    ``up`` (0.5). ``reg_scale`` and ``up`` are fixed constants saved with the model: frozen parameters
    upstream (``requires_grad=False``, counted), persistent buffers here so that every zoo parameter
    trains; ``deploy_parameter_count`` counts them as the published tables do.
    """

    def __init__(
        self,
        num_classes: int,
        in_channels: Sequence[int],
        dim: int = 256,
        num_queries: int = 300,
        num_layers: int = 6,
        *,
        num_heads: int = 8,
        ffn_dim: int = 1024,
        points_per_level: Sequence[int] = (3, 6, 3),
        activation: str = "relu",
        mlp_activation: str = "relu",
        reg_max: int = 32,
        reg_scale: float = 4.0,
        up: float = 0.5,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("project_inputs", "when_needed")
        kwargs.setdefault("position_clamp", 10.0)
        kwargs.setdefault("absolute_denoising_sizes", True)
        super().__init__(num_classes, in_channels, dim, num_queries, num_layers, mlp_activation=mlp_activation, **kwargs)
        self.reg_max = reg_max
        # Fixed constants: published as nn.Parameter(requires_grad=False), held here as (saved) buffers
        # so that every parameter of a zoo model trains; deploy_parameter_count counts them as published.
        self.register_buffer("up", torch.tensor([float(up)]))
        self.register_buffer("reg_scale", torch.tensor([float(reg_scale)]))
        self.layers = nn.ModuleList(
            DecoderLayer(dim, num_heads, ffn_dim, points_per_level, activation=activation, gated=True, value_projection=False)
            for _ in range(num_layers)
        )
        self.class_heads = nn.ModuleList(nn.Linear(dim, num_classes) for _ in range(num_layers))
        self.box_heads = nn.ModuleList(MLP(dim, dim, 4 * (reg_max + 1), 3, mlp_activation) for _ in range(num_layers))
        self.initial_box_head = MLP(dim, dim, 4, 3, mlp_activation)
        self.quality_heads = nn.ModuleList(LocalizationQuality(reg_max, activation=activation) for _ in range(num_layers))
        for head in [*self.box_heads, self.initial_box_head]:
            nn.init.zeros_(head.layers[-1].weight)
            nn.init.zeros_(head.layers[-1].bias)
        for class_head in self.class_heads:
            nn.init.constant_(class_head.bias, prior_bias(0.01))
        if self.denoising_embedding is not None:
            nn.init.normal_(self.denoising_embedding.weight[:-1])

    def inference_unused_parameter_count(self) -> int:
        """D-FINE's ``convert_to_deploy``: class and LQE heads of all layers but ``eval_index``, and every layer after it."""
        def count(modules: Any) -> int:
            return sum(parameter.numel() for module in modules for parameter in module.parameters())

        unused = [head for index, head in enumerate(self.class_heads) if index != self.eval_index]
        unused += [head for index, head in enumerate(self.quality_heads) if index != self.eval_index]
        unused += [*self.layers[self.eval_index + 1 :], *self.box_heads[self.eval_index + 1 :]]
        return count(unused)

    def edge_weights(self) -> torch.Tensor:
        """``W(n)``, the bin values (``reg_max + 1``)."""
        return edge_weighting(self.reg_max, self.up, self.reg_scale)

    def run_layers(self, queries, box_logits, memory, spatial_shapes, attention_mask):
        weights = self.edge_weights()
        value_levels = self.layers[0].cross_attn.split_value(memory, spatial_shapes)
        reference = box_logits.sigmoid()
        previous_queries: torch.Tensor | float = 0.0
        previous_corners: torch.Tensor | float = 0.0
        layers, initial, initial_reference = [], None, None
        for index, layer in enumerate(self.layers):
            queries = layer(
                queries, reference[:, :, None], None, spatial_shapes,
                position=self.position_embedding(reference), attention_mask=attention_mask, value_levels=value_levels,
            )
            if index == 0:
                initial_boxes = torch.sigmoid(self.initial_box_head(queries) + inverse_sigmoid(reference))
                initial = {"logits": self.class_heads[0](queries), "boxes": initial_boxes}
                initial_reference = initial_boxes.detach()
            corners = self.box_heads[index](queries + previous_queries) + previous_corners
            boxes = offsets_to_boxes(initial_reference, expected_offsets(corners, weights), self.reg_scale)
            if self.training or index == self.eval_index:
                logits = self.quality_heads[index](self.class_heads[index](queries), corners)
                layers.append({"logits": logits, "boxes": boxes, "corners": corners, "reference": initial_reference})
                if self.return_queries:
                    layers[-1]["queries"] = queries
                if not self.training:
                    break
            previous_corners = corners
            reference = boxes.detach()
            previous_queries = queries.detach()
        return {"layers": layers, "initial": initial, "extras": {"edge_weights": weights, "reg_scale": self.reg_scale}}
