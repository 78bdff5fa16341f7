"""The mask loss of prototype-mask segmenters (YOLACT, YOLOv5/8/9-seg): per-pixel BCE inside the box.

Each positive anchor's mask logits (its coefficients over the image's prototypes) meet the mask of
the instance it was assigned to in a per-pixel binary cross-entropy; pixels outside the assigned
box are cut off (``zoo_core.ops.masks.crop_masks_to_boxes``), the rest averaged over the whole mask
map and divided by the box's normalised area, so a small object weighs as much as a large one
(WongKinYiu/yolov9 ``utils/segment/loss_tal.py``, ``single_mask_loss``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zoo_core.ops.masks import crop_masks_to_boxes

__all__ = ["box_normalised_mask_bce"]


def box_normalised_mask_bce(
    mask_logits: torch.Tensor, target_masks: torch.Tensor, boxes: torch.Tensor, box_areas: torch.Tensor
) -> torch.Tensor:
    """Loss of each of n instances (shape n): BCE of ``mask_logits`` (n×h×w) against ``target_masks``
    (n×h×w in {0, 1}) over the pixels of ``boxes`` (n×4 xyxy in mask pixels), averaged over the h×w
    map and divided by ``box_areas`` (n, the box's width × height as fractions of the image)."""
    if mask_logits.shape != target_masks.shape:
        raise ValueError(f"mask logits {tuple(mask_logits.shape)} and target masks {tuple(target_masks.shape)} differ in shape")
    if box_areas.shape != mask_logits.shape[:1]:
        raise ValueError(f"give one box area per mask: {tuple(box_areas.shape)} for {len(mask_logits)} masks")
    pixel_losses = F.binary_cross_entropy_with_logits(mask_logits.float(), target_masks.float(), reduction="none")
    # A degenerate box would divide by zero; its cropped loss is zero anyway.
    return crop_masks_to_boxes(pixel_losses, boxes).mean(dim=(1, 2)) / box_areas.float().clamp(min=1e-9)
