"""What a family builder receives, and the small helpers every builder and test shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    import torch

    from zoo_core.registry import FamilyDeclaration

__all__ = ["BuildRequest", "ConvertedWeights", "count_parameters"]


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


@dataclass(frozen=True)
class ConvertedWeights:
    """What a ``convert_weights`` hook returns when a file decides more than tensors.

    ``options`` are builder options the tensors need (e.g. a class-tower width that a fine-tuned
    checkpoint kept); ``size`` replaces the size the file claimed when its tensors show another
    layout of the same family (e.g. NAFNet's SIDD blocks in a file named for the GoPro size).
    """

    state_dict: "Mapping[str, torch.Tensor]"
    options: Mapping[str, Any] = field(default_factory=dict)
    size: str | None = None


def count_parameters(model: "torch.nn.Module") -> int:
    """Number of parameters of ``model`` (works on the meta device, where nothing is allocated)."""
    return sum(parameter.numel() for parameter in model.parameters())
