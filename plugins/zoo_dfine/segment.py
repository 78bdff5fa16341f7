"""D-FINE-seg: D-FINE with a query-conditioned mask head (LibreYOLO 1.6.0's ``LibreDFINE{n,s,m,l,x}-seg``,
converted from ArgoSA/D-FINE-seg).

The detector of ``zoo_dfine.model`` (same sizes, same criterion) plus ``zoo_core.detr.mask_head``'s
``QueryMaskHead``: the encoder's maps (and, at N, whose encoder starts at stride 16, backbone stage 1
at stride 8) fused into stride-4 mask features; each decoder query's mask is its MLP embedding dotted
with them. Loss (``zoo_core.detr.mask_losses``): the detector's terms, plus box-cropped BCE and dice on
every decoder layer's masks (weights 1, 1), with mask focal and dice costs (1, 1) added to the
decoder layers' Hungarian matching. Assembly: ``zoo_core.detr.distribution_detr``.
"""

from __future__ import annotations

from zoo_core.building import BuildRequest
from zoo_core.detr.distribution_detr import build_segmenter_from_request
from zoo_core.detr.mask_losses import MaskLossConfig
from zoo_core.detr.segmenter import DETRSegmenter
from zoo_dfine.model import CRITERION

__all__ = ["MASKS", "build_dfine_seg"]

#: LibreYOLO 1.6.0's DFINEConfig: mask_bce_loss_weight, mask_dice_loss_weight, mask_match_cost, mask_dice_match_cost = 1.
MASKS = MaskLossConfig(weight_bce=1.0, weight_dice=1.0, cost_mask=1.0, cost_dice=1.0)


def build_dfine_seg(request: BuildRequest) -> DETRSegmenter:
    """The registry builder of ``dfine_seg``. Options ``num_queries`` (default 300), ``num_denoising`` (default 100)."""
    return build_segmenter_from_request(request, CRITERION, MASKS)
