"""ConvNeXt V2 weights in the official layout (facebookresearch/ConvNeXt-V2), which LibreYOLO 1.6 uses.

zoo builds ConvNeXt V2 with timm. The official names keep the downsampling layers apart
(``downsample_layers.<stage>``), store the MLP as linear layers (timm's atto to nano use 1×1
convolutions) and GRN's parameters as ``1×1×1×C`` (timm: ``C``); the final norm and classifier
are ``norm`` and ``head`` (timm: ``head.norm``, ``head.fc``). Official release files hold the
state dict under ``model``, which the recognising code unwraps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from zoo_core.building import ConvertedWeights
from zoo_core.key_renaming import KeyRenamer

if TYPE_CHECKING:
    import torch

__all__ = ["OFFICIAL_KEYS", "convert"]

_STAGES = 4
# The sizes timm builds with convolutional MLPs (conv_mlp=True).
_CONVOLUTIONAL_MLP_SIZES = frozenset({"atto", "femto", "pico", "n"})
OFFICIAL_KEYS = KeyRenamer([
    ("^downsample_layers.0.", "^stem."),
    *[(f"^downsample_layers.{stage}.", f"^stages.{stage}.downsample.") for stage in range(1, _STAGES)],
    ("^stages.{i}.{j}.", "^stages.{i}.blocks.{j}."),
    (".dwconv.", ".conv_dw."),
    (".pwconv1.", ".mlp.fc1."),
    (".pwconv2.", ".mlp.fc2."),
    (".grn.gamma$", ".mlp.grn.weight$"),
    (".grn.beta$", ".mlp.grn.bias$"),
    ("^head.", "^head.fc."),  # before "norm": the final norm joins the head in timm
    ("^norm.", "^head.norm."),
])


def convert(size: str, state_dict: Mapping[str, "torch.Tensor"], source: str, target: str) -> ConvertedWeights | None:
    """The registry ``converter`` of convnextv2: the official (= LibreYOLO) layout, both ways."""
    official = ("libreyolo", "upstream")
    if source in official and target == "zoo":
        converted = {}
        for key, value in OFFICIAL_KEYS.to_zoo(state_dict).items():
            if key.endswith((".mlp.grn.weight", ".mlp.grn.bias")):
                value = value.flatten()
            elif size in _CONVOLUTIONAL_MLP_SIZES and key.endswith((".mlp.fc1.weight", ".mlp.fc2.weight")):
                value = value[:, :, None, None]
            converted[key] = value
        return ConvertedWeights(converted)
    if source == "zoo" and target in official:
        converted = {}
        for key, value in OFFICIAL_KEYS.from_zoo(state_dict).items():
            if key.endswith((".grn.gamma", ".grn.beta")):
                value = value.reshape(1, 1, 1, -1)
            elif key.endswith((".pwconv1.weight", ".pwconv2.weight")) and value.dim() == 4:
                value = value.flatten(1)
            converted[key] = value
        return ConvertedWeights(converted)
    return None
