"""RF-DETR's backbone: a windowed DINOv2 ViT-S and the LW-DETR multi-scale projector.

**Windowed DINOv2** (RF-DETR's ``dinov2_windowed_small``): timm's DINOv2 ViT-S blocks (pre-norm,
layer scale, GELU MLP, 6 heads, width 384) on stride-16 patches (RF-DETR N-L use 16, not DINOv2's
14) with a learned absolute position embedding of ``pe × pe`` patches, bicubically resampled
(antialiased) to other grids. The patch grid is cut into ``w × w`` windows (2 × 2 for every
detection size); each window gets its own copy of the class token and is a separate attention
sequence, except in the blocks right after each tapped block (RF-DETR's ``window_block_indexes``
exclude the tap indices, which address ``hidden_states`` one block later), where all windows of
an image attend together. The outputs of blocks 3, 6, 9, 12 (1-based), final-normed, are put back
on the ``h × w`` grid. Input sides must be multiples of ``patch × windows`` (32).

**Projector** (``P4`` only for detection): the four maps are concatenated (4·384 channels) and
fused by LW-DETR's C2f block (conv-LN-SiLU convs, channel LayerNorm eps 1e-6, three bottlenecks
of two 3×3 convs, no shortcut) into ``hidden_dim`` channels, then a channel LayerNorm. RF-DETR has
no BatchNorm anywhere, which is why ``sync_bn`` has nothing to convert for it.

Inputs in [0, 1] are ImageNet-normalised here (RF-DETR normalises outside its model).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

__all__ = ["WindowedDINOv2", "ProjectorC2f", "ConvLN", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)



@functools.lru_cache(maxsize=16)
def antialiased_bicubic_weights(source: int, target: int) -> torch.Tensor:
    """``(target, source)``: ``F.interpolate(mode="bicubic", align_corners=False, antialias=True)`` along one axis, as a matrix.

    PyTorch's antialiased resize (PIL's ``ImagingResample``): the bicubic kernel (a = −0.5) widened
    by the downscale factor, each output's weights normalised to sum 1. As a constant matrix the
    resize exports to ONNX, which has no antialiased bicubic operator (``tests/test_rfdetr.py``
    checks it against ``F.interpolate``).
    """

    def cubic(x: float) -> float:
        x = abs(x)
        if x < 1.0:
            return ((1.5 * x - 2.5) * x) * x + 1.0  # a = -0.5
        if x < 2.0:
            return (((-0.5 * x + 2.5) * x) - 4.0) * x + 2.0
        return 0.0

    scale = source / target
    stretch = max(scale, 1.0)
    support = 2.0 * stretch
    # Built in Python and turned into a tensor once: under tracing (ONNX, TorchScript export) one
    # constant, not one recorded write per weight (which made exporting RF-DETR-N several seconds slower).
    weights = [[0.0] * source for _ in range(target)]
    for i in range(target):
        centre = scale * (i + 0.5)
        first = max(int(centre - support + 0.5), 0)
        last = min(int(centre + support + 0.5), source)
        taps = [cubic((j - centre + 0.5) / stretch) for j in range(first, last)]
        total = sum(taps)
        for j, tap in zip(range(first, last), taps):
            weights[i][j] = tap / total if total != 0 else 0.0
    # A normal tensor even when first asked for under torch.inference_mode (a predict): the cache hands the
    # same tensor to later training steps, and autograd refuses inference tensors.
    with torch.inference_mode(False):
        return torch.tensor(weights, dtype=torch.float64).float()


class WindowedDINOv2(nn.Module):
    """Windowed DINOv2 ViT-S/16 returning the final-normed outputs of blocks ``taps`` (1-based) as maps.

    Args:
        position_grid: side of the learned position-embedding grid (resolution / 16).
        windows: windows per side.
        taps: 1-based block indices whose outputs are returned (RF-DETR's ``out_feature_indexes``).
    """

    def __init__(self, position_grid: int, windows: int = 2, taps: tuple[int, ...] = (3, 6, 9, 12), patch_size: int = 16) -> None:
        super().__init__()
        import timm

        self.vit = timm.create_model(
            "vit_small_patch14_dinov2", pretrained=False, num_classes=0, patch_size=patch_size,
            img_size=position_grid * patch_size, init_values=1.0,
        )
        dim = self.vit.embed_dim
        # DINOv2's masked-image-modelling token: unused by detection, kept so counts and checkpoints match RF-DETR's.
        self.mask_token = nn.Parameter(torch.zeros(1, dim))
        self.patch_size, self.windows, self.position_grid = patch_size, windows, position_grid
        self.taps = tuple(int(t) for t in taps)
        self.global_blocks = frozenset(t for t in self.taps if t < len(self.vit.blocks))
        self.out_channels = (dim,) * len(self.taps)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).reshape(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).reshape(1, 3, 1, 1), persistent=False)

    def positions(self, height: int, width: int) -> torch.Tensor:
        """``(1, 1 + h·w, dim)``: the class position and the patch grid resampled to ``h × w``."""
        table = self.vit.pos_embed
        if (height, width) == (self.position_grid, self.position_grid):
            return table
        grid = table[:, 1:].reshape(1, self.position_grid, self.position_grid, -1).permute(0, 3, 1, 2)
        rows = antialiased_bicubic_weights(self.position_grid, height).to(grid.device)
        columns = antialiased_bicubic_weights(self.position_grid, width).to(grid.device)
        grid = torch.einsum("hi,bcij,wj->bchw", rows, grid.float(), columns).to(table.dtype)
        return torch.cat([table[:, :1], grid.permute(0, 2, 3, 1).reshape(1, height * width, -1)], dim=1)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        images = (images - self.mean.to(images.dtype)) / self.std.to(images.dtype)
        patches = self.vit.patch_embed.proj(images)
        batch, dim, height, width = patches.shape
        w = self.windows
        if height % w or width % w:
            raise ValueError(f"the patch grid {height}×{width} must divide into {w}×{w} windows (input sides multiples of {self.patch_size * w})")
        tokens = torch.cat([self.vit.cls_token.expand(batch, -1, -1), patches.flatten(2).transpose(1, 2)], dim=1)
        tokens = tokens + self.positions(height, width)
        hw, ww = height // w, width // w
        # (B, H, W, C) -> (B·w·w, hw·ww, C), windows in row-major order; every window gets the class token.
        grid = tokens[:, 1:].reshape(batch * w, hw, w, ww, dim).permute(0, 2, 1, 3, 4).reshape(batch * w * w, hw * ww, dim)
        x = torch.cat([tokens[:, :1].repeat(w * w, 1, 1), grid], dim=1)
        per_window = x.shape[1]
        outputs = []
        for index, block in enumerate(self.vit.blocks):
            if index in self.global_blocks:  # all windows of an image attend together
                x = block(x.reshape(batch, w * w * per_window, dim)).reshape(batch * w * w, per_window, dim)
            else:
                x = block(x)
            if index + 1 in self.taps:
                normed = self.vit.norm(x)[:, 1:]
                normed = normed.reshape(batch * w, w, hw, ww, dim).permute(0, 2, 1, 3, 4).reshape(batch, height, width, dim)
                outputs.append(normed.permute(0, 3, 1, 2).contiguous())
            if index + 1 >= max(self.taps):
                break
        return outputs


class ConvLN(nn.Sequential):
    """Bias-free conv → channel LayerNorm (eps 1e-6) → SiLU (LW-DETR's ConvX with ``layer_norm``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 1) -> None:
        from timm.layers import LayerNorm2d

        super().__init__(
            nn.Conv2d(in_channels, out_channels, kernel_size, 1, kernel_size // 2, bias=False),
            LayerNorm2d(out_channels, eps=1e-6),
            nn.SiLU(),
        )


class ProjectorC2f(nn.Module):
    """The P4 projector: concatenated maps → C2f (``entry`` split in halves, bottlenecks, ``merge``) → LayerNorm."""

    def __init__(self, in_channels: int, out_channels: int = 256, num_blocks: int = 3) -> None:
        super().__init__()
        from timm.layers import LayerNorm2d

        self.half = out_channels // 2
        self.entry = ConvLN(in_channels, 2 * self.half)
        self.blocks = nn.ModuleList(nn.Sequential(ConvLN(self.half, self.half, 3), ConvLN(self.half, self.half, 3)) for _ in range(num_blocks))
        self.merge = ConvLN((2 + num_blocks) * self.half, out_channels)
        self.norm = LayerNorm2d(out_channels, eps=1e-6)
        self.out_channels = (out_channels,)

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        x = torch.cat(list(features), dim=1)
        parts = list(self.entry(x).split((self.half, self.half), dim=1))
        for block in self.blocks:
            parts.append(block(parts[-1]))
        return [self.norm(self.merge(torch.cat(parts, dim=1)))]
