"""``DETRSegmenter``: a ``DETRDetector`` whose every query also predicts an instance mask (D-FINE-seg).

Backbone → (leading maps for the mask head only) + hybrid encoder → decoder with
``return_queries`` → ``QueryMaskHead`` (``zoo_core.detr.mask_head``) over the encoder's maps (and
the leading backbone maps, when the encoder's finest stride is coarser than 8: D-FINE-N's
two-level encoder gets its stride-8 backbone stage for the masks only). Contract (the segment
task's, ``zoo_core/tasks/segment.py``):

- eval: ``{"boxes", "scores", "mask_coefficients" (B×Q×D), "mask_features" (B×D×H/s×W/s)}`` with
  ``s`` = ``mask_stride`` (4 for D-FINE-seg); a query's mask logits are its coefficients dotted
  with the features (``query_mask_logits``);
- training: the detector's outputs, each decoder layer (matching and denoising) also holding
  ``masks`` (its queries' mask logits); ``loss(outputs, batch)`` reads ``targets`` and the
  batch's ``masks`` (M×H×W, row i the mask of target row i), resized bilinearly to the logits'
  size, into a ``MaskSetCriterion``;
- ``postprocess``: the detector's top-k detections plus ``masks`` (n×H×W bool): each kept query's
  mask probabilities upsampled bilinearly to the input, with ``placements`` then to the original
  image (as the input pipeline placed it), thresholded at 0.5 and cut to the detection's box —
  LibreYOLO 1.6.0's D-FINE-seg postprocess, in that order.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.data.input_pipeline import logits_to_original
from zoo_core.detr.decoder import DETRDecoderBase
from zoo_core.detr.detector import DETRDetector
from zoo_core.detr.geometry import cxcywh_to_xyxy
from zoo_core.detr.mask_head import QueryMaskHead, query_mask_logits
from zoo_core.detr.mask_losses import MaskSetCriterion, resize_target_masks
from zoo_core.detr.postprocess import topk_detections
from zoo_core.detr.targets import DETRTargets
from zoo_core.ops.boxes import ImagePlacement, boxes_to_original
from zoo_core.ops.masks import combine_prototypes, crop_masks_to_boxes
from zoo_core.registry import InputPipeline

__all__ = ["DETRSegmenter", "MASK_THRESHOLD"]

MASK_THRESHOLD = 0.5  # a pixel belongs to the object when its probability is at least this (LibreYOLO: >= 0.5)
_STRETCH = InputPipeline(resize="stretch", interpolation="bilinear_antialiased")


class DETRSegmenter(DETRDetector):
    """See the module docstring.

    Args:
        backbone, encoder, decoder, criterion: as ``DETRDetector`` (the criterion a ``MaskSetCriterion``).
        mask_head: the ``QueryMaskHead``.
        mask_only_levels: how many leading backbone maps go to the mask head only (not the encoder).
        mask_stride: the input-pixel stride of ``mask_features``.
        input_pipeline: how the family's inputs are made (where ``postprocess`` maps masks back to).
        size_multiple, published_form: as ``DETRDetector``.
    """

    def __init__(
        self, backbone: nn.Module, encoder: nn.Module, decoder: DETRDecoderBase, criterion: MaskSetCriterion,
        mask_head: QueryMaskHead, *, mask_only_levels: int = 0, mask_stride: int = 4, input_pipeline: InputPipeline = _STRETCH,
        size_multiple: int = 32, published_form: str = "trainable",
    ) -> None:
        super().__init__(backbone, encoder, decoder, criterion, size_multiple=size_multiple, published_form=published_form)
        self.mask_head = mask_head
        self.mask_only_levels = mask_only_levels
        self.mask_stride = mask_stride
        self.input_pipeline = input_pipeline
        decoder.return_queries = True

    @torch.no_grad()
    def fuse(self) -> None:
        """The detector's inference form (equal query scores to the lower token), but with the queries kept in
        score order: the segment task's outputs are the per-query tensors themselves (``mask_coefficients``
        row q is query q's), so the inference form must list them as the model does, not in token order."""
        super().fuse()
        self.decoder.query_selector.keep_score_order = True

    def published_parameter_count(self) -> int:
        """Every parameter plus the decoder's fixed constants held as buffers (FDR's ``up`` and ``reg_scale``),
        which LibreYOLO counts as (frozen) parameters: its figure. Works on the meta device."""
        constants = sum(self.decoder.get_buffer(name).numel() for name in ("up", "reg_scale") if hasattr(self.decoder, name))
        return super().published_parameter_count() + constants

    def forward(self, images: torch.Tensor, targets: torch.Tensor | DETRTargets | None = None) -> dict[str, Any]:
        self.check_images(images)
        packed = self._targets(targets, images) if targets is not None and self.training else None
        maps = self.backbone(images)
        leading, maps = maps[: self.mask_only_levels], maps[self.mask_only_levels :]
        encoded = self.encoder(maps)
        outputs = self.decoder(encoded, targets=packed)
        features = self.mask_head.features([*leading, *encoded])
        height, width = images.shape[2], images.shape[3]
        if not self.training:
            scale = outputs["boxes"].new_tensor([width, height, width, height])
            return {
                "boxes": cxcywh_to_xyxy(outputs["boxes"]) * scale,
                "scores": outputs["logits"].sigmoid(),
                "mask_coefficients": self.mask_head.coefficients(outputs["queries"]),
                "mask_features": features,
            }
        denoising = outputs.get("denoising")
        for item in [*outputs["layers"], *(denoising["layers"] if denoising is not None else [])]:
            item["masks"] = query_mask_logits(self.mask_head.coefficients(item.pop("queries")), features)
        outputs["targets"] = packed
        outputs["image_size"] = (height, width)
        return outputs

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)``: the detector's terms plus ``mask_bce`` and ``mask_dice``; needs ``batch["masks"]``."""
        if "layers" not in outputs:
            raise ValueError("DETR losses need training-mode outputs (model.train(), then model(images, targets=...))")
        masks = batch.get("masks")
        if masks is None:
            raise ValueError("a DETR segmenter's loss needs 'masks' in the batch (M×H×W, one per row of 'targets')")
        if len(masks) != len(batch["targets"]):
            raise ValueError(f"the batch has {len(batch['targets'])} target rows but {len(masks)} masks; give one mask per row")
        targets = outputs.get("targets")
        device = outputs["layers"][-1]["logits"].device
        if targets is None or targets.rows is None:
            images = batch["images"]
            targets = DETRTargets.from_batch(batch["targets"].to(device), images.shape[0], (images.shape[2], images.shape[3]))
        size = tuple(outputs["layers"][-1]["masks"].shape[-2:])
        selected = masks.to(device)[targets.rows.to(device)]
        return self.criterion(outputs, targets.with_masks(resize_target_masks(selected, size)))

    @torch.no_grad()
    def postprocess(self, outputs: Mapping[str, Any], conf: float = 0.25, iou: float = 0.7, max_det: int = 300, *,
                    placements: Sequence[ImagePlacement] | None = None) -> list[dict[str, torch.Tensor]]:
        """Detections per image (``boxes``, ``scores``, ``labels``) and their ``masks`` (n×H×W bool), in input pixels
        or, with ``placements`` (one per image), in original-image pixels (boxes not clipped, as the detector's)."""
        del iou  # set prediction: no NMS
        features = outputs["mask_features"]
        if placements is not None and len(placements) != features.shape[0]:
            raise ValueError(f"placements must hold one per image ({features.shape[0]}), got {len(placements)}")
        detections = topk_detections(outputs["scores"], outputs["boxes"], conf, max_det, return_queries=True)
        input_h, input_w = features.shape[-2] * self.mask_stride, features.shape[-1] * self.mask_stride
        for image, detection in enumerate(detections):
            queries = detection.pop("queries")
            out_h, out_w = placements[image].shape if placements is not None else (input_h, input_w)
            if placements is not None:
                ratio_pad, shape = placements[image]
                detection["boxes"] = boxes_to_original(detection["boxes"], ratio_pad, shape, clip=False)
            if not len(queries):
                detection["masks"] = torch.zeros((0, out_h, out_w), dtype=torch.bool, device=features.device)
                continue
            coefficients = outputs["mask_coefficients"][image, queries].float()
            probabilities = combine_prototypes(coefficients, features[image].float()).sigmoid()
            probabilities = F.interpolate(probabilities[None], size=(input_h, input_w), mode="bilinear", align_corners=False)[0]
            if placements is not None:
                probabilities = logits_to_original(probabilities, placements[image].ratio_pad, (out_h, out_w), self.input_pipeline)
            masks = (probabilities.clamp(0, 1) >= MASK_THRESHOLD).to(torch.uint8)
            detection["masks"] = crop_masks_to_boxes(masks, detection["boxes"].float()).bool()
        return detections
