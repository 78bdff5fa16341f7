"""What a family builder receives, and the small helpers every builder and test shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    import torch

    from zoo_core.registry import FamilyDeclaration

__all__ = ["BuildRequest", "count_parameters"]


@dataclass(frozen=True)
class BuildRequest:
    """The arguments of one model build, passed to a declared ``builder`` function.

    ``config`` is the size's ``config`` mapping from the declaration (architecture data such as
    widths or a timm model name); ``options`` are the caller's extra keyword arguments.
    """

    family: str
    size: str
    num_classes: int
    config: Mapping[str, Any]
    declaration: "FamilyDeclaration"
    options: Mapping[str, Any] = field(default_factory=dict)


def count_parameters(model: "torch.nn.Module") -> int:
    """Number of parameters of ``model`` (works on the meta device, where nothing is allocated)."""
    return sum(parameter.numel() for parameter in model.parameters())
