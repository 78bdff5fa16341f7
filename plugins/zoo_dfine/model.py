"""D-FINE (Peng et al., "D-FINE: Redefine Regression Task in DETRs as Fine-grained Distribution Refinement", ICLR 2025, arXiv:2410.13842).

HGNetV2 B0/B0/B2/B4/B5 backbone (N, S, M, L, X) → hybrid encoder with ELAN fusion blocks →
D-FINE decoder (fine-grained distribution refinement, LQE, gated cross-attention; ReLU). The
loss adds FGL and DDF (GO-LSD self-distillation) to VFL + L1 + GIoU. Everything but the
criterion is ``zoo_core.detr.distribution_detr``; sizes are registry data.
"""

from __future__ import annotations

from zoo_core.building import BuildRequest
from zoo_core.detr.criterion import CriterionConfig
from zoo_core.detr.detector import DETRDetector
from zoo_core.detr.distribution_detr import build_from_request

__all__ = ["CRITERION", "build_dfine"]

#: The published criterion: VFL (α 0.75, γ 2) 1, L1 5, GIoU 2, FGL 0.15, DDF 1.5 with the GO-LSD match union; matcher costs 2/5/2 (focal α 0.25, γ 2).
CRITERION = CriterionConfig(classification="vfl", alpha=0.75, gamma=2.0, go_union=True)


def build_dfine(request: BuildRequest) -> DETRDetector:
    """The registry builder of ``dfine``. Options ``num_queries`` (default 300), ``num_denoising`` (default 100)."""
    return build_from_request(request, CRITERION)
