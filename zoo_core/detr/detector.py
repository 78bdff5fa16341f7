"""The RT-DETR-family detector: backbone → hybrid encoder → decoder, with zoo's detection contract.

``DETRDetector`` wires any backbone (a module returning a list of maps, finest first, with an
``out_channels`` attribute), an encoder (maps → maps) and a ``DETRDecoderBase`` with a
``SetCriterion``. Contract (zoo_core/tasks/base.py):

- ``model(images)`` in eval mode → ``{"boxes": (B, Q, 4) xyxy input pixels, "scores": (B, Q, C)
  sigmoid probabilities}``: every query's decoded box and class scores, before the top-k.
- Training: ``model(images, targets=batch["targets"])`` — the ``M×6`` pixel targets (or a
  ``DETRTargets``) reach the decoder, which needs them for the denoising queries; the outputs
  keep the packed targets under ``"targets"``. A recipe's ``forward_train(model, batch)`` does
  ``outputs = model(batch["images"], targets=batch["targets"])`` then
  ``unwrap_model(model).loss(outputs, batch)``. Without targets training still works (no
  denoising queries).
- ``loss(outputs, batch) -> (loss, items)``: the family's ``SetCriterion``. As published, the
  terms are normalised by the number of ground-truth boxes (averaged over ranks), not by images.
- ``postprocess(outputs, conf, iou, max_det)``: top-k over queries × classes, no NMS (``iou``
  is accepted and unused).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from zoo_core.detr.criterion import SetCriterion
from zoo_core.detr.decoder import DETRDecoderBase
from zoo_core.detr.geometry import cxcywh_to_xyxy
from zoo_core.detr.postprocess import topk_detections
from zoo_core.detr.targets import DETRTargets
from zoo_core.ops.boxes import ImagePlacement, boxes_to_original

__all__ = ["DETRDetector"]


class DETRDetector(nn.Module):
    """Backbone + encoder + decoder + criterion (the criterion holds no parameters).

    Args:
        backbone: images → list of feature maps.
        encoder: feature maps → feature maps (e.g. ``HybridEncoder``).
        decoder: a ``DETRDecoderBase``.
        criterion: the training loss.
        size_multiple: input height and width must be multiples of it (the coarsest stride).
        published_form: what the family's published parameter count counts: ``"trainable"``
            (every parameter, RT-DETR's tables) or ``"deploy"`` (``zoo_core.detr.deploy``: fused
            fusion blocks, no training-only heads; D-FINE, DEIM, RT-DETRv4).
    """

    def __init__(
        self, backbone: nn.Module, encoder: nn.Module, decoder: DETRDecoderBase, criterion: SetCriterion, *,
        size_multiple: int = 32, published_form: str = "trainable",
    ) -> None:
        super().__init__()
        if published_form not in ("trainable", "deploy"):
            raise ValueError(f"published_form must be 'trainable' or 'deploy', got {published_form!r}")
        self.backbone, self.encoder, self.decoder = backbone, encoder, decoder
        self.criterion = criterion
        self.num_classes = decoder.num_classes
        self.size_multiple = size_multiple
        self.published_form = published_form

    @property
    def minimum_input_size(self) -> int:
        """The smallest square input whose encoder tokens cover the queries (query selection is a top-k over tokens).

        The decoder's maps have strides ``size_multiple / 2**k`` (coarsest last), so an ``s``-pixel
        side gives ``Σ (s / stride)²`` tokens; the answer is the smallest multiple of
        ``size_multiple`` with at least ``num_queries`` tokens.
        """
        levels = len(self.decoder.input_projections)
        strides = [self.size_multiple // 2**k for k in range(levels)]
        side = self.size_multiple
        while sum((side // stride) ** 2 for stride in strides) < self.decoder.num_queries:
            side += self.size_multiple
        return side

    @torch.no_grad()
    def fuse(self) -> None:
        """The inference form (``zoo_core.export.inference_form`` calls it on a copy): equal query scores go
        to the lower token (a stable sort, ONNX ``TopK``'s rule), and where the decoder treats its
        queries as a set they are listed in token order instead of score order.

        An untrained (or barely trained) model scores many tokens equally or within 1e-6 of each
        other, and a score-ordered list would then depend on each runtime's tie-breaking and rounding
        (ONNX Runtime and ``torch.topk`` list ties differently), which the exported graphs must not.
        A decoder whose query slots carry learned embeddings of their own (RF-DETR) keeps the score
        order: its detections depend on which proposal sits in which slot; so does a segmenter
        (``DETRSegmenter.fuse``), whose outputs are the per-query tensors themselves.
        """
        for module in self.modules():
            if hasattr(module, "token_order"):
                module.token_order = True

    def published_parameter_count(self) -> int:
        """The parameters of the form the published tables count (``published_form``); works on the meta device."""
        if self.published_form == "deploy":
            from zoo_core.detr.deploy import deploy_parameter_count

            return deploy_parameter_count(self)
        return sum(parameter.numel() for parameter in self.parameters())

    def _targets(self, targets: torch.Tensor | DETRTargets, images: torch.Tensor) -> DETRTargets:
        if isinstance(targets, DETRTargets):
            return targets.to(images.device)
        return DETRTargets.from_batch(targets.to(images.device), images.shape[0], (images.shape[2], images.shape[3]))

    def check_images(self, images: torch.Tensor) -> None:
        """Raise ``ValueError`` unless ``images`` is N×3×H×W with H and W multiples of ``size_multiple``."""
        if images.dim() != 4 or images.shape[2] % self.size_multiple or images.shape[3] % self.size_multiple:
            raise ValueError(
                f"{type(self).__name__} takes N×3×H×W images with H and W multiples of {self.size_multiple}, "
                f"got {tuple(images.shape)}; letterbox or resize the input"
            )

    def forward(self, images: torch.Tensor, targets: torch.Tensor | DETRTargets | None = None) -> dict[str, Any]:
        self.check_images(images)
        packed = self._targets(targets, images) if targets is not None and self.training else None
        outputs = self.decoder(self.encoder(self.backbone(images)), targets=packed)
        height, width = images.shape[2], images.shape[3]
        if not self.training:
            scale = outputs["boxes"].new_tensor([width, height, width, height])
            return {"boxes": cxcywh_to_xyxy(outputs["boxes"]) * scale, "scores": outputs["logits"].sigmoid()}
        outputs["targets"] = packed
        outputs["image_size"] = (height, width)
        return outputs

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)``; the targets are those given to ``forward`` or, failing that, ``batch["targets"]``."""
        if "layers" not in outputs:
            raise ValueError("DETR losses need training-mode outputs (model.train(), then model(images, targets=...))")
        targets = outputs.get("targets")
        if targets is None:
            images = batch["images"]
            targets = DETRTargets.from_batch(batch["targets"].to(images.device), images.shape[0], (images.shape[2], images.shape[3]))
        return self.criterion(outputs, targets)

    @torch.no_grad()
    def postprocess(self, outputs: Mapping[str, Any], conf: float = 0.25, iou: float = 0.7, max_det: int = 300, *,
                    placements: Sequence[ImagePlacement] | None = None) -> list[dict[str, torch.Tensor]]:
        """Detections per image: ``boxes`` (n×4 xyxy), ``scores``, ``labels`` (int64).

        The boxes are in input pixels, or with ``placements`` (one per image) in original-image
        pixels, not clipped to the image: the DETR line's reference postprocess scales the
        predicted boxes and returns them as they are.
        """
        del iou  # set prediction: no NMS
        detections = topk_detections(outputs["scores"], outputs["boxes"], conf, max_det)
        if placements is not None:
            for detection, (ratio_pad, shape) in zip(detections, placements):
                detection["boxes"] = boxes_to_original(detection["boxes"], ratio_pad, shape, clip=False)
        return detections
