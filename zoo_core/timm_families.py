"""The classification families whose architecture timm provides: one registry-driven builder.

resnet, convnext, convnextv2, efficientnetv2 and mobilenetv4 are declared in registry.yaml with
``builder: zoo_core.timm_families:build_timm_classifier`` and the timm model name of each size
(``config.timm_name``); their plugin packages only declare.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo_core.building import BuildRequest
from zoo_core.errors import RegistryError

if TYPE_CHECKING:
    import torch

__all__ = ["build_timm_classifier"]


def build_timm_classifier(request: BuildRequest) -> "torch.nn.Module":
    """Build ``request.config["timm_name"]`` with timm, randomly initialised (never downloads).

    ``request.options`` are forwarded to ``timm.create_model`` (e.g. ``drop_path_rate``).
    """
    import timm

    timm_name = request.config.get("timm_name")
    if not timm_name:
        raise RegistryError(
            f"family {request.family!r} size {request.size!r}: config.timm_name is required by "
            "build_timm_classifier (docs/registry.md)"
        )
    options = dict(request.options)
    if options.pop("pretrained", False):
        raise ValueError(
            "pretrained=True would download weights at build time, which zoo never does; "
            "load local weights instead: LibreYOLO('path/to/weights.safetensors')"
        )
    return timm.create_model(timm_name, pretrained=False, num_classes=request.num_classes, **options)
