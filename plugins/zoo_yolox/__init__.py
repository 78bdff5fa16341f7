"""The YOLOX family plugin (detection): the `yolox` entry of registry.yaml.

The architecture lives in the sibling modules ``model`` (network), ``loss`` (SimOTA loss) and
``convert`` (LibreYOLO / official checkpoint keys), imported only when needed; nothing here
imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("yolox")
