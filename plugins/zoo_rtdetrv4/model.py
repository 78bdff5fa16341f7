"""RT-DETRv4 (Liao et al., "RT-DETRv4: Painlessly Furthering Real-Time Object Detection with Vision Foundation Models", 2025).

The DEIM/D-FINE student detectors (HGNetV2 B0/B2/B4/B5 → ELAN hybrid encoder → FDR decoder,
SiLU), trained with the DEIM criterion; the published recipe also distils a DINOv3 teacher into
the encoder through a training-only feature projector (LibreYOLO drops it; not built here).
Everything but the criterion is ``zoo_core.detr.distribution_detr``.
"""

from __future__ import annotations

from zoo_core.building import BuildRequest
from zoo_core.detr.criterion import CriterionConfig
from zoo_core.detr.detector import DETRDetector
from zoo_core.detr.distribution_detr import build_from_request

__all__ = ["CRITERION", "build_rtdetrv4"]

#: The published criterion: the DEIM criterion (MAL γ 1.5, L1 5, GIoU 2, FGL 0.15, DDF 1.5, GO-LSD union).
CRITERION = CriterionConfig(classification="mal", gamma=1.5, mal_alpha=None, go_union=True)


def build_rtdetrv4(request: BuildRequest) -> DETRDetector:
    """The registry builder of ``rtdetrv4``. Options ``num_queries`` (default 300), ``num_denoising`` (default 100)."""
    return build_from_request(request, CRITERION)
