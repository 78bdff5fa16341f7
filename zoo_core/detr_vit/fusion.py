"""Cross-scale fusion blocks of the DEIMv2 and EdgeCrafter hybrid encoders.

Both families run ``zoo_core.detr.hybrid_encoder.HybridEncoder`` (AIFI on the coarsest map, then a
top-down and a bottom-up path) with two changes to D-FINE's CCFM (their ``csp_type: csp2`` and
``fuse_op: sum``):

- ``SplitCSPBlock`` (the "CSPLayer2" of their code, YOLO's RepC3): a single 1×1 conv-BN-act with
  twice the output width, split in two halves; the second half goes through ``n`` RepVGG blocks and
  is added to the first;
- ``SplitELANBlock``: D-FINE's ELAN block built from ``SplitCSPBlock`` stages, each stage followed
  by a 3×3 conv (``stage_conv=True``: DEIMv2-N and the LiteEncoder of Atto–Pico) or not (DEIMv2
  S–X, ECDet);
- the upsampled (or downsampled) map and the lateral map are **summed**, so a fusion block takes
  ``hidden`` channels, not ``2·hidden``. ``HybridEncoder`` concatenates the two maps before calling
  its block; ``SplitELANBlock(summed_input=True)`` adds the two halves back first (same numbers,
  one extra copy of a map per fusion; see NOTES for the proposed ``fuse="sum"`` core option).

``vit_hybrid_encoder`` assembles the encoder; input projections exist only where a level's
channels differ from ``hidden_dim`` (the DINOv3 adapters and ECViT projectors already emit it).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from zoo_core.detr.fusion_blocks import RepConvBlock, SeparableDownsample, conv_bn
from zoo_core.detr.hybrid_encoder import CrossScaleFusion, HybridEncoder

__all__ = ["SplitCSPBlock", "SplitELANBlock", "summed_split_elan_fusion", "vit_hybrid_encoder"]


class SplitCSPBlock(nn.Module):
    """``a + blocks(b)`` where ``(a, b)`` are the halves of a 1×1 conv to ``2·out_channels``."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int = 3, activation: str = "silu") -> None:
        super().__init__()
        self.entry = conv_bn(in_channels, 2 * out_channels, activation=activation)
        self.blocks = nn.Sequential(*(RepConvBlock(out_channels, out_channels, activation) for _ in range(num_blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept, transformed = self.entry(x).chunk(2, dim=1)
        return kept + self.blocks(transformed)


class SplitELANBlock(nn.Module):
    """ELAN with ``SplitCSPBlock`` stages.

    Args:
        in_channels, out_channels: widths of the block (``in_channels`` after the optional sum).
        split_channels: width of the entry 1×1 conv, split into two equal halves.
        stage_channels: width of each of the two stages.
        num_blocks: RepVGG blocks per stage.
        stage_conv: a 3×3 conv-BN-act after each stage.
        summed_input: the input is two maps concatenated on channels; they are added first.
    """

    def __init__(
        self, in_channels: int, out_channels: int, split_channels: int, stage_channels: int, num_blocks: int = 3,
        activation: str = "silu", *, stage_conv: bool = False, summed_input: bool = False,
    ) -> None:
        super().__init__()
        self.half = split_channels // 2
        self.summed_input = summed_input
        self.entry = conv_bn(in_channels, split_channels, activation=activation)

        def stage(width_in: int) -> nn.Sequential:
            parts: list[nn.Module] = [SplitCSPBlock(width_in, stage_channels, num_blocks, activation)]
            if stage_conv:
                parts.append(conv_bn(stage_channels, stage_channels, 3, activation=activation))
            return nn.Sequential(*parts)

        self.stage1 = stage(self.half)
        self.stage2 = stage(stage_channels)
        self.merge = conv_bn(split_channels + 2 * stage_channels, out_channels, activation=activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.summed_input:
            upper, lower = x.chunk(2, dim=1)
            x = upper + lower
        first, second = self.entry(x).split((self.half, self.half), dim=1)
        third = self.stage1(second)
        fourth = self.stage2(third)
        return self.merge(torch.cat([first, second, third, fourth], dim=1))


def summed_split_elan_fusion(expansion: float, depth_mult: float, activation: str = "silu", *, stage_conv: bool = False) -> CrossScaleFusion:
    """The CCFM blocks: linear 1×1 laterals, SCDown downsampling, summed inputs into ``SplitELANBlock``."""
    blocks = round(3 * depth_mult)
    return CrossScaleFusion(
        lateral=lambda hidden: conv_bn(hidden, hidden, 1),
        block=lambda hidden: SplitELANBlock(
            hidden, hidden, 2 * hidden, round(expansion * hidden // 2), blocks, activation, stage_conv=stage_conv, summed_input=True
        ),
        downsample=lambda hidden: SeparableDownsample(hidden, hidden, 3, 2),
    )


def vit_hybrid_encoder(
    in_channels: Sequence[int],
    hidden_dim: int,
    *,
    ffn_dim: int,
    expansion: float,
    depth_mult: float,
    aifi_activation: str = "gelu",
    activation: str = "silu",
    stage_conv: bool = False,
    num_heads: int = 8,
) -> HybridEncoder:
    """``HybridEncoder`` with summed split-ELAN fusion; identity input projections where channels match."""
    encoder = HybridEncoder(
        in_channels, hidden_dim, summed_split_elan_fusion(expansion, depth_mult, activation, stage_conv=stage_conv),
        num_heads=num_heads, ffn_dim=ffn_dim, activation=aifi_activation,
    )
    for index, channels in enumerate(in_channels):
        if channels == hidden_dim:
            encoder.input_projections[index] = nn.Identity()
    return encoder
