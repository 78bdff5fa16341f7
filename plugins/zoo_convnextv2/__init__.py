"""The ConvNeXt V2 family plugin: its declaration is the `convnextv2` entry of registry.yaml.

The architecture comes from timm through zoo_core's registry-driven builder, so this module
only declares; nothing here imports torch.
"""

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import FamilyDeclaration, builtin_families

__all__ = ["zoo_families"]


@hookimpl
def zoo_families() -> list[FamilyDeclaration]:
    """Declare the `convnextv2` family from registry.yaml."""
    return builtin_families("convnextv2")
