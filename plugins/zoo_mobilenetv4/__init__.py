"""The MobileNetV4 family plugin: its declaration is the `mobilenetv4` entry of registry.yaml.

The architecture comes from timm through zoo_core's registry-driven builder, so this module
only declares; nothing here imports torch.
"""

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import FamilyDeclaration, builtin_families

__all__ = ["zoo_families"]


@hookimpl
def zoo_families() -> list[FamilyDeclaration]:
    """Declare the `mobilenetv4` family from registry.yaml."""
    return builtin_families("mobilenetv4")
