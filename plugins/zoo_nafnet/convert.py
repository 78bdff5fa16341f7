"""NAFNet weights in the official release's layout (megvii-research/NAFNet), which LibreYOLO 1.6 uses too.

The official ``.pth`` files hold BasicSR's ``{"params": ...}`` (or ``params_ema``); the
recognising code unwraps them, and this module renames the block internals both ways
(``norm1``/``conv1``/``sca.1`` ... to zoo's ``mixer_*``/``ffn_*``). The block layout is read
from the tensors: a file named for ``s`` whose blocks are SIDD's ``[2, 2, 4, 8] / 12 / [2, 2, 2, 2]``
loads as ``s_sidd`` (LibreYOLO names both layouts ``s`` and tells them apart the same way).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Mapping

from zoo_core.building import ConvertedWeights
from zoo_core.key_renaming import KeyRenamer

if TYPE_CHECKING:
    import torch

__all__ = ["OFFICIAL_KEYS", "convert", "layout_of"]

OFFICIAL_KEYS = KeyRenamer([
    ("^downs.", "^downsamples."),
    ("^ups.", "^upsamples."),
    ("^middle_blks.", "^middle."),
    (".norm1.", ".mixer_norm."),
    (".conv1.", ".mixer_expand."),
    (".conv2.", ".mixer_depthwise."),
    (".sca.1.", ".mixer_attention.project."),
    (".conv3.", ".mixer_project."),
    (".norm2.", ".ffn_norm."),
    (".conv4.", ".ffn_expand."),
    (".conv5.", ".ffn_project."),
])
# (width, encoder blocks, middle blocks, decoder blocks) -> zoo size; LibreYOLO's size names in brackets.
_LAYOUTS = {
    (32, (1, 1, 1, 28), 1, (1, 1, 1, 1)): ("s", "s"),
    (64, (1, 1, 1, 28), 1, (1, 1, 1, 1)): ("l", "l"),
    (32, (2, 2, 4, 8), 12, (2, 2, 2, 2)): ("s_sidd", "s"),
    (64, (2, 2, 4, 8), 12, (2, 2, 2, 2)): ("l_sidd", "l"),
}
_BLOCK = re.compile(r"^(encoders|decoders)\.(\d+)\.(\d+)\.beta$|^(middle_blks|middle)\.(\d+)\.beta$")


def layout_of(state_dict: Mapping[str, "torch.Tensor"]) -> tuple[int, tuple[int, ...], int, tuple[int, ...]] | None:
    """``(width, encoder blocks per level, middle blocks, decoder blocks per level)`` read from the tensors."""
    intro = state_dict.get("intro.weight")
    if intro is None:
        return None
    encoders: dict[int, int] = {}
    decoders: dict[int, int] = {}
    middle = 0
    for key in state_dict:
        match = _BLOCK.match(key)
        if match is None:
            continue
        if match.group(1) == "encoders":
            encoders[int(match.group(2))] = encoders.get(int(match.group(2)), 0) + 1
        elif match.group(1) == "decoders":
            decoders[int(match.group(2))] = decoders.get(int(match.group(2)), 0) + 1
        else:
            middle += 1
    return (int(intro.shape[0]), tuple(encoders[level] for level in sorted(encoders)), middle,
            tuple(decoders[level] for level in sorted(decoders)))


def convert(size: str, state_dict: Mapping[str, "torch.Tensor"], source: str, target: str) -> ConvertedWeights | None:
    """The registry ``converter`` of nafnet (the ``libreyolo`` and ``upstream`` layouts are one).

    ``size`` is not needed: the file's block layout decides the size (``ConvertedWeights.size``).
    """
    del size
    if source in ("libreyolo", "upstream") and target == "zoo":
        layout = _LAYOUTS.get(layout_of(state_dict))  # type: ignore[arg-type]
        return ConvertedWeights(OFFICIAL_KEYS.to_zoo(state_dict), size=layout[0] if layout else None)
    if source == "zoo" and target in ("libreyolo", "upstream"):
        layout = _LAYOUTS.get(layout_of(state_dict))  # type: ignore[arg-type]
        return ConvertedWeights(OFFICIAL_KEYS.from_zoo(state_dict), size=layout[1] if layout else None)
    return None
