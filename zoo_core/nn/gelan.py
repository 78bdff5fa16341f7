"""GELAN building blocks (Wang, Yeh & Liao, YOLOv9, ECCV 2024), named as in the paper's code.

GELAN (generalized efficient layer aggregation network) stacks ``RepNCSPELAN4`` blocks: a 1×1
conv whose output is split in two halves, two chained computational branches (each a CSP stage
of re-parameterisable bottlenecks then a 3×3 conv), and a 1×1 conv over the concatenation of the
halves and both branch outputs. ``ELAN1`` is its light variant with plain 3×3 convs as branches.
Downsampling is ``AConv`` (average-pool then strided 3×3) or ``ADown`` (average-pool, then half
the channels through a strided 3×3 and half through max-pool + 1×1), and ``SPPELAN`` is the
spatial pyramid pooling of the neck. ``CBLinear`` and ``CBFuse`` route features of the main
backbone into PGI's auxiliary reversible branch.

Every conv is ``ConvNormAct`` (conv → BatchNorm(eps 1e-3, momentum 0.03) → SiLU).
``fuse_for_inference`` folds BatchNorms into convs and merges ``RepConvN`` branches; the result
computes the same function (up to float rounding) with fewer parameters and layers.

The GELAN detector trunk shared by the YOLOv9 families (``yolo9``, ``yolo9_e2e``) lives here too:
``GELANSpec`` (one size's widths and depths, the registry ``config``), ``GELANBackbone`` (stem, P2
block, three downsample + RepNCSPELAN4 stages), ``GELANTopDownPath`` and ``GELANNeck`` (SPPELAN and
the PAN), and the constants of the DDetect head they feed (``GELAN_STRIDES``, ``DDETECT_REG_MAX``,
``DDETECT_BOX_GROUPS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.nn.conv import ConvNormAct, make_activation

__all__ = [
    "RepConvN",
    "RepNBottleneck",
    "RepNCSP",
    "RepNCSPELAN4",
    "ELAN1",
    "AConv",
    "ADown",
    "SPPELAN",
    "CBLinear",
    "CBFuse",
    "fold_batch_norm",
    "fuse_for_inference",
    "GELAN_STRIDES",
    "DDETECT_REG_MAX",
    "DDETECT_BOX_GROUPS",
    "GELANSpec",
    "GELANBackbone",
    "GELANTopDownPath",
    "GELANNeck",
]

GELAN_STRIDES = (8, 16, 32)  # the P3, P4, P5 maps a GELAN trunk hands to its head
DDETECT_REG_MAX = 16  # distance bins per box side of YOLOv9's DDetect head
DDETECT_BOX_GROUPS = 4  # DDetect's box branch: grouped 3×3 and 1×1, one group per box side
GELAN_P2_BLOCKS = ("elan1", "rep_ncsp_elan4")
GELAN_DOWNSAMPLERS = ("aconv", "adown")
GELAN_PGI_KINDS = ("auxiliary_neck", "reversible_backbone")


# SyncBatchNorm (what DDP training converts BatchNorm2d to) folds the same way.
_FOLDABLE_NORMS = (nn.BatchNorm2d, nn.SyncBatchNorm)


def fold_batch_norm(conv: nn.Conv2d, norm: nn.BatchNorm2d | nn.SyncBatchNorm) -> nn.Conv2d:
    """A biased ``Conv2d`` computing ``norm(conv(x))`` with ``norm``'s running statistics (eval mode)."""
    scale = norm.weight / torch.sqrt(norm.running_var + norm.eps)
    bias = norm.bias - norm.running_mean * scale
    if conv.bias is not None:
        bias = bias + conv.bias * scale
    fused = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
        bias=True,
        device=conv.weight.device,
        dtype=conv.weight.dtype,
    )
    with torch.no_grad():
        fused.weight.copy_(conv.weight * scale.reshape(-1, 1, 1, 1))
        fused.bias.copy_(bias)
    return fused


def _fold_conv_norm_act(block: ConvNormAct) -> None:
    if isinstance(block[1], _FOLDABLE_NORMS):
        block[0] = fold_batch_norm(block[0], block[1])
        block[1] = nn.Identity()


