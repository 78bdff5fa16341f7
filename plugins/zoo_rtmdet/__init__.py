"""The RTMDet plugin: the `rtmdet` (detection) and `rtmdet_ins` (instance segmentation) entries of registry.yaml.

The architecture lives in the sibling modules ``model`` (network), ``loss`` (dynamic soft-label
assignment, quality focal loss + GIoU) and ``convert`` (LibreYOLO / mmdetection checkpoint keys),
and ``instance`` (RTMDet-Ins), imported only when needed; nothing here imports torch.
"""

from zoo_core.registry import declared_in_registry

__all__ = ["zoo_families"]

zoo_families = declared_in_registry("rtmdet", "rtmdet_ins")
