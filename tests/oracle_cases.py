"""How each family is compared with LibreYOLO 1.6, the output oracle (docs/weights.md).

For every family in the registry, ``ORACLE_CASES`` says which LibreYOLO class builds it, on what
input the two are compared and which outputs are compared: decoded boxes and class scores
before NMS for detection, logits for classification and segmentation, images for restoration.
``tests/test_libreyolo_oracle.py`` runs the smallest size of every family;
``benchmarks/libreyolo_oracle.py`` runs every size and prints a table. A family without a case
fails the suite: every family ships its oracle comparison, unless ``WITHOUT_LIBREYOLO_COUNTERPART``
names it with the reason (LibreYOLO 1.6 builds no such model at all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["OracleCase", "ORACLE_CASES", "WITHOUT_LIBREYOLO_COUNTERPART", "build_libreyolo", "compare_on_random_weights", "example_targets", "detection_batch"]

TOLERANCE = 1e-4


def _detection_zoo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    outputs = model(images)
    return {"boxes": outputs["boxes"], "scores": outputs["scores"]}


def _detection_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    predictions = model(images)["predictions"]  # N x (4 + C) x A: xyxy pixels, then class probabilities
    return {"boxes": predictions[:, :4].transpose(1, 2), "scores": predictions[:, 4:].transpose(1, 2)}


def _tensor_output(name: str) -> Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]:
    def outputs(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: model(images)}

    return outputs


def _imagenet_normalised(images: torch.Tensor) -> torch.Tensor:
    from zoo_core.tasks.classify import imagenet_normalise

    return imagenet_normalise(images, images.device)


def example_targets(side: int) -> torch.Tensor:
    """Four boxes on two images (M×6: image, class, x1, y1, x2, y2 in pixels of a ``side``-pixel square)."""
    corners = torch.tensor([[0.06, 0.08, 0.44, 0.56], [0.25, 0.03, 0.94, 0.38], [0.56, 0.5, 0.97, 0.94], [0.03, 0.05, 0.38, 0.31]])
    return torch.cat([torch.tensor([[0, 1], [0, 0], [0, 2], [1, 2]], dtype=torch.float32), corners * side], dim=1)


def detection_batch(images: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
    """The detect task's training batch (after ``preprocess``) of ``images`` and ``targets``."""
    return {"images": images, "targets": targets}


@dataclass(frozen=True)
class OracleCase:
    """One family's comparison: the LibreYOLO class, the input, and the outputs to compare.

    ``libreyolo_input`` / ``zoo_input`` turn the shared random image batch (in [0, 1]) into each
    model's input (LibreYOLO's UNet normalises inside the model, zoo's semantic task outside).
    ``relative`` widens the tolerance by that fraction of an output's magnitude: box corners are
    pixels, where one float32 step at 1000 px is already 6e-5.
    """

    libreyolo_class: str
    num_classes: int | None
    image_size: int
    zoo_outputs: Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]
    libreyolo_outputs: Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]
    zoo_input: Callable[[torch.Tensor], torch.Tensor] = lambda images: images
    libreyolo_input: Callable[[torch.Tensor], torch.Tensor] = lambda images: images
    relative: float = 0.0
    libreyolo_sizes: dict[str, str] = field(default_factory=dict)  # zoo size -> LibreYOLO size, where they differ
    # zoo sizes whose layout LibreYOLO only reads from a file (it builds its default layout of that name)
    zoo_only_sizes: tuple[str, ...] = ()
    # benchmarks/family_speed.py: LibreYOLO's training loss for (model, images in [0, 1], zoo's M×6 targets),
    # the zoo batch of the same data, and the smallest input the family runs on.
    libreyolo_train_step: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    zoo_batch: Callable[[torch.Tensor, torch.Tensor], dict[str, Any]] = detection_batch
    minimum_side: int = 0
    # parameter-name fragments LibreYOLO registers but its unfused graph never uses (YOLO-NAS's rbr_reparam
    # convs, the merged QARepVGG kernels it writes at fusion time): left out of its parameter count.
    libreyolo_unused_parameters: tuple[str, ...] = ()
    # parameter entries LibreYOLO stores but that are zero by construction or never read, within or beyond
    # the tensors zoo keeps (DINOv3's masked key bias, its pretraining mask token): left out of its count.
    libreyolo_inert_entries: Callable[[nn.Module], int] = lambda model: 0
    # extra keyword arguments of the LibreYOLO constructor (the DETRs: _scratch_init=True, or LibreYOLO
    # downloads ImageNet backbone weights and freezes the large sizes' BatchNorms)
    libreyolo_options: dict[str, Any] = field(default_factory=dict)


