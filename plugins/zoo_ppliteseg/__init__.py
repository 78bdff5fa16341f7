"""The PP-LiteSeg family plugin (semantic segmentation): its declaration is the `ppliteseg` entry of registry.yaml.

The architecture lives in the sibling module ``model``, its training loss in ``loss`` and the
checkpoint key mapping in ``convert``; they are imported only when a model is built or a
file converted, so nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("ppliteseg")
