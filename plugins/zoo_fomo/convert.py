"""State-dict conversion between LibreYOLO 1.6.0's FOMO (``LibreFOMOModel``) and zoo's ``fomo``.

LibreYOLO names the MobileNetV2 layers after Keras (``backbone.block_3.conv.1.0.conv.weight``:
block 3, its second layer (depthwise), the padded conv inside); zoo names them by role
(``backbone.blocks.3.depthwise.0.weight``). Block 0 (``expanded_conv``) has no expansion layer,
so its layers are numbered one lower. No tensor is dropped or created. Edge Impulse publishes
Keras/TFLite models only, so there is no ``upstream`` PyTorch layout.
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

__all__ = ["from_libreyolo", "to_libreyolo", "convert"]

_NORM = r"(weight|bias|running_mean|running_var|num_batches_tracked)"
_ROLES_WITH_EXPANSION = ("expand", "depthwise", "project")
_ROLES_WITHOUT_EXPANSION = ("depthwise", "project")


def _libre_to_zoo(key: str) -> str:
    if key in ("head.weight", "head.bias"):
        return key
    match = re.fullmatch(r"backbone\.(conv1|block_6_expand)\.(0\.conv\.weight|1\." + _NORM + ")", key)
    if match:
        module = "stem" if match.group(1) == "conv1" else "cut"
        return f"backbone.{module}." + ("0.weight" if match.group(2) == "0.conv.weight" else match.group(2))
    match = re.fullmatch(r"backbone\.(expanded_conv|block_(\d+))\.conv\.(\d)\.(0\.conv\.weight|0\.weight|1\." + _NORM + ")", key)
    if match:
        block = 0 if match.group(1) == "expanded_conv" else int(match.group(2))
        roles = _ROLES_WITHOUT_EXPANSION if block == 0 else _ROLES_WITH_EXPANSION
        layer, tensor = int(match.group(3)), match.group(4)
        if (block == 0) == (match.group(1) == "expanded_conv") and block <= 5 and layer < len(roles):
            role = roles[layer]
            conv_key = "0.weight" if role == "project" else "0.conv.weight"  # LibreYOLO's projection is unpadded
            if tensor == conv_key:
                return f"backbone.blocks.{block}.{role}.0.weight"
            if tensor.startswith("1."):
                return f"backbone.blocks.{block}.{role}.{tensor}"
    raise KeyError(f"key {key!r} matches no FOMO layer (LibreYOLO naming)")


def _zoo_to_libre(key: str) -> str:
    if key in ("head.weight", "head.bias"):
        return key
    match = re.fullmatch(r"backbone\.(stem|cut)\.(0\.weight|1\." + _NORM + ")", key)
    if match:
        module = "conv1" if match.group(1) == "stem" else "block_6_expand"
        return f"backbone.{module}." + ("0.conv.weight" if match.group(2) == "0.weight" else match.group(2))
    match = re.fullmatch(r"backbone\.blocks\.(\d+)\.(expand|depthwise|project)\.(0\.weight|1\." + _NORM + ")", key)
    if match:
        block, role, tensor = int(match.group(1)), match.group(2), match.group(3)
        roles = _ROLES_WITHOUT_EXPANSION if block == 0 else _ROLES_WITH_EXPANSION
        if role in roles:
            module = "expanded_conv" if block == 0 else f"block_{block}"
            if tensor == "0.weight":
                tensor = "0.weight" if role == "project" else "0.conv.weight"  # LibreYOLO's projection is unpadded
            return f"backbone.{module}.conv.{roles.index(role)}.{tensor}"
    raise KeyError(f"key {key!r} matches no FOMO layer (zoo naming)")


def from_libreyolo(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO FOMO state dict (``module.`` prefixes allowed) in zoo's keys."""
    return {_libre_to_zoo(key.removeprefix("module.")): value for key, value in state_dict.items()}


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A zoo ``fomo`` state dict in LibreYOLO 1.6.0's keys (``size`` only for the common signature)."""
    del size
    return {_zoo_to_libre(key): value for key, value in state_dict.items()}


def convert(size: str, state_dict: Mapping[str, torch.Tensor], source: str, target: str) -> dict[str, torch.Tensor] | None:
    """The registry ``converter`` of fomo: ``libreyolo`` files to zoo and zoo to ``libreyolo``;
    None for other layouts (Edge Impulse publishes no PyTorch one) or keys that are not LibreYOLO's."""
    if source == "zoo" and target == "libreyolo":
        return to_libreyolo(size, state_dict)
    if target != "zoo" or source != "libreyolo":
        return None
    try:
        return from_libreyolo(state_dict)
    except KeyError:  # not this layout (e.g. a file already in zoo's keys)
        return None