def semantic_masks(targets: torch.Tensor, images: int, side: int) -> torch.Tensor:
    """N×side×side class masks of ``example_targets``: each box painted with its class + 1 over background 0."""
    masks = torch.zeros(images, side, side, dtype=torch.long)
    for image, label, x1, y1, x2, y2 in targets.tolist():
        masks[int(image), int(y1) : int(y2), int(x1) : int(x2)] = int(label) + 1
    return masks


def semantic_batch(images: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
    """The semantic task's training batch (after ``preprocess``: ImageNet-normalised) of ``images`` and boxes as masks."""
    return {"images": _imagenet_normalised(images), "masks": semantic_masks(targets, len(images), images.shape[-1]),
            "ignore_index": 255}


def _segformer_train_step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return model(images, targets=semantic_masks(targets, len(images), images.shape[-1]))["total_loss"]


def _ppliteseg_train_step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from libreyolo.models.ppliteseg.loss import PPLiteSegLoss

    loss = PPLiteSegLoss(model.num_classes, ignore_index=255)
    return loss(model(images), semantic_masks(targets, len(images), images.shape[-1]))["loss"]


# YOLOX, YOLOv7, YOLOv9-E2E and RTMDet: LibreYOLO's decoded outputs and training losses.
def _padded_rows(targets: torch.Tensor, images: int) -> torch.Tensor:
    """Zoo's M×6 targets as B×G×5 zero-padded rows (class, x1, y1, x2, y2 pixels), the layout LibreYOLO's losses read."""
    counts = torch.bincount(targets[:, 0].long(), minlength=images)
    rows = torch.zeros(images, int(counts.max()) if len(targets) else 0, 5)
    filled = [0] * images
    for image, *row in targets.tolist():
        rows[int(image), filled[int(image)]] = torch.tensor(row)
        filled[int(image)] += 1
    return rows


def _centre_size_rows(targets: torch.Tensor, images: int) -> torch.Tensor:
    """B×G×5 rows (class, cx, cy, w, h pixels); padding rows stay all zero."""
    rows = _padded_rows(targets, images)
    corners = rows[..., 1:]
    return torch.cat((rows[..., :1], (corners[..., :2] + corners[..., 2:]) / 2, corners[..., 2:] - corners[..., :2]), dim=-1)


def _bgr_255(images: torch.Tensor) -> torch.Tensor:
    """YOLOX's input: BGR pixel values in 0..255 (zoo's YOLOX converts RGB [0, 1] inside the model)."""
    return images.flip(1) * 255.0


def _yolox_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    from libreyolo.postprocess.yolox import decode_outputs
    from libreyolo.utils.general import cxcywh_to_xyxy

    decoded = decode_outputs([level.clone() for level in model(images)])  # N×A×(4 + 1 + C): cxcywh, obj, classes
    return {"boxes": cxcywh_to_xyxy(decoded[..., :4]), "scores": decoded[..., 4:5] * decoded[..., 5:]}


def _yolox_train_step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return model(_bgr_255(images), _centre_size_rows(targets, len(images)))["total_loss"]


def _yolo7_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    from libreyolo.postprocess.yolo7 import decode_export

    anchors = [torch.tensor(level, dtype=torch.float32).reshape(-1, 2) for level in model.anchors]
    decoded = decode_export(model(images), anchors, model.strides, model.num_classes).transpose(1, 2)  # N×A×(4 + C)
    return {"boxes": decoded[..., :4], "scores": decoded[..., 4:]}


def _yolo7_train_step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # LibreYOLO trains YOLOv7 with its YOLOX-style SimOTA loss (not the official ComputeLossOTA zoo implements).
    return model(images, _centre_size_rows(targets, len(images)))["total_loss"]


def _yolo9_e2e_train_step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    rows = _padded_rows(targets, len(images))
    rows[..., 1:] /= images.shape[-1]  # LibreYOLO9's targets: corners normalised to [0, 1] (square inputs)
    return model(images, targets=rows)["total_loss"]


_RTMDET_BGR_MEAN = (103.53, 116.28, 123.675)
_RTMDET_BGR_STD = (57.375, 57.12, 58.395)


def _rtmdet_libreyolo_input(images: torch.Tensor) -> torch.Tensor:
    """mmdetection's RTMDet preprocessing, which LibreYOLO's model expects: BGR 0..255, normalised."""
    mean = torch.tensor(_RTMDET_BGR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(_RTMDET_BGR_STD).view(1, 3, 1, 1)
    return (_bgr_255(images) - mean) / std


def _rtmdet_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    from libreyolo.postprocess.rtmdet import _distance2bbox, _make_grid_priors

    class_maps, distance_maps = model(images)
    points = _make_grid_priors(list(class_maps), [8, 16, 32])
    scores = torch.cat([level.flatten(2) for level in class_maps], 2).transpose(1, 2).sigmoid()
    distances = torch.cat([level.flatten(2) for level in distance_maps], 2).transpose(1, 2)
    return {"boxes": _distance2bbox(points, distances), "scores": scores}


def _rtmdet_ins_zoo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    outputs = model(images)
    return {name: outputs[name] for name in ("boxes", "scores", "mask_coefficients", "mask_features")}


def _rtmdet_ins_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """LibreYOLO's RTMDet-Ins head outputs in the segment task's export form: decoded boxes, scores, each anchor's
    dynamic-kernel parameters, the stride-8 mask features."""
    class_maps, distance_maps, kernel_maps, mask_features = model(images)
    decoded = _rtmdet_libreyolo_decoded(class_maps, distance_maps)
    kernels = torch.cat([level.flatten(2) for level in kernel_maps], 2).transpose(1, 2)
    return {**decoded, "mask_coefficients": kernels, "mask_features": mask_features}


def _rtmdet_libreyolo_decoded(class_maps, distance_maps) -> dict[str, torch.Tensor]:
    from libreyolo.postprocess.rtmdet import _distance2bbox, _make_grid_priors

    points = _make_grid_priors(list(class_maps), [8, 16, 32])
    scores = torch.cat([level.flatten(2) for level in class_maps], 2).transpose(1, 2).sigmoid()
    distances = torch.cat([level.flatten(2) for level in distance_maps], 2).transpose(1, 2)
    return {"boxes": _distance2bbox(points, distances), "scores": scores}


def _rtmdet_train_step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from libreyolo.models.rtmdet.loss import RTMDetLoss

    class_maps, distance_maps = model(_rtmdet_libreyolo_input(images))
    boxes = [targets[targets[:, 0] == index, 2:] for index in range(len(images))]
    labels = [targets[targets[:, 0] == index, 1].long() for index in range(len(images))]
    return RTMDetLoss(model.nc, (8, 16, 32))(class_maps, distance_maps, boxes, labels)["total_loss"]


# YOLO-NAS, PP-PicoDet and FOMO (g3).
def _yolonas_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    (boxes, scores), _ = model(images)  # eval: decoded xyxy pixels and class probabilities, N×A×4 / N×A×C
    return {"boxes": boxes, "scores": scores}


def _yolonas_train_step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from libreyolo.models.yolonas.loss import PPYoloELoss

    _, raw = model(images)
    centre_size = torch.cat((targets[:, :2], (targets[:, 2:4] + targets[:, 4:6]) / 2, targets[:, 4:6] - targets[:, 2:4]), 1)
    return PPYoloELoss(model.nc, use_static_assigner=False, distributed_normalize=False)((None, raw), centre_size)[0]


_PICODET_MEAN, _PICODET_STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


def _picodet_libreyolo_input(images: torch.Tensor) -> torch.Tensor:
    """LibreYOLO's PicoDet input: ImageNet-normalised 0..255 RGB (zoo's PicoDet normalises inside the model)."""
    return (images * 255.0 - torch.tensor(_PICODET_MEAN).view(1, 3, 1, 1)) / torch.tensor(_PICODET_STD).view(1, 3, 1, 1)


def _picodet_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    model.head.export = True  # the decoded form: N×A×(4 + C), xyxy pixels then sigmoid scores
    try:
        decoded = model(images)
    finally:
        model.head.export = False
    return {"boxes": decoded[..., :4], "scores": decoded[..., 4:]}


def _picodet_train_step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    from libreyolo.models.picodet.loss import PICODETLoss

    class_maps, box_maps = model(_picodet_libreyolo_input(images))
    boxes = [targets[targets[:, 0] == index, 2:] for index in range(len(images))]
    labels = [targets[targets[:, 0] == index, 1].long() for index in range(len(images))]
    return PICODETLoss(num_classes=model.head.num_classes, distributed_normalize=False)(class_maps, box_maps, boxes, labels)["total_loss"]


def _fomo_libreyolo_input(images: torch.Tensor) -> torch.Tensor:
    return images * 2.0 - 1.0  # LibreYOLO's (x - 0.5) / 0.5; zoo's FOMO maps [0, 1] inside the model


_FOMO_GRIDS: dict[tuple[int, ...], torch.Tensor] = {}


def _fomo_train_step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """LibreYOLO's FOMO loss; its cell targets are made by its dataset (once here, not timed per step)."""
    from libreyolo.models.fomo.dataset import _boxes_xyxy_to_grid
    from libreyolo.models.fomo.loss import FOMOLoss

    logits = model(_fomo_libreyolo_input(images))
    key = (id(targets), *logits.shape)
    if key not in _FOMO_GRIDS:
        side, grid = images.shape[-1], logits.shape[-1]
        rows = [targets[targets[:, 0] == index] for index in range(len(images))]
        _FOMO_GRIDS[key] = torch.stack([
            _boxes_xyxy_to_grid(row[:, 2:].numpy(), row[:, 1].long().numpy(), side, grid) for row in rows])
    return FOMOLoss(logits.shape[1] - 1, fg_weight=100.0)(logits, _FOMO_GRIDS[key])["total_loss"]


# RT-DETR, D-FINE, DEIM and RT-DETRv4 (g4): every query's box and class scores, and the set-prediction losses.
def _detr_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    outputs = model(images)  # pred_boxes: N×Q×4 cxcywh in [0, 1]; pred_logits: N×Q×C
    centre, size = outputs["pred_boxes"][..., :2], outputs["pred_boxes"][..., 2:]
    scale = torch.tensor([images.shape[-1], images.shape[-2]] * 2, dtype=centre.dtype)
    return {"boxes": torch.cat((centre - size / 2, centre + size / 2), -1) * scale, "scores": outputs["pred_logits"].sigmoid()}


def _detr_targets(targets: torch.Tensor, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Zoo's M×6 pixel targets as LibreYOLO's DETR targets: per image ``labels`` and normalised cxcywh ``boxes``."""
    scale = torch.tensor([images.shape[-1], images.shape[-2]] * 2, dtype=torch.float32)
    listed = []
    for index in range(len(images)):
        rows = targets[targets[:, 0] == index]
        corners = rows[:, 2:6] / scale
        boxes = torch.cat(((corners[:, :2] + corners[:, 2:]) / 2, corners[:, 2:] - corners[:, :2]), 1)
        listed.append({"labels": rows[:, 1].long(), "boxes": boxes})
    return listed


def _detr_train_step(family: str) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]:
    """LibreYOLO's DETR training loss as its trainers build it (denoising on): RT-DETR, D-FINE (VFL) or DEIM (MAL)."""

    def step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        listed = _detr_targets(targets, images)
        outputs = model(images, targets=listed)
        num_classes = outputs["pred_logits"].shape[-1]
        if family == "rtdetr":
            from libreyolo.models.rtdetr.loss import RTDETRLoss

            criterion = RTDETRLoss(num_classes=num_classes)
        else:
            if family == "dfine":
                from libreyolo.models.dfine.loss import DFINECriterion as Criterion
                from libreyolo.models.dfine.matcher import HungarianMatcher

                weights, losses, gamma = {"loss_vfl": 1.0}, ["vfl", "boxes", "local"], 2.0
            else:  # DEIM, and RT-DETRv4 (LibreYOLO's RT-DETRv4 trainer is its DEIM trainer)
                from libreyolo.models.deim.loss import DEIMCriterion as Criterion
                from libreyolo.models.deim.matcher import HungarianMatcher

                weights, losses, gamma = {"loss_mal": 1.0}, ["mal", "boxes", "local"], 1.5
            weights.update(loss_bbox=5.0, loss_giou=2.0, loss_fgl=0.15, loss_ddf=1.5)
            matcher = HungarianMatcher({"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0}, use_focal_loss=True,
                                       alpha=0.25, gamma=2.0)
            criterion = Criterion(matcher, weights, losses, alpha=0.75, gamma=gamma, num_classes=num_classes, reg_max=32)
        terms = criterion(outputs, listed)
        return sum(value for name, value in terms.items() if name != "total_loss")

    return step


# D-FINE's frozen up/reg_scale scalars: LibreYOLO parameters, zoo buffers (same keys, same values).
_FROZEN_DETR_SCALARS = ("decoder.up", "decoder.reg_scale")
def _dfine_seg_zoo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    from zoo_core.detr.mask_head import query_mask_logits

    outputs = model(images)
    masks = query_mask_logits(outputs["mask_coefficients"], outputs["mask_features"]).sigmoid()
    return {**{name: outputs[name] for name in ("boxes", "scores", "mask_coefficients", "mask_features")}, "masks": masks}


def _dfine_seg_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """LibreYOLO's D-FINE-seg eval outputs: every query's box, scores and mask probabilities, and (caught at its mask
    modules) the stride-4 mask features and the final layer's scaled query embeddings (the export form's coefficients)."""
    caught: dict[str, torch.Tensor] = {}
    decoder = model.decoder

    def keep(name: str):
        def hook(module, inputs, output):
            caught.setdefault(name, output)  # the mask head runs on the final layer first, then the auxiliary ones
        return hook

    handles = [decoder.mask_decoder.register_forward_hook(keep("mask_features")),
               decoder.mask_head.register_forward_hook(keep("embedding"))]
    try:
        outputs = model(images)
    finally:
        for handle in handles:
            handle.remove()
    decoded = _detr_libreyolo(lambda x: outputs, images)
    coefficients = caught["embedding"] * caught["embedding"].shape[-1] ** -0.5
    return {**decoded, "mask_coefficients": coefficients, "mask_features": caught["mask_features"], "masks": outputs["pred_masks"]}


_DETR = dict(num_classes=3, zoo_outputs=_detection_zoo, libreyolo_outputs=_detr_libreyolo, relative=1e-6,
             libreyolo_options={"_scratch_init": True}, libreyolo_unused_parameters=_FROZEN_DETR_SCALARS)
_CLASSIFIER = dict(num_classes=10, image_size=64, zoo_outputs=_tensor_output("logits"),
                   libreyolo_outputs=_tensor_output("logits"), zoo_input=_imagenet_normalised,
                   libreyolo_input=_imagenet_normalised)
ORACLE_CASES: dict[str, OracleCase] = {
    "yolo9": OracleCase("LibreYOLO9", 3, 128, _detection_zoo, _detection_libreyolo, relative=1e-6),
    "unet": OracleCase("LibreUNet", 4, 64, _tensor_output("logits"), _tensor_output("logits"),
                       zoo_input=_imagenet_normalised),
    "nafnet": OracleCase("LibreNAFNet", None, 48, _tensor_output("image"), _tensor_output("image"),
                         zoo_only_sizes=("s_sidd", "l_sidd")),
    "resnet": OracleCase("LibreResNet", **_CLASSIFIER),
    "convnext": OracleCase("LibreConvNeXt", **_CLASSIFIER),
    "convnextv2": OracleCase("LibreConvNeXtV2", **_CLASSIFIER),
    "efficientnetv2": OracleCase("LibreEfficientNetV2", **_CLASSIFIER),
    "mobilenetv4": OracleCase("LibreMobileNetV4", **_CLASSIFIER),
    # LibreYOLO's SegFormer and PP-LiteSeg normalise inside the model, zoo's semantic task outside.
    "segformer": OracleCase("LibreSegformer", 5, 64, _tensor_output("logits"), _tensor_output("logits"),
                            zoo_input=_imagenet_normalised, libreyolo_train_step=_segformer_train_step,
                            zoo_batch=semantic_batch),
    "ppliteseg": OracleCase("LibrePPLiteSeg", 5, 64, _tensor_output("logits"), _tensor_output("logits"),
                            zoo_input=_imagenet_normalised, libreyolo_train_step=_ppliteseg_train_step,
                            zoo_batch=semantic_batch),
    # Box corners are pixels (relative 1e-6: one float32 step of a 500-px coordinate is 3e-5).
    "yolox": OracleCase("LibreYOLOX", 3, 128, _detection_zoo, _yolox_libreyolo, libreyolo_input=_bgr_255,
                        relative=1e-6, libreyolo_train_step=_yolox_train_step),
    # LibreYOLO has YOLOv7 b only (registry.yaml lists it first, so the suite compares it); tiny and x follow
    # the official configs and have no LibreYOLO counterpart.
    "yolo7": OracleCase("LibreYOLO7", 3, 128, _detection_zoo, _yolo7_libreyolo, relative=1e-6,
                        libreyolo_train_step=_yolo7_train_step),
    "yolo9_e2e": OracleCase("LibreYOLO9E2E", 3, 128, _detection_zoo, _detection_libreyolo, relative=1e-6,
                            libreyolo_train_step=_yolo9_e2e_train_step),
    "rtmdet": OracleCase("LibreRTMDet", 3, 128, _detection_zoo, _rtmdet_libreyolo, libreyolo_input=_rtmdet_libreyolo_input,
                         relative=1e-6, libreyolo_train_step=_rtmdet_train_step),
    # RTMDet-Ins: LibreYOLO's LibreRTMDet with task "segment" (files LibreRTMDet{size}-seg.pt); the four outputs the
    # segment task exports are compared (kernel parameters and mask features too, not only boxes).
    "rtmdet_ins": OracleCase("LibreRTMDet", 3, 128, _rtmdet_ins_zoo, _rtmdet_ins_libreyolo, libreyolo_input=_rtmdet_libreyolo_input,
                             relative=1e-6, libreyolo_options={"task": "segment"}),
    "yolonas": OracleCase("LibreYOLONAS", 3, 128, _detection_zoo, _yolonas_libreyolo, relative=1e-6,
                          libreyolo_train_step=_yolonas_train_step, libreyolo_unused_parameters=(".rbr_reparam.",)),
    "picodet": OracleCase("LibrePICODET", 3, 128, _detection_zoo, _picodet_libreyolo, libreyolo_input=_picodet_libreyolo_input,
                          relative=1e-6, libreyolo_train_step=_picodet_train_step),
    # FOMO (task points): the per-cell logits N×(1 + C)×H/8×W/8, background first.
    "fomo": OracleCase("LibreFOMO", 3, 96, _tensor_output("logits"), _tensor_output("logits"),
                       libreyolo_input=_fomo_libreyolo_input, libreyolo_train_step=_fomo_train_step),
    # The DETRs compare all 300 queries (before the top-k): the input needs 300 encoder tokens, 128 px at
    # strides 8-32, 256 px for the two-level N models (strides 16, 32).
    "rtdetr": OracleCase("LibreRTDETR", image_size=128, libreyolo_train_step=_detr_train_step("rtdetr"), minimum_side=128,
                         **_DETR),
    "dfine": OracleCase("LibreDFINE", image_size=256, libreyolo_train_step=_detr_train_step("dfine"), minimum_side=256,
                        **_DETR),
    "dfine_seg": OracleCase("LibreDFINE", image_size=256, minimum_side=256,
                            **{**_DETR, "zoo_outputs": _dfine_seg_zoo, "libreyolo_outputs": _dfine_seg_libreyolo,
                               "libreyolo_options": {"_scratch_init": True, "task": "segment"},
                               # the two FDR constants by name: the fragment "decoder.up" would also take mask_decoder.up_conv
                               "libreyolo_unused_parameters": (),
                               "libreyolo_inert_entries": lambda model: model.decoder.up.numel() + model.decoder.reg_scale.numel()}),
    "deim": OracleCase("LibreDEIM", image_size=256, libreyolo_train_step=_detr_train_step("deim"), minimum_side=256,
                       **_DETR),
    "rtdetrv4": OracleCase("LibreRTDETRv4", image_size=128, libreyolo_train_step=_detr_train_step("rtdetrv4"),
                           minimum_side=128, **_DETR),
}


# DEIMv2, RF-DETR and EdgeCrafter ECDet (g6). Their ViT sizes take ImageNet-normalised input: zoo's
# models normalise inside, LibreYOLO's outside (DEIMv2 only for S-X: ``uses_imagenet_norm``).
def _fill_dinov3_bias_masks(model: nn.Module) -> None:
    """DINOv3's qkv ``bias_mask`` (DEIMv2 L/X) is NaN until a checkpoint fills it; give it the published [1, 0, 1]."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("qkv.bias_mask") and torch.isnan(buffer).any():
                third = buffer.shape[0] // 3
                buffer.fill_(1.0)
                buffer[third : 2 * third] = 0.0


def _dinov3_inert_entries(model: nn.Module) -> int:
    """DINOv3 keeps a bias for keys that its ``bias_mask`` zeroes, and a mask token only pretraining reads."""
    masked = sum(int((buffer == 0).sum()) for name, buffer in model.named_buffers() if name.endswith("qkv.bias_mask"))
    return masked + sum(parameter.numel() for name, parameter in model.named_parameters() if name.endswith("dinov3.mask_token"))


def _deimv2_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    _fill_dinov3_bias_masks(model)
    return _detr_libreyolo(model, _imagenet_normalised(images) if getattr(model, "uses_imagenet_norm", False) else images)


def _rfdetr_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    outputs = _detr_libreyolo(model, images)  # RF-DETR's extra last logit is no class: zoo leaves it out of the scores
    return {"boxes": outputs["boxes"], "scores": outputs["scores"][..., :-1]}


_G6_CRITERIA: dict[tuple[str, int], Any] = {}


def _g6_train_step(family: str) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]:
    """LibreYOLO's training loss as its DEIMv2 (Atto recipe), RF-DETR or EC trainer builds it."""

    def step(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        listed = _detr_targets(targets, images)
        key = (family, id(model))
        if family == "rfdetr":
            if key not in _G6_CRITERIA:
                _G6_CRITERIA[key] = model.build_criterion_and_postprocess()[0].train()
            criterion = _G6_CRITERIA[key]
            terms = criterion(model(_imagenet_normalised(images), targets=listed), listed)
            return sum(terms[name] * criterion.weight_dict[name] for name in terms if name in criterion.weight_dict)
        weights = {"loss_mal": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_fgl": 0.15, "loss_ddf": 1.5}
        if key not in _G6_CRITERIA:
            if family == "deimv2":
                from libreyolo.models.deimv2.loss import DEIMv2Criterion
                from libreyolo.models.deimv2.matcher import HungarianMatcher

                matcher = HungarianMatcher(weight_dict={"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0}, alpha=0.25, gamma=2.0,
                                           change_matcher=True, iou_order_alpha=4.0, matcher_change_epoch=450)
                _G6_CRITERIA[key] = DEIMv2Criterion(matcher=matcher, weight_dict=weights, losses=["mal", "boxes"], alpha=0.75, gamma=1.5,
                                                    num_classes=model.decoder.num_classes, reg_max=32, use_uni_set=False)
            else:
                from libreyolo.models.dfine.matcher import HungarianMatcher
                from libreyolo.models.ec.loss import ECCriterion

                matcher = HungarianMatcher(weight_dict={"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0}, use_focal_loss=True,
                                           alpha=0.25, gamma=2.0)
                _G6_CRITERIA[key] = ECCriterion(matcher=matcher, weight_dict=weights, losses=["mal", "boxes", "local"], alpha=0.75,
                                                gamma=2.0, num_classes=model.decoder.num_classes, reg_max=32)
        inputs = images if family == "deimv2" and not getattr(model, "uses_imagenet_norm", False) else _imagenet_normalised(images)
        terms = _G6_CRITERIA[key](model(inputs, targets=listed), listed)
        return sum(terms.values())

    return step


# Inputs give every size at least its query count of tokens (the comparison covers all queries before the top-k).
ORACLE_CASES.update({
    "deimv2": OracleCase("LibreDEIMv2", 3, 256, _detection_zoo, _deimv2_libreyolo, relative=1e-6, minimum_side=160,
                         libreyolo_train_step=_g6_train_step("deimv2"), libreyolo_unused_parameters=_FROZEN_DETR_SCALARS,
                         libreyolo_inert_entries=_dinov3_inert_entries),
    "rfdetr": OracleCase("LibreRFDETR", 3, 288, _detection_zoo, _rfdetr_libreyolo, libreyolo_input=_imagenet_normalised,
                         relative=1e-6, libreyolo_options={"_scratch_init": True}, libreyolo_train_step=_g6_train_step("rfdetr")),
    "ec": OracleCase("LibreEC", 3, 128, _detection_zoo, _detr_libreyolo, libreyolo_input=_imagenet_normalised, relative=1e-6,
                     minimum_side=128, libreyolo_train_step=_g6_train_step("ec"), libreyolo_unused_parameters=_FROZEN_DETR_SCALARS),
})


# Families LibreYOLO 1.6 has no model of, with why; their fidelity is checked against published facts instead.
WITHOUT_LIBREYOLO_COUNTERPART: dict[str, str] = {
    "yolo9_seg": "LibreYOLO 1.6 has no YOLOv9 segmentation model (its yolo9 is detection only); tests/test_yolo9_seg.py "
                 "checks the published gelan-c-seg parameters and FLOPs and the upstream key layout",
}


def libreyolo_has_size(family: str, size: str) -> bool:
    """Whether LibreYOLO 1.6 builds ``family``/``size`` (it has no yolo7-tiny or yolo7-x, for one)."""
    import libreyolo

    if family in WITHOUT_LIBREYOLO_COUNTERPART:
        return False
    case = ORACLE_CASES[family]
    if size in case.zoo_only_sizes:
        return True
    known_sizes = getattr(getattr(libreyolo, case.libreyolo_class), "INPUT_SIZES", None)
    return known_sizes is None or case.libreyolo_sizes.get(size, size) in known_sizes


def build_libreyolo(family: str, size: str, seed: int = 0) -> Any:
    """A LibreYOLO 1.6 wrapper of ``family``/``size`` at random initialisation (``model_path=None``: no download)."""
    import libreyolo

    case = ORACLE_CASES[family]
    torch.manual_seed(seed)
    keyword = {} if case.num_classes is None else {"nb_classes": case.num_classes}
    wrapper = getattr(libreyolo, case.libreyolo_class)(None, size=case.libreyolo_sizes.get(size, size), device="cpu", **keyword,
                                                       **case.libreyolo_options)
    wrapper.model.eval()  # a fresh LibreYOLO model starts in train mode
    return wrapper


def _max_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor], relative: float) -> float:
    worst = 0.0
    for name, value in first.items():
        other = second[name]
        assert value.shape == other.shape, f"{name}: {tuple(value.shape)} vs {tuple(other.shape)}"
        excess = (value - other).abs() - relative * other.abs()
        worst = max(worst, float(excess.max()))
    return worst


@torch.no_grad()
def compare_on_random_weights(family: str, size: str, workdir: Path) -> dict[str, Any]:
    """LibreYOLO -> zoo -> LibreYOLO on one random model: the two maximum output differences and the parameter counts.

    The LibreYOLO model saves its own checkpoint; ``zoo_core.LibreYOLO`` loads it (converting its
    keys) and must give LibreYOLO's outputs; zoo then writes a LibreYOLO checkpoint, which
    LibreYOLO loads and must give zoo's outputs.
    """
    import libreyolo

    from zoo_core import LibreYOLO
    from zoo_core.building import count_parameters

    case = ORACLE_CASES[family]
    original = workdir / f"libreyolo-{family}-{size}.pt"
    if size in case.zoo_only_sizes:  # LibreYOLO reads this layout from a file only: start from zoo's
        torch.manual_seed(0)
        LibreYOLO(f"{family}-{size}", seed=None).save(workdir / "start.pt", format="libreyolo")
        reference = libreyolo.LibreYOLO(str(workdir / "start.pt"), device="cpu")
        reference.model.eval()
    else:
        reference = build_libreyolo(family, size)
    reference.save(str(original))
    model = LibreYOLO(original)
    model.model.eval()
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(2, 3, case.image_size, case.image_size, generator=generator)
    expected = case.libreyolo_outputs(reference.model, case.libreyolo_input(images))
    loaded = _max_difference(case.zoo_outputs(model.model, case.zoo_input(images)), expected, case.relative)
    written = workdir / f"zoo-{family}-{size}.pt"
    model.save(written, format="libreyolo")
    reloaded = libreyolo.LibreYOLO(str(written), device="cpu")
    reloaded.model.eval()
    back = _max_difference(case.libreyolo_outputs(reloaded.model, case.libreyolo_input(images)),
                           case.zoo_outputs(model.model, case.zoo_input(images)), case.relative)
    return {
        "family": family, "size": size, "zoo_params": count_parameters(model.model),
        "libreyolo_params": count_parameters(reference.model) - sum(
            parameter.numel() for name, parameter in reference.model.named_parameters()
            if any(fragment in name for fragment in case.libreyolo_unused_parameters)) - case.libreyolo_inert_entries(reference.model),
        "loaded_difference": loaded, "written_difference": back,
        "zoo_size": model.size, "reloaded_family": type(reloaded).__name__,
    }