class RepConvN(nn.Module):
    """Re-parameterisable conv without identity branch: ``act(BN(conv3×3(x)) + BN(conv1×1(x)))``.

    Trains as two branches; ``fuse()`` merges them into one biased 3×3 conv (RepVGG).
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1, *, activation: str | None = "silu"
    ) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"RepConvN needs an odd kernel_size to centre its 1×1 branch, got {kernel_size}")
        self.dense = ConvNormAct(in_channels, out_channels, kernel_size, stride, activation=None)
        self.pointwise = ConvNormAct(in_channels, out_channels, 1, stride, padding=0, activation=None)
        self.activation = make_activation(activation)
        self.fused: nn.Conv2d | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block (the merged conv once ``fuse()`` ran)."""
        if self.fused is not None:
            return self.activation(self.fused(x))
        return self.activation(self.dense(x) + self.pointwise(x))

    @torch.no_grad()
    def fuse(self) -> None:
        """Merge both branches (and their BatchNorms) into one 3×3 conv; idempotent."""
        if self.fused is not None:
            return
        dense = fold_batch_norm(self.dense[0], self.dense[1])
        pointwise = fold_batch_norm(self.pointwise[0], self.pointwise[1])
        pad = dense.kernel_size[0] // 2
        dense.weight.add_(F.pad(pointwise.weight, (pad, pad, pad, pad)))
        dense.bias.add_(pointwise.bias)
        self.fused = dense
        del self.dense, self.pointwise


class RepNBottleneck(nn.Module):
    """``RepConvN`` 3×3 then ``ConvNormAct`` 3×3, with a residual when widths allow."""

    def __init__(self, in_channels: int, out_channels: int, *, shortcut: bool = True, expansion: float = 1.0) -> None:
        super().__init__()
        hidden = int(out_channels * expansion)
        self.rep_conv = RepConvN(in_channels, hidden, 3)
        self.conv = ConvNormAct(hidden, out_channels, 3)
        self.residual = shortcut and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the bottleneck."""
        y = self.conv(self.rep_conv(x))
        return x + y if self.residual else y


class RepNCSP(nn.Module):
    """CSP stage: ``repeats`` ``RepNBottleneck``s on one 1×1 projection, a second 1×1 projection
    bypassing them, and a 1×1 merge of both."""

    def __init__(self, in_channels: int, out_channels: int, repeats: int = 1, *, expansion: float = 0.5) -> None:
        super().__init__()
        hidden = int(out_channels * expansion)
        self.main = ConvNormAct(in_channels, hidden, 1)
        self.bypass = ConvNormAct(in_channels, hidden, 1)
        self.bottlenecks = nn.Sequential(*(RepNBottleneck(hidden, hidden) for _ in range(repeats)))
        self.merge = ConvNormAct(2 * hidden, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the stage."""
        return self.merge(torch.cat((self.bottlenecks(self.main(x)), self.bypass(x)), dim=1))


class _ELANAggregation(nn.Module):
    """Shared wiring of ``RepNCSPELAN4`` and ``ELAN1``: split, two chained branches, aggregate."""

    def __init__(self, in_channels: int, out_channels: int, split_channels: int, branch_channels: int) -> None:
        super().__init__()
        if split_channels % 2:
            raise ValueError(f"split_channels must be even (the 1×1 output is halved), got {split_channels}")
        self.split = ConvNormAct(in_channels, split_channels, 1)
        self.aggregate = ConvNormAct(split_channels + 2 * branch_channels, out_channels, 1)
        self.out_channels = out_channels
        self.first_branch: nn.Module
        self.second_branch: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        parts = list(self.split(x).chunk(2, dim=1))
        parts.append(self.first_branch(parts[-1]))
        parts.append(self.second_branch(parts[-1]))
        return self.aggregate(torch.cat(parts, dim=1))


