"""UNet weights in LibreYOLO 1.6's layout (``LibreUNet``, MMSegmentation's names), both ways.

The graph is the same; LibreYOLO normalises the input inside the model (ImageNet statistics on
the 0-255 scale, the same affine map zoo's semantic task applies outside it) and numbers its
decoder stages from the deepest (``decoder.3`` is zoo's ``decoder.0``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from zoo_core.building import ConvertedWeights
from zoo_core.key_renaming import KeyRenamer

if TYPE_CHECKING:
    import torch

__all__ = ["LIBREYOLO_KEYS", "convert"]

_DECODER_STAGES = 4
LIBREYOLO_KEYS = KeyRenamer([
    (".conv.weight$", ".0.weight$"),
    *[(f".bn.{name}$", f".1.{name}$") for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")],
    ("^backbone.encoder.0.0.convs.", "^backbone.encoder.0."),
    *[(f"^backbone.encoder.{stage}.1.convs.", f"^backbone.encoder.{stage}.1.") for stage in range(1, 5)],
    *[(f"^backbone.decoder.{stage}.", f"^backbone.zoo_decoder.{_DECODER_STAGES - 1 - stage}.") for stage in range(_DECODER_STAGES)],
    ("^backbone.zoo_decoder.{d}.upsample.interp_upsample.1.", "^backbone.zoo_decoder.{d}.upsample.conv."),
    ("^backbone.zoo_decoder.{d}.conv_block.convs.", "^backbone.zoo_decoder.{d}.fuse."),
    ("^backbone.zoo_decoder.", "^backbone.decoder."),
    (".conv_seg.", ".classifier."),
    ("^auxiliary_head.", "^aux_head."),
])


def convert(size: str, state_dict: Mapping[str, "torch.Tensor"], source: str, target: str) -> ConvertedWeights | None:
    """The registry ``converter`` of unet; None for layouts other than LibreYOLO's."""
    del size  # one key layout serves every size
    if source == "libreyolo" and target == "zoo":
        return ConvertedWeights(LIBREYOLO_KEYS.to_zoo(state_dict))
    if source == "zoo" and target == "libreyolo":
        return ConvertedWeights(LIBREYOLO_KEYS.from_zoo(state_dict))
    return None
