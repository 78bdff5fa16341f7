"""SegFormer: a Mix Transformer (MiT) encoder and the all-MLP decoder (the `segformer` family).

Xie et al., "SegFormer: Simple and Efficient Design for Semantic Segmentation with
Transformers", NeurIPS 2021 (arXiv:2105.15203). The encoder has four stages at strides 4, 8, 16
and 32; each starts with an *overlapping* patch embedding (a strided convolution whose kernel is
larger than its stride, then LayerNorm) and stacks pre-norm transformer blocks whose
self-attention reads keys and values from a map shrunk by a strided convolution ("sequence
reduction", ratio 8/4/2/1) and whose feed-forward network mixes in position with a 3×3 depthwise
convolution between its two linear layers (Mix-FFN). The decoder projects each stage to one
width, upsamples all four to stride 4, concatenates them deepest first, fuses them with a 1×1
conv-BN-ReLU and classifies every stride-4 pixel.

B0..B5 differ in the stage widths, depths and decoder width only (registry ``config``).

Numbers follow LibreYOLO 1.6.0's port of the Hugging Face release (the checkpoints users hold):
LayerNorm eps 1e-5, drop-path 0.1, element-wise dropout 0.1 before the classifier.

Only the builder imports this module, so the plugin's top level stays free of torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from zoo_core.building import BuildRequest
from zoo_core.losses.segmentation import weighted_pixel_cross_entropy
from zoo_core.nn.build_config import config_from_request
from zoo_core.nn.conv import ConvNormAct
from zoo_core.nn.fcn_head import SEGMENTATION_BN_EPS, SEGMENTATION_BN_MOMENTUM
from zoo_core.ops.resize import resize_logits

__all__ = ["SegformerConfig", "MixTransformer", "AllMLPDecoder", "Segformer", "build_segformer"]

_STAGES = 4


@dataclass(frozen=True)
class SegformerConfig:
    """Architecture settings of one SegFormer size (the registry's ``config`` mapping); defaults are B0."""

    embed_dims: tuple[int, ...] = (32, 64, 160, 256)  # token width per stage
    depths: tuple[int, ...] = (2, 2, 2, 2)  # transformer blocks per stage
    num_heads: tuple[int, ...] = (1, 2, 5, 8)
    sr_ratios: tuple[int, ...] = (8, 4, 2, 1)  # key/value map shrink factor per stage
    mlp_ratios: tuple[int, ...] = (4, 4, 4, 4)  # Mix-FFN hidden width / token width
    patch_sizes: tuple[int, ...] = (7, 3, 3, 3)  # patch-embedding kernels
    patch_strides: tuple[int, ...] = (4, 2, 2, 2)
    decoder_dim: int = 256  # width every stage is projected to in the all-MLP decoder
    drop_path_rate: float = 0.1  # stochastic depth, rising linearly over all blocks
    head_dropout: float = 0.1  # dropout before the classifier
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for field in ("embed_dims", "depths", "num_heads", "sr_ratios", "mlp_ratios", "patch_sizes", "patch_strides"):
            values = getattr(self, field)
            if len(values) != _STAGES or min(values) < 1:
                raise ValueError(f"SegFormer {field} needs {_STAGES} positive ints, got {values!r}")
        for dim, heads in zip(self.embed_dims, self.num_heads):
            if dim % heads:
                raise ValueError(f"SegFormer embed_dims {self.embed_dims} must be divisible by num_heads {self.num_heads}")
        if self.decoder_dim < 1:
            raise ValueError(f"SegFormer decoder_dim must be at least 1, got {self.decoder_dim}")
        for field in ("drop_path_rate", "head_dropout"):
            if not 0.0 <= getattr(self, field) < 1.0:
                raise ValueError(f"SegFormer {field} must be in [0, 1), got {getattr(self, field)}")


class OverlapPatchEmbed(nn.Module):
    """Strided convolution with a kernel wider than its stride (patches overlap), then LayerNorm over channels."""

    def __init__(self, in_channels: int, dim: int, patch_size: int, stride: int, eps: float) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, patch_size, stride, padding=patch_size // 2)
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """Tokens (N, h·w, dim) of the embedded map, and its height and width."""
        grid = self.proj(images)
        height, width = grid.shape[-2:]
        return self.norm(grid.flatten(2).transpose(1, 2)), height, width


class ReducedKeyValueAttention(nn.Module):
    """Multi-head self-attention whose keys and values come from the token map shrunk ``ratio``× per side.

    The shrink is a ``ratio``×``ratio`` convolution with stride ``ratio`` followed by LayerNorm
    (none when ``ratio`` is 1); keys and values share one projection (``kv``: first half keys).
    """

    def __init__(self, dim: int, num_heads: int, ratio: int, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)
        self.reduce = nn.Conv2d(dim, dim, ratio, ratio) if ratio > 1 else None
        self.reduce_norm = nn.LayerNorm(dim, eps=eps) if ratio > 1 else None

    def forward(self, tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
        batch, length, dim = tokens.shape
        head_dim = dim // self.num_heads
        query = self.q(tokens).view(batch, length, self.num_heads, head_dim).transpose(1, 2)
        source = tokens
        if self.reduce is not None:
            grid = tokens.transpose(1, 2).reshape(batch, dim, height, width)
            source = self.reduce_norm(self.reduce(grid).flatten(2).transpose(1, 2))
        key, value = self.kv(source).view(batch, -1, 2, self.num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(query, key, value)
        return self.out(attended.transpose(1, 2).reshape(batch, length, dim))


class MixFFN(nn.Module):
    """Linear → 3×3 depthwise conv on the token map (positional mixing) → GELU → linear."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.pos = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
        hidden = self.fc1(tokens)
        batch, length, channels = hidden.shape
        grid = self.pos(hidden.transpose(1, 2).reshape(batch, channels, height, width))
        return self.fc2(self.act(grid.flatten(2).transpose(1, 2)))


class MiTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x)), both through drop-path."""

    def __init__(self, dim: int, num_heads: int, ratio: int, mlp_ratio: int, drop_path: float, eps: float) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim, eps=eps)
        self.attn = ReducedKeyValueAttention(dim, num_heads, ratio, eps)
        self.ffn_norm = nn.LayerNorm(dim, eps=eps)
        self.ffn = MixFFN(dim, dim * mlp_ratio)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
        tokens = tokens + self.drop_path(self.attn(self.attn_norm(tokens), height, width))
        return tokens + self.drop_path(self.ffn(self.ffn_norm(tokens), height, width))


class MiTStage(nn.Module):
    """Patch embedding, transformer blocks, LayerNorm; returns an N×dim×h×w map."""

    def __init__(self, in_channels: int, dim: int, config: SegformerConfig, stage: int, drop_paths: list[float]) -> None:
        super().__init__()
        eps = config.layer_norm_eps
        self.embed = OverlapPatchEmbed(in_channels, dim, config.patch_sizes[stage], config.patch_strides[stage], eps)
        self.blocks = nn.ModuleList(
            MiTBlock(dim, config.num_heads[stage], config.sr_ratios[stage], config.mlp_ratios[stage], rate, eps)
            for rate in drop_paths
        )
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        tokens, height, width = self.embed(features)
        for block in self.blocks:
            tokens = block(tokens, height, width)
        tokens = self.norm(tokens)
        return tokens.transpose(1, 2).reshape(tokens.shape[0], -1, height, width)


class MixTransformer(nn.Module):
    """The MiT encoder: four stages, returning their maps at strides 4, 8, 16 and 32."""

    def __init__(self, config: SegformerConfig, in_channels: int = 3) -> None:
        super().__init__()
        total = sum(config.depths)
        rates = [config.drop_path_rate * index / max(total - 1, 1) for index in range(total)]
        stages = []
        first = 0
        for stage, (dim, depth) in enumerate(zip(config.embed_dims, config.depths)):
            stages.append(MiTStage(in_channels, dim, config, stage, rates[first : first + depth]))
            in_channels, first = dim, first + depth
        self.stages = nn.ModuleList(stages)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        features = []
        for stage in self.stages:
            images = stage(images)
            features.append(images)
        return features


class AllMLPDecoder(nn.Module):
    """Per-stage linear projection (as 1×1 convs), upsampling to stride 4, fusion and classification."""

    def __init__(self, in_dims: tuple[int, ...], dim: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Conv2d(in_dim, dim, 1) for in_dim in in_dims)
        self.fuse = ConvNormAct(
            len(in_dims) * dim, dim, 1, activation="relu", bn_eps=SEGMENTATION_BN_EPS, bn_momentum=SEGMENTATION_BN_MOMENTUM
        )
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Conv2d(dim, num_classes, 1)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        size = features[0].shape[-2:]
        # Projecting before upsampling is cheaper and equal: both are linear per pixel, and the
        # bilinear weights sum to one, so the bias passes through unchanged.
        maps = [resize_logits(proj(feature), size) for proj, feature in zip(self.proj, features)]
        fused = self.fuse(torch.cat(maps[::-1], dim=1))  # deepest stage first, as published
        return self.classifier(self.dropout(fused))


class Segformer(nn.Module):
    """MiT encoder + all-MLP decoder.

    Input: ImageNet-normalised images N×3×H×W (any size; multiples of 32 keep every stage exact).
    ``eval()``: ``model(images)`` returns logits N×num_classes×H×W (bilinear from stride 4).
    ``train()``: it returns ``{"main": stride-4 logits}``; ``loss`` resizes them to the masks and
    takes the pixel cross-entropy over pixels that are not ``batch["ignore_index"]``.
    """

    def __init__(self, num_classes: int, config: SegformerConfig | None = None, in_channels: int = 3) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        config = config or SegformerConfig()
        self.config = config
        self.num_classes = num_classes
        self.encoder = MixTransformer(config, in_channels)
        self.decoder = AllMLPDecoder(config.embed_dims, config.decoder_dim, num_classes, config.head_dropout)
        self.loss_weights = {"main": 1.0}
        self.apply(_init_weights)
        # The classifier starts near zero (normal, std 0.01), as the official decode heads do,
        # so a fresh model predicts close to uniform probabilities.
        nn.init.normal_(self.decoder.classifier.weight, std=0.01)

    def forward(self, images: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        logits = self.decoder(self.encoder(images))
        if self.training:
            return {"main": logits}
        return resize_logits(logits, images.shape[-2:])

    def loss(
        self, outputs: torch.Tensor | Mapping[str, torch.Tensor], batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Pixel cross-entropy of ``outputs`` (train dict or eval logits) against ``batch["masks"]``."""
        for key in ("masks", "ignore_index"):
            if key not in batch:
                raise ValueError(f"a semantic batch needs {key!r} (zoo_core/tasks/base.py); got keys {', '.join(batch)}")
        heads = {"main": outputs} if isinstance(outputs, torch.Tensor) else outputs
        return weighted_pixel_cross_entropy(heads, batch["masks"], int(batch["ignore_index"]), self.loss_weights)


@torch.no_grad()
def _init_weights(module: nn.Module) -> None:
    """The published MiT initialisation: truncated-normal(0.02) linears, fan-out normal convs, zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Conv2d):
        fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels // module.groups
        nn.init.normal_(module.weight, 0.0, (2.0 / fan_out) ** 0.5)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def build_segformer(request: BuildRequest) -> Segformer:
    """The `segformer` builder: ``request.config`` (registry) overridden by ``request.options`` (caller).

    Both may set any ``SegformerConfig`` field; anything else raises a ValueError naming it
    (a ``RegistryError`` when the declaration is at fault).
    """
    return Segformer(request.num_classes, config_from_request(SegformerConfig, request, what="SegFormer"))
