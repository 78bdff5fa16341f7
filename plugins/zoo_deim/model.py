"""DEIM (Huang et al., "DEIM: DETR with Improved Matching for Fast Convergence", CVPR 2025, arXiv:2412.04234).

The D-FINE model (HGNetV2 B0/B0/B2/B4/B5 → ELAN hybrid encoder → FDR decoder) with SiLU in the
decoder and its MLPs (DEIM's configs), trained with dense one-to-one matching (more targets
per image through mosaic/mixup: a data recipe, phase 2) and the matchability-aware loss (MAL)
in place of VFL. Everything but the criterion is ``zoo_core.detr.distribution_detr``.
"""

from __future__ import annotations

from zoo_core.building import BuildRequest
from zoo_core.detr.criterion import CriterionConfig
from zoo_core.detr.detector import DETRDetector
from zoo_core.detr.distribution_detr import build_from_request

__all__ = ["CRITERION", "build_deim"]

#: The published criterion: MAL (γ 1.5) 1, L1 5, GIoU 2, FGL 0.15, DDF 1.5 with the GO-LSD match union; matcher costs 2/5/2 (focal α 0.25, γ 2).
CRITERION = CriterionConfig(classification="mal", gamma=1.5, mal_alpha=None, go_union=True)


def build_deim(request: BuildRequest) -> DETRDetector:
    """The registry builder of ``deim``. Options ``num_queries`` (default 300), ``num_denoising`` (default 100)."""
    return build_from_request(request, CRITERION)
