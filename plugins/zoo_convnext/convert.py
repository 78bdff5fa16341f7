"""ConvNeXt weights in torchvision's layout (``torchvision.models.convnext_*``), both ways.

zoo builds ConvNeXt with timm, whose keys LibreYOLO 1.6 also uses, so LibreYOLO and timm files
load as they are. torchvision numbers its stages inside ``features`` (even entries downsample,
odd ones hold the blocks), names a block's layers by position and keeps the layer scale as
``C×1×1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from zoo_core.building import ConvertedWeights
from zoo_core.key_renaming import KeyRenamer

if TYPE_CHECKING:
    import torch

__all__ = ["TORCHVISION_KEYS", "convert"]

_STAGES = 4
TORCHVISION_KEYS = KeyRenamer([
    ("^features.0.", "^stem."),
    *[(f"^features.{2 * stage + 1}.", f"^stages.{stage}.blocks.") for stage in range(_STAGES)],
    *[(f"^features.{2 * stage}.", f"^stages.{stage}.downsample.") for stage in range(1, _STAGES)],
    (".block.0.", ".conv_dw."),
    (".block.2.", ".norm."),
    (".block.3.", ".mlp.fc1."),
    (".block.5.", ".mlp.fc2."),
    (".layer_scale$", ".gamma$"),
    ("^classifier.0.", "^head.norm."),
    ("^classifier.2.", "^head.fc."),
])


def convert(size: str, state_dict: Mapping[str, "torch.Tensor"], source: str, target: str) -> ConvertedWeights | None:
    """The registry ``converter`` of convnext: torchvision's layout, both ways (None otherwise)."""
    del size  # one key layout serves every size
    if source == "torchvision" and target == "zoo":
        renamed = TORCHVISION_KEYS.to_zoo(state_dict)
        return ConvertedWeights({key: value.flatten() if key.endswith(".gamma") else value for key, value in renamed.items()})
    if source == "zoo" and target == "torchvision":
        renamed = TORCHVISION_KEYS.from_zoo(state_dict)
        return ConvertedWeights({key: value.reshape(-1, 1, 1) if key.endswith(".layer_scale") else value
                                 for key, value in renamed.items()})
    return None
