"""Instance-mask operations shared by the prototype-mask and dynamic-kernel segmenters.

- ``crop_masks_to_boxes``: zero every mask outside its box (YOLACT's crop, which YOLOv5/8/9-seg
  apply to both the loss and the prediction);
- ``combine_prototypes``: each instance's mask logits as its coefficients times the image's
  prototype maps (YOLACT's linear combination);
- ``downsample_instance_masks``: the task's full-resolution 0/1 target masks at a head's lower
  mask resolution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["crop_masks_to_boxes", "combine_prototypes", "downsample_instance_masks"]


def crop_masks_to_boxes(masks: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """``masks`` (n×h×w, any dtype) with every pixel outside its box set to zero.

    ``boxes`` are n×4 xyxy in mask pixels. A pixel of column ``c`` and row ``r`` is kept when
    ``x1 <= c < x2`` and ``y1 <= r < y2`` (pixels counted by their index, as YOLO-seg's
    ``crop_mask`` does, so a box from 0 to w keeps the whole width). Differentiable in ``masks``.
    """
    if masks.dim() != 3 or boxes.dim() != 2 or boxes.shape[-1] != 4 or len(boxes) != len(masks):
        raise ValueError(
            f"crop_masks_to_boxes takes n×h×w masks and n×4 boxes, got {tuple(masks.shape)} and {tuple(boxes.shape)}"
        )
    height, width = masks.shape[-2:]
    x1, y1, x2, y2 = boxes.to(torch.float32)[:, :, None, None].unbind(1)
    columns = torch.arange(width, device=masks.device, dtype=torch.float32)[None, None, :]
    rows = torch.arange(height, device=masks.device, dtype=torch.float32)[None, :, None]
    inside = (columns >= x1) & (columns < x2) & (rows >= y1) & (rows < y2)
    return masks * inside.to(masks.dtype)


def combine_prototypes(coefficients: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """Mask logits n×h×w of ``coefficients`` (n×K) over one image's ``prototypes`` (K×h×w)."""
    if coefficients.dim() != 2 or prototypes.dim() != 3 or coefficients.shape[1] != prototypes.shape[0]:
        raise ValueError(
            f"combine_prototypes takes n×K coefficients and K×h×w prototypes, got {tuple(coefficients.shape)} "
            f"and {tuple(prototypes.shape)}"
        )
    channels, height, width = prototypes.shape
    return (coefficients @ prototypes.reshape(channels, height * width)).reshape(-1, height, width)


def downsample_instance_masks(masks: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``masks`` (M×H×W in {0, 1}) at ``size`` (h, w) as float 0/1: a pixel is set when at least half
    of the input pixels it covers are (area averaging, so the result stays centred on the object
    where nearest sampling would shift it by half a cell)."""
    if masks.dim() != 3:
        raise ValueError(f"instance masks must be M×H×W, got shape {tuple(masks.shape)}")
    if tuple(masks.shape[-2:]) == tuple(size):
        return masks.float()
    if len(masks) == 0:
        return masks.new_zeros((0, *size), dtype=torch.float32)
    coverage = F.interpolate(masks[:, None].float(), size=tuple(size), mode="area")[:, 0]
    return (coverage >= 0.5).float()
