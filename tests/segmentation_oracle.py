"""Helpers of the SegFormer and PP-LiteSeg tests: zoo and LibreYOLO networks of one size, and their logit difference."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.tasks.classify import imagenet_normalise

__all__ = ["build", "libreyolo_net", "randomise_normalisation", "normalised", "oracle_max_difference"]


def build(family: str, size: str, num_classes: int, **options: Any) -> nn.Module:
    """The zoo model of ``family``-``size`` through the plugin manager (registry config + ``options``)."""
    return get_plugin_manager().build_model(family, size, num_classes, options)


def libreyolo_net(family: str, size: str, num_classes: int) -> nn.Module:
    """LibreYOLO 1.6's network of ``family``-``size`` at random initialisation (no download)."""
    if family == "segformer":
        from libreyolo.models.segformer.nn import LibreSegformerNet

        return LibreSegformerNet(size=size, num_classes=num_classes)
    from libreyolo.models.ppliteseg.nn import LibrePPLiteSegNet

    return LibrePPLiteSegNet(size=size, num_classes=num_classes, use_aux_heads=True)


@torch.no_grad()
def randomise_normalisation(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm/LayerNorm non-trivial statistics and affine parameters.

    A fresh network has BN running statistics 0/1 and unit affine parameters, which would let a
    converter that swaps or drops norm tensors pass an output comparison; this makes them matter.
    """
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.BatchNorm2d, nn.LayerNorm)):
            shape = module.weight.shape
            module.weight.copy_(0.5 + torch.rand(shape, generator=generator))
            module.bias.copy_(0.2 * torch.randn(shape, generator=generator))
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(0.2 * torch.randn(module.running_mean.shape, generator=generator))
            module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=generator))
            module.num_batches_tracked.fill_(7)
    return model


def normalised(images: torch.Tensor) -> torch.Tensor:
    """What zoo's semantic task feeds a model for [0, 1] images (LibreYOLO normalises inside its forward)."""
    return imagenet_normalise(images, images.device)


def oracle_max_difference(family: str, size: str, num_classes: int, shapes: list[tuple[int, int]],
                          seed: int = 0) -> tuple[float, nn.Module, nn.Module]:
    """Max |zoo − LibreYOLO| of eval logits over batches of 2 at ``shapes``, zoo loaded with LibreYOLO's converted weights."""
    import importlib

    convert = importlib.import_module(f"zoo_{family}.convert").from_libreyolo
    torch.manual_seed(seed)
    reference = randomise_normalisation(libreyolo_net(family, size, num_classes), seed).eval()
    model = build(family, size, num_classes).eval()
    model.load_state_dict(convert(reference.state_dict()), strict=True)
    worst = 0.0
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for height, width in shapes:
            images = torch.rand(2, 3, height, width, generator=generator)
            expected, got = reference(images), model(normalised(images))
            assert got.shape == expected.shape == (2, num_classes, height, width)
            worst = max(worst, float((got - expected).abs().max()))
    return worst, model, reference