class RepNCSPELAN4(_ELANAggregation):
    """GELAN's block: each of the two branches is ``RepNCSP(repeats)`` then a 3×3 conv.

    Arguments in the order of the YOLOv9 configs: ``(in, out, split_channels (c3),
    branch_channels (c4), repeats)``.
    """

    def __init__(self, in_channels: int, out_channels: int, split_channels: int, branch_channels: int, repeats: int = 1) -> None:
        super().__init__(in_channels, out_channels, split_channels, branch_channels)
        self.first_branch = nn.Sequential(
            RepNCSP(split_channels // 2, branch_channels, repeats), ConvNormAct(branch_channels, branch_channels, 3)
        )
        self.second_branch = nn.Sequential(
            RepNCSP(branch_channels, branch_channels, repeats), ConvNormAct(branch_channels, branch_channels, 3)
        )


class ELAN1(_ELANAggregation):
    """The light GELAN block of YOLOv9-T/S: each branch is a single 3×3 conv."""

    def __init__(self, in_channels: int, out_channels: int, split_channels: int, branch_channels: int) -> None:
        super().__init__(in_channels, out_channels, split_channels, branch_channels)
        self.first_branch = ConvNormAct(split_channels // 2, branch_channels, 3)
        self.second_branch = ConvNormAct(branch_channels, branch_channels, 3)


class AConv(nn.Module):
    """Downsample by 2: 2×2 average pool (stride 1) then a stride-2 3×3 conv."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = ConvNormAct(in_channels, out_channels, 3, 2, 1)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Halve the resolution of ``x``."""
        return self.conv(F.avg_pool2d(x, 2, 1, 0))


class ADown(nn.Module):
    """Downsample by 2: 2×2 average pool (stride 1), then half the channels through a stride-2 3×3
    conv and the other half through a 3×3 stride-2 max pool and a 1×1 conv, concatenated."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        if in_channels % 2 or out_channels % 2:
            raise ValueError(f"ADown splits channels in halves; got in_channels={in_channels}, out_channels={out_channels}")
        self.conv_path = ConvNormAct(in_channels // 2, out_channels // 2, 3, 2, 1)
        self.pool_path = ConvNormAct(in_channels // 2, out_channels // 2, 1, 1, 0)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Halve the resolution of ``x``."""
        conv_half, pool_half = F.avg_pool2d(x, 2, 1, 0).chunk(2, dim=1)
        return torch.cat((self.conv_path(conv_half), self.pool_path(F.max_pool2d(pool_half, 3, 2, 1))), dim=1)


class SPPELAN(nn.Module):
    """Spatial pyramid pooling, ELAN style: a 1×1 reduction, three chained 5×5 max pools (stride 1),
    and a 1×1 conv over the reduction and the three pooled maps."""

    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int, pool_size: int = 5) -> None:
        super().__init__()
        self.reduce = ConvNormAct(in_channels, hidden_channels, 1)
        self.pool = nn.MaxPool2d(pool_size, 1, pool_size // 2)
        self.aggregate = ConvNormAct(4 * hidden_channels, out_channels, 1)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the pyramid pooling."""
        parts = [self.reduce(x)]
        for _ in range(3):
            parts.append(self.pool(parts[-1]))
        return self.aggregate(torch.cat(parts, dim=1))


class CBLinear(nn.Module):
    """One biased 1×1 conv whose output is split into pieces of ``out_channels`` widths (PGI routing)."""

    def __init__(self, in_channels: int, out_channels: Sequence[int]) -> None:
        super().__init__()
        self.split_sizes = [int(width) for width in out_channels]
        self.conv = nn.Conv2d(in_channels, sum(self.split_sizes), 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The projected pieces, in the order of ``out_channels``."""
        return self.conv(x).split(self.split_sizes, dim=1)


class CBFuse(nn.Module):
    """Add routed pieces, resized (nearest) to the target's resolution, to the target (PGI fusion)."""

    def forward(self, pieces: Sequence[torch.Tensor], target: torch.Tensor) -> torch.Tensor:
        """``target + Σ resize(piece)``."""
        fused = target
        for piece in pieces:
            fused = fused + F.interpolate(piece, size=target.shape[2:], mode="nearest")
        return fused


@torch.no_grad()
def fuse_for_inference(model: nn.Module) -> nn.Module:
    """Merge every ``RepConvN`` and fold every ``ConvNormAct``'s BatchNorm into its conv, in place.

    For inference only (the folded statistics are frozen); returns ``model`` in eval mode.
    """
    model.eval()
    for module in list(model.modules()):
        if isinstance(module, RepConvN):
            module.fuse()
    for module in list(model.modules()):
        if isinstance(module, ConvNormAct):
            _fold_conv_norm_act(module)
    return model


# ----------------------------------------------------------------------------- the GELAN trunk
def _int_tuple(value: Any, length: int, key: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) != length or not all(isinstance(v, int) and v > 0 for v in value):
        raise ValueError(f"{where}: '{key}' must be a list of {length} positive integers, got {value!r}")
    return tuple(value)


def _int_tuples(value: Any, count: int, length: int, key: str, where: str) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, (list, tuple)) or len(value) != count:
        raise ValueError(f"{where}: '{key}' must be a list of {count} entries, got {value!r}")
    return tuple(_int_tuple(item, length, f"{key}[{index}]", where) for index, item in enumerate(value))


def _choice(value: Any, choices: Sequence[str], key: str, where: str) -> str:
    if value not in choices:
        raise ValueError(f"{where}: '{key}' must be one of {', '.join(choices)}, got {value!r}")
    return value


@dataclass(frozen=True)
class GELANSpec:
    """Widths and depths of one GELAN size (the ``config`` of a YOLOv9 family's registry entry).

    Blocks are ``(out, split, branch)``: RepNCSPELAN4/ELAN1 output, the width of the 1×1 split
    (``c3``) and of each branch (``c4``), in the order of the official YAML arguments. ``pgi``
    names the kind of PGI auxiliary branch the size trains with (YOLOv9's ``pgi=True`` option);
    a family without PGI leaves it out.
    """

    stem: tuple[int, ...]  # widths of the two stride-2 3×3 convs (P1, P2)
    p2_block: str  # "elan1" (T, S) or "rep_ncsp_elan4" (M, C)
    p2: tuple[int, ...]  # (out, split, branch) of the P2 block
    downsample: str  # "aconv" (T, S, M) or "adown" (C)
    repeats: int  # RepNBottlenecks in every RepNCSP
    backbone: tuple[tuple[int, ...], ...]  # per P3, P4, P5: (downsample width, out, split, branch)
    spp: tuple[int, ...]  # SPPELAN (out, hidden)
    neck_top_down: tuple[tuple[int, ...], ...]  # P4 then P3 block (out, split, branch)
    neck_bottom_up: tuple[tuple[int, ...], ...]  # P4 then P5: (downsample width, out, split, branch)
    pgi: str | None = None  # "auxiliary_neck" (T, S) or "reversible_backbone" (M, C); None: no PGI branch

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str = "GELAN config") -> "GELANSpec":
        """Validate a registry ``config`` mapping; errors name the key and the expected form."""
        allowed = set(cls.__dataclass_fields__)
        required = allowed - {"pgi"}
        unknown, missing = set(config) - allowed, required - set(config)
        if unknown or missing:
            raise ValueError(
                f"{where}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}; "
                f"expected {sorted(required)} and optionally 'pgi'"
            )
        repeats = config["repeats"]
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
            raise ValueError(f"{where}: 'repeats' must be a positive integer, got {repeats!r}")
        pgi = config.get("pgi")
        return cls(
            stem=_int_tuple(config["stem"], 2, "stem", where),
            p2_block=_choice(config["p2_block"], GELAN_P2_BLOCKS, "p2_block", where),
            p2=_int_tuple(config["p2"], 3, "p2", where),
            downsample=_choice(config["downsample"], GELAN_DOWNSAMPLERS, "downsample", where),
            repeats=repeats,
            backbone=_int_tuples(config["backbone"], 3, 4, "backbone", where),
            spp=_int_tuple(config["spp"], 2, "spp", where),
            neck_top_down=_int_tuples(config["neck_top_down"], 2, 3, "neck_top_down", where),
            neck_bottom_up=_int_tuples(config["neck_bottom_up"], 2, 4, "neck_bottom_up", where),
            pgi=None if pgi is None else _choice(pgi, GELAN_PGI_KINDS, "pgi", where),
        )


