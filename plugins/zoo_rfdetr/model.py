"""RF-DETR (Robinson et al., "RF-DETR: Neural Architecture Search for Real-Time Detection Transformers",
arXiv:2511.09554; roboflow/rf-detr, Apache-2.0): sizes N, S, M, L.

Windowed DINOv2 ViT-S/16 (``zoo_rfdetr.backbone``) → LW-DETR P4 projector → LW-DETR decoder with
two-stage queries and 13 Group DETR groups (``zoo_rfdetr.decoder``) → IA-BCE + L1 + GIoU with
per-group Hungarian matching (``zoo_rfdetr.criterion``). LayerNorm only: no BatchNorm anywhere.

The sizes differ in resolution (384, 512, 576, 704), the position-embedding grid (resolution / 16)
and decoder depth (2, 3, 4, 4); everything else is shared (hidden 256, 300 queries, 8 self- and 16
cross-attention heads, 2 sampling points, feed-forward 2048).

Registry ``config``: ``{position_grid, decoder_layers}`` (+ optional ``windows``, ``queries``, ``groups``).
Build options: ``num_queries`` (fewer queries for tiny inputs and quick tests).
"""

from __future__ import annotations

from typing import Any

import torch

from zoo_core.building import BuildRequest
from zoo_core.detr.detector import DETRDetector
from zoo_rfdetr.backbone import ProjectorC2f, WindowedDINOv2
from zoo_rfdetr.criterion import RFDETRCriterion
from zoo_rfdetr.decoder import LWDETRDecoder

__all__ = ["RFDETRDetector", "build_rfdetr", "BUILD_OPTIONS", "PATCH_SIZE"]

BUILD_OPTIONS = ("num_queries",)
PATCH_SIZE, HIDDEN, GROUPS, NUM_QUERIES = 16, 256, 13, 300


class RFDETRDetector(DETRDetector):
    """``DETRDetector`` whose scores leave out RF-DETR's extra class logit and whose tokens are stride 16."""

    def forward(self, images: torch.Tensor, targets: Any = None) -> dict[str, Any]:
        outputs = super().forward(images, targets)
        if not self.training:
            outputs["scores"] = outputs["scores"][..., : self.num_classes]
        return outputs

    @property
    def minimum_input_size(self) -> int:
        """The smallest multiple of ``size_multiple`` whose stride-16 tokens cover the queries."""
        side = self.size_multiple
        while (side // PATCH_SIZE) ** 2 < self.decoder.num_queries:
            side += self.size_multiple
        return side


def build_rfdetr(request: BuildRequest) -> RFDETRDetector:
    """The registry builder of ``rfdetr``."""
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"rfdetr does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    config = request.config
    windows = int(config.get("windows", 2))
    backbone = WindowedDINOv2(int(config["position_grid"]), windows, patch_size=PATCH_SIZE)
    projector = ProjectorC2f(sum(backbone.out_channels), HIDDEN)
    queries = int(request.options.get("num_queries", config.get("queries", NUM_QUERIES)))
    decoder = LWDETRDecoder(request.num_classes, HIDDEN, queries, int(config["decoder_layers"]), groups=int(config.get("groups", GROUPS)))
    return RFDETRDetector(backbone, projector, decoder, RFDETRCriterion(request.num_classes), size_multiple=PATCH_SIZE * windows)
