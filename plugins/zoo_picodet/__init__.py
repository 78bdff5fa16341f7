"""The PP-PicoDet family plugin (detection): the `picodet` entry of registry.yaml.

The architecture lives in the sibling modules (``model``, ``loss``, ``recipe``) and the foreign
weight layouts in ``convert``, imported only when needed; nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("picodet")