def _downsampler(kind: str, in_channels: int, out_channels: int) -> nn.Module:
    return AConv(in_channels, out_channels) if kind == "aconv" else ADown(in_channels, out_channels)


def _upsample(x: torch.Tensor) -> torch.Tensor:
    return F.interpolate(x, scale_factor=2.0, mode="nearest")


class GELANBackbone(nn.Module):
    """Stem, P2 block and three (downsample → RepNCSPELAN4) stages; returns the P3, P4, P5 maps.

    ``injectable=True`` builds PGI's auxiliary reversible backbone: after each downsample, routed
    features of the main backbone are added (CBFuse) before the stage's block.
    """

    def __init__(self, spec: GELANSpec, in_channels: int = 3, *, injectable: bool = False) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            ConvNormAct(in_channels, spec.stem[0], 3, 2), ConvNormAct(spec.stem[0], spec.stem[1], 3, 2)
        )
        if spec.p2_block == "elan1":
            self.p2_block: nn.Module = ELAN1(spec.stem[1], *spec.p2)
        else:
            self.p2_block = RepNCSPELAN4(spec.stem[1], *spec.p2, spec.repeats)
        width = spec.p2[0]
        self.downsamples, self.blocks = nn.ModuleList(), nn.ModuleList()
        self.out_channels: list[int] = []
        for down_width, out, split, branch in spec.backbone:
            self.downsamples.append(_downsampler(spec.downsample, width, down_width))
            self.blocks.append(RepNCSPELAN4(down_width, out, split, branch, spec.repeats))
            self.out_channels.append(out)
            width = out
        self.fuse_injection = CBFuse() if injectable else None

    def forward(self, images: torch.Tensor, injections: Sequence[Sequence[torch.Tensor]] | None = None) -> list[torch.Tensor]:
        """P3, P4, P5 feature maps of ``images`` (``injections[level]``: pieces to fuse at that level)."""
        x = self.p2_block(self.stem(images))
        levels = []
        for level, (downsample, block) in enumerate(zip(self.downsamples, self.blocks)):
            x = downsample(x)
            if injections is not None:
                if self.fuse_injection is None:
                    raise ValueError("this backbone was built without injectable=True; it cannot fuse routed features")
                x = self.fuse_injection(injections[level], x)
            x = block(x)
            levels.append(x)
        return levels


