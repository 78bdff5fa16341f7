"""The YOLOv9 family plugin (detection): its declaration is the `yolo9` entry of registry.yaml.

The architecture lives in the sibling module ``model``, which the declared builder imports only
when a model is built; nothing here imports torch.
"""

from zoo_core.hookspecs import hookimpl
from zoo_core.registry import FamilyDeclaration, builtin_families

__all__ = ["zoo_families"]


@hookimpl
def zoo_families() -> list[FamilyDeclaration]:
    """Declare the `yolo9` family from registry.yaml."""
    return builtin_families("yolo9")
