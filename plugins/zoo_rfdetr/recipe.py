"""RF-DETR's published training recipe (roboflow/rf-detr ``TrainConfig`` / ``get_param_dict``; LibreYOLO 1.6's
``_make_args`` holds the same numbers).

The data-only values (AdamW lr 1e-4, weight decay 1e-4, 100 epochs with the step at epoch 100, no
warm-up, batch 4 × 4 accumulation, EMA 0.993 with a 100-step ramp, clip 0.1, flips and random
resizing, no mosaic) are the registry's ``train_defaults``. This class adds:

- **layer-wise learning rates** (``parameter_groups``): DINOv2 parameters learn at
  ``lr_encoder / lr · 0.8^(14 − layer) · 0.7²`` of the base rate (``lr_encoder`` 1.5e-4,
  ``lr_vit_layer_decay`` 0.8, ``lr_component_decay`` 0.7; layer 0 = the embeddings, block ``k``
  = layer ``k + 1``, the final norm = 14), the decoder's transformer (layers, output norm, query
  position MLP) at ``0.7``, everything else at 1. Weight decay as published: DINOv2 biases,
  norms and embeddings none; every other parameter (the heads' biases and norms included) decays;
- the DETR training step (targets reach ``forward``): ``zoo_core.recipes.detr.DETRStepRecipe``, not
  the DETR line's whole ``DETRRecipe``, whose multi-scale sizes and stop epoch RF-DETR does not use;
- multi-scale training (the registry's ``multi_scale: true``; RF-DETR's ``multi_scale`` with
  ``expanded_scales``): each batch at ``(imgsz // 32 + k) · 32`` px for k from -5 to 5, never
  below two windows of patches (64 px); RF-DETR never stops its augmentation (``close_mosaic`` 0);
- ``size_multiple`` 32: the patch (16) times the windows per side (2). Unlike the original
  RF-DETR-B (patch 14, 4 windows, 560 px) the N-L sizes need multiples of 32, not of 14.
"""

from __future__ import annotations

import re

from torch import nn

from zoo_core.recipes.detr import DETRStepRecipe
from zoo_core.engine.optim import ParameterGroup

__all__ = ["RFDETRRecipe", "encoder_layer_scale"]

LR_ENCODER_RATIO = 1.5e-4 / 1e-4
LAYER_DECAY, COMPONENT_DECAY, DEPTH = 0.8, 0.7, 12
_DECODER_TRANSFORMER = ("decoder.layers.", "decoder.norm.", "decoder.query_position.")


def encoder_layer_scale(name: str) -> float:
    """The learning-rate multiplier of a backbone parameter ``backbone.*`` (RF-DETR's layer decay)."""
    top = DEPTH + 1  # RF-DETR: out_feature_indexes[-1] + 1
    block = re.match(r"backbone\.vit\.blocks\.(\d+)\.", name)
    if block:
        layer = int(block.group(1)) + 1
    elif name.startswith(("backbone.vit.patch_embed.", "backbone.vit.cls_token", "backbone.vit.pos_embed", "backbone.mask_token")):
        layer = 0
    else:
        layer = top + 1
    return LR_ENCODER_RATIO * LAYER_DECAY ** (top + 1 - layer) * COMPONENT_DECAY**2


class RFDETRRecipe(DETRStepRecipe):
    """See the module docstring."""

    size_multiple = 32

    def multi_scale_sizes(self, image_size: int) -> tuple[int, ...]:
        """RF-DETR's expanded scales: ``image_size // 32 + k`` windows of patches for k in -5..5, at least 2."""
        divisor = self.size_multiple
        return tuple(size for offset in range(-5, 6) if (size := (image_size // divisor + offset) * divisor) >= 2 * divisor)

    def parameter_groups(self, model: nn.Module, config) -> list[ParameterGroup]:
        groups: dict[tuple[float, str], ParameterGroup] = {}
        for name, parameter in model.named_parameters():
            if not parameter.requires_grad:
                continue
            if name.startswith("backbone."):
                scale = encoder_layer_scale(name)
                quiet = parameter.ndim <= 1 and ".ls" not in name or "embed" in name or name.endswith(("cls_token", "mask_token"))
                kind = "bias" if name.endswith(".bias") else ("no_decay" if quiet else "decay")
            else:
                scale = COMPONENT_DECAY if name.startswith(_DECODER_TRANSFORMER) else 1.0
                kind = "decay"  # RF-DETR decays every head parameter, biases and norms included
            key = (scale, kind)
            if key not in groups:
                groups[key] = ParameterGroup(name=f"{kind}@x{scale:.6g}", kind=kind, lr_scale=scale)
            groups[key].params.append(parameter)
        return sorted(groups.values(), key=lambda group: (-group.lr_scale, group.kind))
