"""The RT-DETR family plugin (detection): its declaration is the `rtdetr` entry of registry.yaml.

The architecture lives in the sibling modules ``model`` and ``presnet`` (the DETR core in
``zoo_core.detr``), the checkpoint key mapping in ``convert``; they are imported only when
needed, so nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("rtdetr")
