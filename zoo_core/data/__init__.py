"""The data layer: image reading, dataset formats, augmentation, the built-in ``shapes`` dataset.

Modules: ``errors`` (``DatasetError``, ``DatasetWarning``), ``images`` (finding, checking,
reading images; predict sources), ``dataset_yaml`` (keys shared by dataset YAML files),
``yolo_format`` / ``mask_format`` / ``restore_format`` (the detection, semantic and restoration
formats), ``instances`` / ``instance_readers`` / ``coco_format`` (instance records, YOLO-seg polygons,
COCO instance JSON), ``augment`` (letterbox, mosaic, v2 transforms), ``shapes`` (the synthetic dataset),
``sampling`` (``InferenceShardSampler``). The user guide is docs/data.md.
"""

from __future__ import annotations

from zoo_core.data.errors import DatasetError, DatasetWarning

__all__ = ["DatasetError", "DatasetWarning"]