class GELANTopDownPath(nn.Module):
    """SPPELAN on P5, then upsample-concat-RepNCSPELAN4 into P4 and into P3.

    Returns ``(P3, P4, P5)``, P5 being the SPPELAN output. The neck's first half, and on its own
    (with its own weights) PGI's auxiliary branch of YOLOv9-T/S.
    """

    def __init__(self, spec: GELANSpec, backbone_channels: Sequence[int]) -> None:
        super().__init__()
        c3, c4, c5 = backbone_channels
        spp_out, spp_hidden = spec.spp
        (p4_out, p4_split, p4_branch), (p3_out, p3_split, p3_branch) = spec.neck_top_down
        self.spp = SPPELAN(c5, spp_out, spp_hidden)
        self.merge_p4 = RepNCSPELAN4(spp_out + c4, p4_out, p4_split, p4_branch, spec.repeats)
        self.merge_p3 = RepNCSPELAN4(p4_out + c3, p3_out, p3_split, p3_branch, spec.repeats)
        self.out_channels = [p3_out, p4_out, spp_out]

    def forward(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Top-down maps (P3, P4, P5) from backbone maps (P3, P4, P5)."""
        p3, p4, p5 = features
        top5 = self.spp(p5)
        top4 = self.merge_p4(torch.cat((_upsample(top5), p4), dim=1))
        top3 = self.merge_p3(torch.cat((_upsample(top4), p3), dim=1))
        return [top3, top4, top5]


class GELANNeck(nn.Module):
    """PAN neck: the top-down path, then downsample-concat-RepNCSPELAN4 back to P4 and P5."""

    def __init__(self, spec: GELANSpec, backbone_channels: Sequence[int]) -> None:
        super().__init__()
        self.top_down = GELANTopDownPath(spec, backbone_channels)
        t3, t4, t5 = self.top_down.out_channels
        (d4, p4_out, p4_split, p4_branch), (d5, p5_out, p5_split, p5_branch) = spec.neck_bottom_up
        self.down_p4 = _downsampler(spec.downsample, t3, d4)
        self.merge_p4 = RepNCSPELAN4(d4 + t4, p4_out, p4_split, p4_branch, spec.repeats)
        self.down_p5 = _downsampler(spec.downsample, p4_out, d5)
        self.merge_p5 = RepNCSPELAN4(d5 + t5, p5_out, p5_split, p5_branch, spec.repeats)
        self.out_channels = [t3, p4_out, p5_out]

    def forward(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Head inputs (P3, P4, P5) from backbone maps (P3, P4, P5)."""
        top3, top4, top5 = self.top_down(features)
        out4 = self.merge_p4(torch.cat((self.down_p4(top3), top4), dim=1))
        out5 = self.merge_p5(torch.cat((self.down_p5(out4), top5), dim=1))
        return [top3, out4, out5]
