"""The DEIMv2 family plugin (detection): the `deimv2` entry of registry.yaml.

The architecture lives in the sibling modules (``model`` and its parts), the published training
recipe in ``recipe`` and the LibreYOLO/official key layout in ``convert``; all are imported only
when needed: nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("deimv2")
