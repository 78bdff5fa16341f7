"""LibreYOLO 1.6's ``predict()`` as the oracle of zoo's: the same checkpoint file, the same images, the same results.

``tests/oracle_cases.py`` compares the networks (decoded tensors on a tensor batch); this module compares
the whole pipeline a user runs: reading a PNG, resizing / letterboxing / normalising it, the network,
and the postprocessing back to original-image pixels (thresholds, NMS, top-k, un-letterboxing, clipping).

``compare_predictions(family, size, workdir)``:

1. writes two deterministic, photo-like, non-square PNGs (481×640 and 640×478, height×width; half that for
   NAFNet, which restores at full resolution);
2. builds the LibreYOLO wrapper of ``family``/``size`` at random initialisation (``build_libreyolo``) and
   perturbs it (``PERTURBATIONS``, seeded) so that predictions mean something: every normalisation layer gets
   non-trivial statistics and affine terms (BatchNorms relative to what they see on the two images, as
   LibreYOLO's predict preprocesses them), zero-initialised residual gates are drawn, and the score and box
   heads are re-scaled so that their outputs have a chosen spread on the two images (a handful of
   detections score well above the rest, none saturates, the box sizes vary);
3. saves it with LibreYOLO's own ``wrapper.save(path)``;
4. predicts on each image with LibreYOLO (the wrapper LibreYOLO loads from the saved file, in eval mode) and
   with ``zoo_core.LibreYOLO(path)``, with the same ``imgsz``, ``conf``, ``iou`` and ``max_det``;
5. compares the results per task (``PredictionComparison.passes`` holds the thresholds):

   - detect: LibreYOLO's top-30 boxes (by score), each matched greedily one-to-one to a zoo box of the same
     class with IoU >= 0.98 and |score difference| <= 1e-3; passes at >= 95 % matched;
   - segment: the same matching of boxes, and the matched instances' masks (at the original size) with
     >= 99.9 % of their pixels equal over each image's matched pairs;
   - points: the same with the points within 1 px;
   - classify: the same top-5 classes in the same order and every probability within 1e-4;
   - semantic: >= 99.9 % of the pixels of the same class;
   - restore: every level within 1 of LibreYOLO's.

``tests/test_libreyolo_predictions.py`` runs the smallest size of every family;
``benchmarks/libreyolo_oracle.py --predictions`` runs every size and prints a table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from .family_checks import BATCH_NORM_STYLES
from .oracle_cases import ORACLE_CASES, _fill_dinov3_bias_masks, _max_difference, build_libreyolo

__all__ = [
    "PERTURBATIONS", "PREDICT_SETTINGS", "IMAGE_SHAPES", "RESTORE_IMAGE_SHAPES", "PredictionComparison", "ImageComparison", "compare_predictions",
    "perturb", "write_test_images", "photo_like_image",
]

# ------------------------------------------------------------------------------ thresholds (the criteria)
TOP_K = 30  # detect / points: LibreYOLO's best 30 items are matched
BOX_IOU = 0.98
SCORE_TOLERANCE = 1e-3
POINT_DISTANCE = 1.0  # pixels
MATCHED_FRACTION = 0.95
PROBABILITY_TOLERANCE = 1e-4
PIXEL_FRACTION = 0.999
LEVEL_TOLERANCE = 1

IMAGE_SHAPES = ((481, 640), (640, 478))  # height × width: one landscape, one portrait; odd sides test rounding
# NAFNet restores at the image's own size (imgsz is ignored): half the sides keep it to a few seconds; 241 and
# 239 still need padding to a multiple of 16 (to 256 and 240)
RESTORE_IMAGE_SHAPES = ((241, 320), (320, 239))


# ------------------------------------------------------------------------------ predict settings per family
@dataclass(frozen=True)
class PredictSettings:
    """The ``predict`` arguments both libraries get: the smallest sensible input (a multiple of 32 where the
    family asks for one) and the thresholds (conf 0.001 keeps almost every candidate for detection)."""

    imgsz: int
    conf: float = 0.001
    iou: float = 0.45
    max_det: int = 300

    def arguments(self) -> dict[str, Any]:
        return {"imgsz": self.imgsz, "conf": self.conf, "iou": self.iou, "max_det": self.max_det}


_CLASSIFY = PredictSettings(224)  # the classifiers' native size (their crop_pct decides the resize before the crop)
PREDICT_SETTINGS: dict[str, PredictSettings] = {
    **{family: _CLASSIFY for family in ("resnet", "convnext", "convnextv2", "efficientnetv2", "mobilenetv4")},
    **{family: PredictSettings(320) for family in (
        "yolo9", "yolo9_e2e", "yolo7", "yolox", "yolonas", "picodet", "rtmdet",
        "rtdetr", "dfine", "deim", "rtdetrv4", "deimv2", "rfdetr", "ec",
        "segformer", "ppliteseg", "rtmdet_ins", "dfine_seg")},
    "unet": PredictSettings(160),  # a multiple of its 16; the full-resolution U-Net costs a second a call at 320
    "fomo": PredictSettings(96),  # FOMO-s's native side; a 12×12 grid of cells
    "nafnet": PredictSettings(256),  # ignored by both: restoration runs at the image's own size
}


# ------------------------------------------------------------------------------ what is perturbed, per family
@dataclass(frozen=True)
class HeadTarget:
    """Output channels of a head and the mean/std its outputs get on the two test images.

    ``channels(out_channels)`` lists the channels concerned (None: all). ``per_channel``: each channel is
    standardised over positions (dense heads, queries); otherwise all selected outputs together (a classifier
    sees one vector per image: its logits are spread across classes). ``top``: the largest logit is at most
    this less a seeded jitter in [0, 1) per channel (the scale shrinks where a channel's tail is long), so no score
    saturates at 1.0 and no two channels' best scores tie. ``choose_sign`` (score logits): each channel takes the
    sign whose highest values repeat least, so a flat letterbox pad (the same logit at many positions) scores
    low instead of tying for first place. ``constant``: the channels are set to ``mean`` everywhere (weights
    zeroed), for logits that must never win.
    """

    mean: float
    std: float
    channels: Callable[[int], list[int]] | None = None
    per_channel: bool = True
    top: float | None = None
    choose_sign: bool = False
    constant: bool = False


@dataclass(frozen=True)
class Perturbation:
    """How a family's random LibreYOLO model is made to predict something worth comparing.

    ``batch_norms``: the ``tests.family_checks.BATCH_NORM_STYLES`` style whose draws every BatchNorm gets,
    relative to the statistics of its input on the test images (``_calibrate_batch_norms``; None: the family has
    no BatchNorm). Every other normalisation layer with affine terms (LayerNorm, LayerNorm2d, RMSNorm) gets
    weights in [0.75, 1.25] and biases N(0, 0.1²). ``gates``: names (or name endings) of zero- or
    1e-6-initialised residual gates (NAFNet's beta/gamma, ConvNeXt's layer scale, ConvNeXt V2's GRN), drawn
    N(0, 0.2²) so that the blocks behind them count. ``heads``: regular expressions of module names (full match)
    whose outputs are score logits or box regressions, each with its ``HeadTarget``s (applied in order); or a
    function of the LibreYOLO model that returns them (RTMDet: exp or linear distances, per size).
    """

    batch_norms: str | None
    heads: dict[str, tuple[HeadTarget, ...]] | Callable[[nn.Module], dict[str, tuple[HeadTarget, ...]]]
    why: str
    gates: tuple[str, ...] = ()


def _first(count: int) -> Callable[[int], list[int]]:
    return lambda channels: list(range(min(count, channels)))


def _from(start: int) -> Callable[[int], list[int]]:
    return lambda channels: list(range(start, channels))


def _yolo7_channels(offset: slice) -> Callable[[int], list[int]]:
    """YOLOv7's head conv: 3 anchors × (x, y, w, h, obj, classes...); ``offset`` picks within an anchor's block."""

    def channels(out_channels: int) -> list[int]:
        block = out_channels // 3
        return [anchor * block + index for anchor in range(3) for index in range(block)[offset]]

    return channels


_SCORES = HeadTarget(-4.0, 1.5, top=2.5, choose_sign=True)  # sigmoid: typically 0.018, the best few 0.5-0.92
_SIGMOID = (_SCORES,)
_DETR = (HeadTarget(-3.0, 1.5, top=2.5, choose_sign=True),)
_DFL = (HeadTarget(0.0, 1.0),)  # distribution-focal box bins: box sides vary from anchor to anchor
_CLASSIFIER = (HeadTarget(0.0, 2.5, per_channel=False),)
_SEMANTIC = (HeadTarget(0.0, 2.0),)


def _rtmdet_heads(model: nn.Module) -> dict[str, tuple[HeadTarget, ...]]:
    distances = HeadTarget(1.1, 0.35) if getattr(model.head, "exp_on_reg", False) else HeadTarget(3.0, 1.0)  # ×stride
    return {r"head\.rtm_cls\.\d+": _SIGMOID, r"head\.rtm_reg\.\d+": (distances,)}


def _rtmdet_ins_heads(model: nn.Module) -> dict[str, tuple[HeadTarget, ...]]:
    del model  # every RTMDet-Ins size regresses relu(output) × stride
    return {r"head\.rtm_cls\.\d+": _SIGMOID, r"head\.rtm_reg\.\d+": (HeadTarget(3.0, 1.0),),
            r"head\.rtm_kernel\.\d+": (HeadTarget(0.0, 0.5),), r"head\.mask_head\.projection": (HeadTarget(0.0, 1.0),)}


PERTURBATIONS: dict[str, Perturbation] = {
    # dense detectors: sigmoid class scores per (anchor, class); the box regressions spread too (with BatchNorm
    # outputs kept small, see _BATCH_NORM_GAIN, an untouched box head gives every anchor the same box size)
    "yolo9": Perturbation("wide", {r"head\.cv3\.\d+\.2": _SIGMOID, r"head\.cv2\.\d+\.2": _DFL},
                          "class convs (multi-label NMS) and DFL box convs"),
    "yolo9_e2e": Perturbation("wide", {r"head\.(one2one_)?cv3\.\d+\.2": _SIGMOID, r"head\.(one2one_)?cv2\.\d+\.2": _DFL},
                              "one-to-one class and DFL box convs (the eval path: top-k, no NMS)"),
    "rtmdet": Perturbation("wide", _rtmdet_heads, "class convs; distance convs about 3 strides (linear) or e^1.1 (exp)"),
    "rtmdet_ins": Perturbation("wide", _rtmdet_ins_heads, "class convs, distance convs about 3 strides, the dynamic-kernel "
                               "parameters and the mask features spread (masks with edges)"),
    "yolonas": Perturbation("uniform", {r"heads\.head\d+\.cls_pred": _SIGMOID, r"heads\.head\d+\.reg_pred": _DFL},
                            "class convs and DFL box convs of the three heads"),
    "picodet": Perturbation("uniform", {r"head\.gfl_cls\.\d+": (
        HeadTarget(-4.0, 1.5, channels=_first(3), top=2.5, choose_sign=True), HeadTarget(0.0, 1.0, channels=_from(3)))},
                            "the shared cls+DFL conv: its first nc channels as scores, the rest as DFL bins"),
    "yolox": Perturbation("narrow", {
        r"head\.obj_preds\.\d+": (HeadTarget(-2.0, 1.5, top=2.5, choose_sign=True),),
        r"head\.cls_preds\.\d+": (HeadTarget(-1.5, 1.5, top=2.5, choose_sign=True),),
        r"head\.reg_preds\.\d+": (HeadTarget(0.0, 0.5, channels=_first(2)), HeadTarget(1.0, 0.4, channels=_from(2)))},
                          "score = obj × cls: both convs spread; box offsets ±0.5 cell, sides e^(1±0.4) strides"),
    "yolo7": Perturbation("narrow", {r"layers\.\d+\.heads\.\d+\.head_conv": (
        HeadTarget(-2.0, 1.5, channels=_yolo7_channels(slice(4, 5)), top=2.5, choose_sign=True),
        HeadTarget(-1.5, 1.5, channels=_yolo7_channels(slice(5, None)), top=2.5, choose_sign=True),
        HeadTarget(0.0, 1.0, channels=_yolo7_channels(slice(0, 4))))},
                          "score = obj × cls per anchor: the obj, class and xywh channels of each anchor block"),
    # DETRs: sigmoid scores per (query, class), top-k over queries × classes, no NMS
    **{family: Perturbation("narrow", {r"decoder\.dec_score_head\.\d+": _DETR}, "decoder class heads (the last one scores)")
       for family in ("rtdetr", "dfine", "dfine_seg", "deim", "rtdetrv4", "deimv2", "ec")},
    "rfdetr": Perturbation(None, {r"model\.class_embed": (HeadTarget(-3.0, 1.5, channels=_first(3), top=2.5, choose_sign=True),
                                                          HeadTarget(-20.0, 0.0, channels=lambda n: [n - 1], constant=True))},
                           "class_embed: the nc class logits spread; its extra last logit (no class: zoo drops it, "
                           "LibreYOLO would report it as class nc) pinned at -20"),
    # points: softmax over background + classes per cell
    "fomo": Perturbation("uniform", {r"head": (HeadTarget(1.0, 1.5, channels=_first(1)),
                                               HeadTarget(0.0, 1.5, channels=_from(1), top=4.0, choose_sign=True))},
                         "the cell conv: background channel 0 a little ahead, classes spread"),
    # classification: softmax over classes of one image
    "resnet": Perturbation("narrow", {r"fc": _CLASSIFIER}, "the fc logits spread across classes"),
    "convnext": Perturbation(None, {r"head\.fc": _CLASSIFIER}, "head.fc; layer scale (1e-6 at init) drawn",
                             gates=("gamma",)),
    "convnextv2": Perturbation(None, {r"head": _CLASSIFIER}, "head; GRN gamma/beta (0 at init) drawn",
                               gates=("grn.gamma", "grn.beta")),
    "efficientnetv2": Perturbation("narrow", {r"classifier": _CLASSIFIER}, "the classifier logits spread"),
    "mobilenetv4": Perturbation("narrow", {r"classifier": _CLASSIFIER}, "the classifier logits spread"),
    # semantic segmentation: argmax over per-pixel class logits
    "segformer": Perturbation("narrow", {r"decode_head\.classifier": _SEMANTIC}, "the class conv: classes share the image"),
    "ppliteseg": Perturbation("narrow", {r"seg_head\.\d+\.seg_head\.2": _SEMANTIC},
                              "the main head's class conv (no bias: scaled only)"),
    "unet": Perturbation("narrow", {r"decode_head\.conv_seg": _SEMANTIC}, "the decode head's class conv"),
    # restoration: the residual the network adds to the image
    "nafnet": Perturbation(None, {r"ending": (HeadTarget(0.0, 0.08, per_channel=False),)},
                           "the ending conv: a residual of about 20 levels; block gates beta/gamma (0 at init) drawn",
                           gates=("beta", "gamma")),
}


@torch.no_grad()
def _randomise_other_norms(model: nn.Module, seed: int) -> None:
    """LayerNorm-like layers (every module with its own 1-D ``weight`` whose class name has "Norm", BatchNorm aside)."""
    generator = torch.Generator().manual_seed(seed + 1)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) or "Norm" not in type(module).__name__:
            continue
        weight, bias = module._parameters.get("weight"), module._parameters.get("bias")
        if weight is not None and weight.dim() == 1:
            weight.copy_(torch.rand(weight.shape, generator=generator) * 0.5 + 0.75)
        if bias is not None and bias.dim() == 1:
            bias.copy_(torch.randn(bias.shape, generator=generator) * 0.1)


@torch.no_grad()
def _draw_gates(model: nn.Module, fragments: tuple[str, ...], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed + 2)
    for name, parameter in model.named_parameters():
        if any(name.endswith(fragment) or f".{fragment}" in name for fragment in fragments):
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)


def _network_inputs(wrapper: Any, images: list[Path], settings: PredictSettings) -> list[torch.Tensor]:
    """The tensors LibreYOLO's ``predict`` feeds its network for ``images`` (its own preprocessing)."""
    captured: list[torch.Tensor] = []
    original = wrapper._forward

    def capture(input_tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        captured.append(input_tensor.detach().clone())
        return original(input_tensor, *args, **kwargs)

    wrapper._forward = capture
    try:
        for image in images:
            wrapper.predict(str(image), **settings.arguments())
    finally:
        del wrapper._forward  # the class's method again
    return captured


@torch.no_grad()
def _forward_with_hooks(wrapper: Any, inputs: list[torch.Tensor], hooks: list[tuple[nn.Module, str, Callable]]) -> None:
    """LibreYOLO's network forward (``wrapper._forward``) on ``inputs`` as one batch (one call per input where
    their shapes differ: NAFNet's full-resolution images) with ``(module, "pre"/"post", hook)`` hooks in place."""
    handles = [module.register_forward_pre_hook(hook) if kind == "pre" else module.register_forward_hook(hook)
               for module, kind, hook in hooks]
    try:
        if all(tensor.shape == inputs[0].shape for tensor in inputs):
            wrapper._forward(torch.cat(inputs))
        else:
            for tensor in inputs:
                wrapper._forward(tensor)
    finally:
        for handle in handles:
            handle.remove()


# BatchNorm outputs (the weights and biases drawn) are scaled by this: at the styles' unit scale a random network
# is chaotic (SiLU/ReLU far from linear at every layer), and float32 rounding (zoo predicts with BatchNorms folded
# into the convolutions, LibreYOLO without) grows from 1e-7 to 1e-3 in the scores through YOLOv9-t's 200 layers,
# the score tolerance itself; at 0.1 it stays near 1e-5 (measured against float64). The heads are calibrated after.
_BATCH_NORM_GAIN = 0.1


@torch.no_grad()
def _calibrate_batch_norms(wrapper: Any, style: str, inputs: list[torch.Tensor], seed: int) -> int:
    """``tests.family_checks.randomise_batch_norms``'s draws, relative to what each BatchNorm sees on ``inputs``.

    Drawn statistics alone (``randomise_batch_norms``) leave a deep random network's activations to drift: a
    BatchNorm whose input is 100 times smaller than its running variance says outputs a constant, and the
    classifiers (EfficientNetV2, MobileNetV4) then give the same probabilities for every image. Here each
    BatchNorm, in forward order during one forward of both test images, measures its input's per-channel mean ``m`` and
    standard deviation ``s`` and takes running mean ``m + s·d`` and running variance ``s²·v`` with ``d``, ``v``
    drawn as the style draws the mean and variance, and the style's weight and bias: every layer's output is
    then of order one, whatever the depth. Returns the number of BatchNorms calibrated.
    """
    draw_mean, draw_var, draw_weight, draw_bias = BATCH_NORM_STYLES[style]
    generator = torch.Generator().manual_seed(seed)
    done: set[int] = set()

    def calibrate(module: nn.modules.batchnorm._BatchNorm, inputs: tuple[torch.Tensor, ...]) -> None:
        if id(module) in done:
            return
        done.add(id(module))
        x = inputs[0].detach().float()
        dims = [dim for dim in range(x.dim()) if dim != 1]
        mean, std = x.mean(dims), x.std(dims) if x[:, 0].numel() > 1 else torch.ones(x.shape[1])
        std = torch.maximum(std, 0.1 * std.median().clamp_min(1e-6))  # near-constant channels are not blown up
        count = module.num_features
        module.running_mean.copy_(mean + std * draw_mean(generator, count))
        module.running_var.copy_(std.square() * draw_var(generator, count))
        if module.weight is not None:
            module.weight.copy_(draw_weight(generator, count) * _BATCH_NORM_GAIN)
            module.bias.copy_(draw_bias(generator, count) * _BATCH_NORM_GAIN)

    norms = [module for module in wrapper.model.modules() if isinstance(module, nn.modules.batchnorm._BatchNorm)]
    _forward_with_hooks(wrapper, inputs, [(module, "pre", calibrate) for module in norms])
    return len(done)


def _head_modules(model: nn.Module, patterns: dict[str, tuple[HeadTarget, ...]]) -> list[tuple[str, nn.Module, tuple[HeadTarget, ...]]]:
    found = []
    for name, module in model.named_modules():
        for pattern, targets in patterns.items():
            if re.fullmatch(pattern, name) and isinstance(module, (nn.Conv2d, nn.Linear)):
                found.append((name, module, targets))
    return found


def _channel_last(output: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """The module's output as (positions × channels)."""
    if isinstance(module, nn.Conv2d):
        return output.detach().float().movedim(1, -1).reshape(-1, module.out_channels)
    return output.detach().float().reshape(-1, module.out_features)


def _repeats_at_the_top(values: torch.Tensor) -> int:
    """How many of the highest 2 % (at least 10) of ``values`` repeat another within 1e-5 of their spread: the
    positions of a flat letterbox pad, or a canvas border, give the same logit many times."""
    count = min(len(values), max(10, len(values) // 50))
    top = values.topk(count).values
    tolerance = 1e-5 * float(values.std().clamp_min(1e-12))
    return int((top[:-1] - top[1:] <= tolerance).sum())


@torch.no_grad()
def _calibrate_heads(wrapper: Any, perturbation: Perturbation, inputs: list[torch.Tensor], seed: int) -> dict[str, Any]:
    """Re-scale the score heads so that their logits on ``inputs`` (both test images) have the
    targets' mean and spread; heads predict never calls are left as they are. A per-channel target also picks
    the sign whose top logits repeat least (a flat pad region then scores low, not in tied first places). A head
    without a bias (PP-LiteSeg's) is only scaled. Returns each head's raw mean and std."""
    patterns = perturbation.heads(wrapper.model) if callable(perturbation.heads) else perturbation.heads
    heads = _head_modules(wrapper.model, patterns)
    assert heads, f"no module matches {list(patterns)}"
    outputs: dict[str, list[torch.Tensor]] = {}

    def record(name: str) -> Callable:
        return lambda module, inputs, output: outputs.setdefault(name, []).append(_channel_last(output, module))

    _forward_with_hooks(wrapper, inputs, [(module, "post", record(name)) for name, module, _ in heads])
    assert outputs, f"predict called none of {[name for name, _, _ in heads]}"
    raw: dict[str, Any] = {}
    generator = torch.Generator().manual_seed(seed + 3)
    for name, module, targets in heads:
        if name not in outputs:
            continue
        values = torch.cat(outputs[name])
        weight, bias = module.weight, module.bias
        flat = weight.view(weight.shape[0], -1)
        raw[name] = (float(values.mean()), float(values.std()))
        for target in targets:
            channels = target.channels(values.shape[1]) if target.channels is not None else list(range(values.shape[1]))
            if target.constant:
                assert bias is not None, f"{name} has no bias to pin"
                flat[channels] = 0.0
                bias[channels] = target.mean
                continue
            selected = values[:, channels]
            if target.per_channel:
                mean, std = selected.mean(0), selected.std(0).clamp_min(1e-12)
                signs = torch.tensor([1.0 if not target.choose_sign or _repeats_at_the_top(column) <= _repeats_at_the_top(-column)
                                      else -1.0 for column in selected.T])
            else:
                mean, std = selected.mean().expand(len(channels)), selected.std().clamp_min(1e-12).expand(len(channels))
                signs = torch.ones(len(channels))
            scale = target.std / std
            if target.top is not None:  # the largest logit (of the chosen sign) at most ``top`` less a jitter in [0, 1)
                highest = (selected * signs).max(0).values - mean * signs
                ceiling = target.top - torch.rand(len(channels), generator=generator)  # no two channels tie at the top
                scale = torch.minimum(scale, (ceiling - target.mean) / highest.clamp_min(1e-12))
            scale = signs * scale
            flat[channels] *= scale[:, None]
            if bias is not None:
                bias[channels] = (bias[channels] - mean) * scale + target.mean
    return raw


def perturb(wrapper: Any, family: str, images: list[Path], settings: PredictSettings, seed: int = 0) -> dict[str, Any]:
    """Apply ``PERTURBATIONS[family]`` to the LibreYOLO ``wrapper``'s model in place, calibrated on ``images`` as
    LibreYOLO's ``predict`` preprocesses them (deterministic for ``seed``). Returns the heads' raw statistics."""
    perturbation = PERTURBATIONS[family]
    model = wrapper.model
    model.eval()
    _randomise_other_norms(model, seed)
    if perturbation.gates:
        _draw_gates(model, perturbation.gates, seed)
    inputs = _network_inputs(wrapper, images, settings)
    if perturbation.batch_norms is not None:
        _calibrate_batch_norms(wrapper, perturbation.batch_norms, inputs, seed)
    return _calibrate_heads(wrapper, perturbation, inputs, seed)


# ------------------------------------------------------------------------------ test images
def photo_like_image(height: int, width: int, seed: int) -> np.ndarray:
    """A deterministic photo-like ``height``×``width``×3 uint8 RGB image: smooth colour gradients and waves, a
    dozen soft-edged coloured shapes, and a little noise (so that resampling differences show)."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    u, v = x / width, y / height
    phase = rng.uniform(0, 2 * math.pi, 3)
    base = np.stack([
        70 + 120 * u + 25 * np.sin(2 * math.pi * (1.3 * u + 0.4 * v) + phase[0]),
        50 + 140 * v + 25 * np.sin(2 * math.pi * (0.6 * u - 1.1 * v) + phase[1]),
        110 + 60 * np.cos(2 * math.pi * np.hypot(u - 0.4, v - 0.6) * 1.5 + phase[2]),
    ], axis=-1)
    canvas = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    for _ in range(12):
        cx, cy = rng.uniform(0.05, 0.95) * width, rng.uniform(0.05, 0.95) * height
        half_w, half_h = rng.uniform(0.04, 0.2) * width, rng.uniform(0.04, 0.2) * height
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        box = (cx - half_w, cy - half_h, cx + half_w, cy + half_h)
        kind = rng.integers(0, 3)
        if kind == 0:
            draw.ellipse(box, fill=colour)
        elif kind == 1:
            draw.rectangle(box, fill=colour)
        else:
            draw.polygon([(cx, cy - half_h), (cx + half_w, cy + half_h), (cx - half_w, cy + half_h)], fill=colour)
    canvas = canvas.filter(ImageFilter.GaussianBlur(1.2))
    noisy = np.asarray(canvas).astype(np.float64) + rng.normal(0.0, 6.0, (height, width, 3))
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def write_test_images(folder: Path, task: str = "detect") -> list[Path]:
    """The two test images of ``task`` as PNG files in ``folder`` (``IMAGE_SHAPES``, or ``RESTORE_IMAGE_SHAPES``
    for restoration; seeds 0 and 1)."""
    from PIL import Image

    paths = []
    for seed, (height, width) in enumerate(RESTORE_IMAGE_SHAPES if task == "restore" else IMAGE_SHAPES):
        path = folder / f"test-{height}x{width}.png"
        if not path.exists():
            Image.fromarray(photo_like_image(height, width, seed)).save(path)
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------ comparisons
@dataclass
class ImageComparison:
    """One image's figures. ``libreyolo_count``/``zoo_count``: what each predicted (boxes, points, classes,
    pixels, levels); ``considered``/``matched``: LibreYOLO's top items and how many zoo matched (detect,
    points); ``worst``: the largest score difference among the matched (detect, points), probability
    difference (classify), share of differing pixels (semantic) or level difference (restore); ``fraction``:
    the matched share, the share of equal pixels, of levels within 1, or 1.0/0.0 (classify: passes or not);
    ``notes``: what differs, for the failure message."""

    image: str
    libreyolo_count: int = 0
    zoo_count: int = 0
    considered: int = 0
    matched: int = 0
    fraction: float = 0.0
    worst: float = math.nan
    same_top5: bool | None = None
    mask_fraction: float = math.nan  # segment: the share of equal pixels of the matched instances' masks
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class PredictionComparison:
    """``compare_predictions``' figures for one size: per image, overall (``fraction``, ``worst``), ``passes``.

    ``head_statistics``: each calibrated head's raw output mean and std before its re-scaling (a head whose raw
    spread is ~0 would have been amplified from rounding noise).
    """

    family: str
    size: str
    task: str
    settings: PredictSettings
    images: list[ImageComparison]
    head_statistics: dict[str, Any] = field(default_factory=dict)
    # diagnostics, not criteria: the networks alone on the perturbed weights, max |zoo − LibreYOLO| of
    # tests/oracle_cases.py's outputs on the two test images resized to the case's square, with zoo's model as
    # loaded (beyond 1e-4: the weights differ, not the pipelines) and as predict runs it (the fused inference copy).
    # A DETR's outputs are per query after a top-k over encoder tokens: a near-tie there reorders the queries and
    # these figures jump although the predictions may agree.
    network_difference: float = math.nan
    fused_network_difference: float = math.nan
    # whether LibreYOLO left the network it loaded from the checkpoint in train mode (it is predicted in eval mode)
    libreyolo_loaded_in_train_mode: bool = False

    @property
    def fraction(self) -> float:
        """detect/points: the share of LibreYOLO's top items matched, over both images; semantic: the share of
        equal pixels (the worse image); classify: 1.0 when both images pass, else 0.0; restore: the share of levels
        within 1 (the worse image)."""
        if self.task in ("detect", "points", "segment"):
            considered = sum(image.considered for image in self.images)
            return sum(image.matched for image in self.images) / considered if considered else 0.0
        return min(image.fraction for image in self.images)

    @property
    def mask_fraction(self) -> float:
        """segment: the share of equal mask pixels of the matched instances (the worse image); NaN for other tasks."""
        values = [image.mask_fraction for image in self.images]
        return min(values) if values and not any(math.isnan(value) for value in values) else math.nan

    @property
    def worst(self) -> float:
        values = [image.worst for image in self.images if not math.isnan(image.worst)]
        return max(values) if values else math.nan

    @property
    def same_top5(self) -> bool | None:
        if self.task != "classify":
            return None
        return all(image.same_top5 for image in self.images)

    @property
    def passes(self) -> bool:
        if self.task in ("detect", "points", "segment"):
            # a comparison of nothing proves nothing: LibreYOLO must have predicted on every image
            boxes_agree = all(image.considered > 0 for image in self.images) and self.fraction >= MATCHED_FRACTION
            return boxes_agree and (self.task != "segment" or self.mask_fraction >= PIXEL_FRACTION)
        if self.task == "classify":
            return bool(self.same_top5) and self.worst <= PROBABILITY_TOLERANCE
        if self.task == "semantic":
            return self.fraction >= PIXEL_FRACTION
        if self.task == "restore":
            return not math.isnan(self.worst) and self.worst <= LEVEL_TOLERANCE
        raise ValueError(self.task)

    def describe(self) -> str:
        lines = [f"{self.family}-{self.size} ({self.task}, {self.settings.arguments()}): "
                 f"{'passes' if self.passes else 'FAILS'}; fraction {self.fraction:.4f}, worst {self.worst:.3g}"
                 + (f", same top-5 {self.same_top5}" if self.task == "classify" else "")
                 + f"; networks alone differ by {self.network_difference:.2g} (fused for predict: "
                 f"{self.fused_network_difference:.2g})"
                 + ("; LibreYOLO loaded the file in train mode (compared in eval mode)" if self.libreyolo_loaded_in_train_mode else "")]
        for image in self.images:
            lines.append(f"  {image.image}: LibreYOLO {image.libreyolo_count}, zoo {image.zoo_count}, matched "
                         f"{image.matched}/{image.considered}, fraction {image.fraction:.4f}, worst {image.worst:.3g}"
                         + (f", same top-5 {image.same_top5}" if image.same_top5 is not None else "")
                         + (f", mask pixels equal {image.mask_fraction:.5f}" if not math.isnan(image.mask_fraction) else "")
                         + "".join(f"; {key} {value}" for key, value in image.notes.items()))
        return "\n".join(lines)


def _numpy(value: Any) -> np.ndarray:
    if value is None:
        return np.zeros(0)
    if hasattr(value, "data") and not isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.data
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().as_subclass(torch.Tensor).numpy()
    return np.asarray(value)


def _box_iou(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    area1 = (first[:, 2] - first[:, 0]).clip(0) * (first[:, 3] - first[:, 1]).clip(0)
    area2 = (second[:, 2] - second[:, 0]).clip(0) * (second[:, 3] - second[:, 1]).clip(0)
    top_left = np.maximum(first[:, None, :2], second[None, :, :2])
    bottom_right = np.minimum(first[:, None, 2:], second[None, :, 2:])
    inter = (bottom_right - top_left).clip(0).prod(-1)
    union = area1[:, None] + area2[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _match(closeness: np.ndarray, close_enough: np.ndarray, reference_scores: np.ndarray, other_scores: np.ndarray,
           higher_is_closer: bool) -> tuple[int, list[float]]:
    """Greedy one-to-one: each reference item (best score first) takes the closest unused other item that is close
    enough (same class, geometry within bounds, score within tolerance). Returns the count and score differences."""
    pairs = _matched_pairs(closeness, close_enough, higher_is_closer)
    differences = [abs(float(reference_scores[row]) - float(other_scores[column])) for row, column in pairs]
    return len(differences), differences


def _matched_pairs(closeness: np.ndarray, close_enough: np.ndarray, higher_is_closer: bool) -> list[tuple[int, int]]:
    """``_match``'s greedy one-to-one pairs ``(reference row, other column)``."""
    used = np.zeros(closeness.shape[1], dtype=bool)
    pairs = []
    for row in range(closeness.shape[0]):
        allowed = close_enough[row] & ~used
        if not allowed.any():
            continue
        candidates = np.where(allowed, closeness[row], -np.inf if higher_is_closer else np.inf)
        column = int(candidates.argmax() if higher_is_closer else candidates.argmin())
        used[column] = True
        pairs.append((row, column))
    return pairs


def _top(scores: np.ndarray) -> np.ndarray:
    return np.argsort(-scores, kind="stable")[:TOP_K]


def _compare_detections(image: Path, reference: Any, ours: Any) -> ImageComparison:
    name = image.name
    boxes = _numpy(reference.boxes.xyxy).reshape(-1, 4).astype(np.float64)
    scores = _numpy(reference.boxes.conf).reshape(-1).astype(np.float64)
    labels = _numpy(reference.boxes.cls).reshape(-1).astype(np.int64)
    zoo_boxes = _numpy(ours.boxes).reshape(-1, 4).astype(np.float64)
    zoo_scores = _numpy(ours.scores).reshape(-1).astype(np.float64)
    zoo_labels = _numpy(ours.labels).reshape(-1).astype(np.int64)
    order = _top(scores)
    boxes, scores, labels = boxes[order], scores[order], labels[order]
    iou = _box_iou(boxes, zoo_boxes) if len(boxes) and len(zoo_boxes) else np.zeros((len(boxes), len(zoo_boxes)))
    same_class = labels[:, None] == zoo_labels[None, :]
    close_scores = np.abs(scores[:, None] - zoo_scores[None, :]) <= SCORE_TOLERANCE
    matched, differences = _match(iou, same_class & (iou >= BOX_IOU) & close_scores, scores, zoo_scores, True)
    comparison = ImageComparison(name, len(_numpy(reference.boxes.conf).reshape(-1)), len(zoo_scores), len(order), matched,
                                 matched / len(order) if len(order) else 0.0, max(differences) if differences else math.nan)
    comparison.notes.update(_detection_diagnostics(boxes, scores, labels, zoo_boxes, zoo_scores, zoo_labels, iou, same_class))
    return comparison


def _compare_instances(image: Path, reference: Any, ours: Any) -> ImageComparison:
    """The boxes as ``_compare_detections`` matches them, then the masks of the matched pairs pixel by pixel."""
    comparison = _compare_detections(image, reference, ours)
    scores = _numpy(reference.boxes.conf).reshape(-1).astype(np.float64)
    order = _top(scores)
    boxes = _numpy(reference.boxes.xyxy).reshape(-1, 4).astype(np.float64)[order]
    labels = _numpy(reference.boxes.cls).reshape(-1).astype(np.int64)[order]
    masks = _numpy(reference.masks).astype(bool).reshape(len(scores), *(_numpy(reference.masks).shape[1:] or (0, 0)))[order]
    zoo_boxes = _numpy(ours.boxes).reshape(-1, 4).astype(np.float64)
    zoo_scores = _numpy(ours.scores).reshape(-1).astype(np.float64)
    zoo_labels = _numpy(ours.labels).reshape(-1).astype(np.int64)
    zoo_masks = _numpy(ours.masks).astype(bool)
    iou = _box_iou(boxes, zoo_boxes) if len(boxes) and len(zoo_boxes) else np.zeros((len(boxes), len(zoo_boxes)))
    close = (labels[:, None] == zoo_labels[None, :]) & (iou >= BOX_IOU) & (np.abs(scores[order][:, None] - zoo_scores[None, :]) <= SCORE_TOLERANCE)
    pairs = _matched_pairs(iou, close, True)
    if pairs and masks.shape[1:] == zoo_masks.shape[1:]:
        equal = sum(int((masks[row] == zoo_masks[column]).sum()) for row, column in pairs)
        comparison.mask_fraction = equal / (len(pairs) * masks[0].size)
        comparison.notes["mask foreground (LibreYOLO's matched, mean)"] = f"{float(np.mean([masks[row].mean() for row, _ in pairs])):.3f}"
    elif pairs:
        comparison.mask_fraction = 0.0
        comparison.notes["mask shapes"] = f"LibreYOLO {masks.shape[1:]} vs zoo {zoo_masks.shape[1:]}"
    return comparison


def _detection_diagnostics(boxes, scores, labels, zoo_boxes, zoo_scores, zoo_labels, iou, same_class) -> dict[str, Any]:
    """What differs, for the message: the best same-class IoU of LibreYOLO's top items (median), and for those pairs
    the median score difference and box offset; the top scores of each."""
    notes: dict[str, Any] = {
        "top scores": f"{np.round(scores[:3], 4).tolist()} vs {np.round(np.sort(zoo_scores)[::-1][:3], 4).tolist()}",
    }
    if not len(boxes) or not len(zoo_boxes):
        return notes
    masked = np.where(same_class, iou, -1.0)
    best = masked.argmax(1)
    best_iou = masked[np.arange(len(boxes)), best]
    valid = best_iou >= 0
    if not valid.any():
        notes["classes"] = f"no zoo box of LibreYOLO's top classes {sorted(set(labels.tolist()))}"
        return notes
    partner = zoo_boxes[best[valid]]
    offset = np.median(partner - boxes[valid], axis=0)
    notes["best IoU (median, min)"] = f"{float(np.median(best_iou[valid])):.3f}, {float(best_iou[valid].min()):.3f}"
    notes["score diff at best IoU (median)"] = f"{float(np.median(np.abs(zoo_scores[best[valid]] - scores[valid]))):.2e}"
    notes["corner offset zoo-LibreYOLO (median x1,y1,x2,y2)"] = np.round(offset, 2).tolist()
    return notes


def _compare_points(image: Path, reference: Any, ours: Any) -> ImageComparison:
    name = image.name
    points = reference.points
    xy = _numpy(points.xy).reshape(-1, 2).astype(np.float64) if points is not None else np.zeros((0, 2))
    scores = _numpy(points.conf).reshape(-1).astype(np.float64) if points is not None else np.zeros(0)
    labels = _numpy(points.cls).reshape(-1).astype(np.int64) if points is not None else np.zeros(0, dtype=np.int64)
    zoo_xy = _numpy(ours.points).reshape(-1, 2).astype(np.float64)
    zoo_scores = _numpy(ours.scores).reshape(-1).astype(np.float64)
    zoo_labels = _numpy(ours.labels).reshape(-1).astype(np.int64)
    order = _top(scores)
    xy, scores, labels = xy[order], scores[order], labels[order]
    distance = np.linalg.norm(xy[:, None, :] - zoo_xy[None, :, :], axis=-1) if len(zoo_xy) else np.zeros((len(xy), 0))
    same_class = labels[:, None] == zoo_labels[None, :]
    close_scores = np.abs(scores[:, None] - zoo_scores[None, :]) <= SCORE_TOLERANCE
    matched, differences = _match(distance, same_class & (distance <= POINT_DISTANCE) & close_scores, scores, zoo_scores, False)
    comparison = ImageComparison(name, len(_numpy(points.conf).reshape(-1)) if points is not None else 0, len(zoo_scores),
                                 len(order), matched, matched / len(order) if len(order) else 0.0,
                                 max(differences) if differences else math.nan)
    if len(xy) and len(zoo_xy):
        nearest = np.where(same_class, distance, np.inf).min(1)
        finite = nearest[np.isfinite(nearest)]
        comparison.notes["nearest same-class point (median px)"] = f"{float(np.median(finite)):.2f}" if len(finite) else "none"
        comparison.notes["top scores"] = f"{np.round(scores[:3], 4).tolist()} vs {np.round(np.sort(zoo_scores)[::-1][:3], 4).tolist()}"
    return comparison


def _compare_classification(image: Path, reference: Any, ours: Any) -> ImageComparison:
    name = image.name
    probabilities = _numpy(reference.probs).reshape(-1).astype(np.float64)
    zoo_probabilities = _numpy(ours.probs).reshape(-1).astype(np.float64)
    top5 = [int(index) for index in np.argsort(probabilities)[-5:][::-1]]
    zoo_top5 = [int(index) for index in np.argsort(zoo_probabilities)[-5:][::-1]]
    same_shape = probabilities.shape == zoo_probabilities.shape
    worst = float(np.abs(probabilities - zoo_probabilities).max()) if same_shape and probabilities.size else math.inf
    comparison = ImageComparison(name, len(probabilities), len(zoo_probabilities), worst=worst, same_top5=top5 == zoo_top5)
    comparison.fraction = float(top5 == zoo_top5 and worst <= PROBABILITY_TOLERANCE)
    comparison.notes["top5"] = f"{top5} vs {zoo_top5}"
    comparison.notes["top1 probability"] = f"{probabilities.max():.4f} vs {zoo_probabilities.max() if zoo_probabilities.size else math.nan:.4f}"
    return comparison


def _compare_semantic(image: Path, reference: Any, ours: Any) -> ImageComparison:
    name = image.name
    mask = _numpy(reference.semantic_mask).astype(np.int64)
    zoo_mask = _numpy(ours.mask).astype(np.int64)
    comparison = ImageComparison(name, int(mask.size), int(zoo_mask.size))
    comparison.notes["classes"] = f"{np.unique(mask).tolist()} vs {np.unique(zoo_mask).tolist()}"
    if mask.shape != zoo_mask.shape:
        comparison.notes["shape"] = f"{mask.shape} vs {zoo_mask.shape}"
        return comparison
    equal = mask == zoo_mask
    comparison.fraction = float(equal.mean())
    comparison.worst = 1.0 - comparison.fraction
    if not equal.all():
        comparison.notes["differing rows/cols"] = _differing_region(~equal)
    return comparison


def _hwc_levels(value: Any) -> np.ndarray:
    """An image as H×W×3 float64 levels (0-255), from H×W×3 or 3×H×W, uint8 or [0, 1] floats."""
    array = _numpy(value)
    if array.ndim == 3 and array.shape[0] == 3 and array.shape[-1] != 3:
        array = array.transpose(1, 2, 0)
    if array.dtype != np.uint8 and array.size and float(array.max()) <= 1.0:
        array = array * 255.0
    return array.astype(np.float64)


def _differing_region(different: np.ndarray) -> str:
    rows, columns = np.where(different)
    return f"{rows.min()}..{rows.max()} / {columns.min()}..{columns.max()}"


def _compare_restoration(image: Path, reference: Any, ours: Any) -> ImageComparison:
    from PIL import Image

    restored = _hwc_levels(reference.restored.array)
    zoo_restored = _hwc_levels(ours.image)
    comparison = ImageComparison(image.name, int(restored.size), int(zoo_restored.size))
    if restored.shape != zoo_restored.shape:
        comparison.notes["shape"] = f"{restored.shape} vs {zoo_restored.shape}"
        return comparison
    difference = np.abs(restored - zoo_restored)
    comparison.worst = float(difference.max())
    comparison.fraction = float((difference <= LEVEL_TOLERANCE).mean())
    comparison.notes["mean |difference|"] = f"{difference.mean():.3f}"
    if comparison.worst > LEVEL_TOLERANCE:
        comparison.notes["rows/cols beyond 1 level"] = _differing_region((difference > LEVEL_TOLERANCE).any(-1))
    original = np.asarray(Image.open(image).convert("RGB")).astype(np.float64)
    comparison.notes["LibreYOLO's change to the input (mean levels)"] = f"{np.abs(restored - original).mean():.2f}"
    return comparison


_COMPARE = {"detect": _compare_detections, "points": _compare_points, "classify": _compare_classification,
            "semantic": _compare_semantic, "restore": _compare_restoration, "segment": _compare_instances}


def _libreyolo_reference(family: str, size: str, workdir: Path, seed: int) -> Any:
    """The LibreYOLO wrapper to perturb: built at random init (DINOv3's key-bias masks filled), or for a layout
    LibreYOLO only reads from a file (NAFNet's SIDD sizes) loaded from zoo's LibreYOLO checkpoint of it."""
    import libreyolo

    from zoo_core import LibreYOLO

    if size in ORACLE_CASES[family].zoo_only_sizes:
        start = workdir / f"start-{family}-{size}.pt"
        LibreYOLO(f"{family}-{size}", seed=seed).save(start, format="libreyolo")
        wrapper = libreyolo.LibreYOLO(str(start), device="cpu")
        wrapper.model.eval()
        return wrapper
    wrapper = build_libreyolo(family, size, seed=seed)
    _fill_dinov3_bias_masks(wrapper.model)  # DEIMv2 L/X: NaN until a checkpoint fills them (tests/oracle_cases.py)
    return wrapper


def compare_predictions(family: str, size: str, workdir: Path, seed: int = 0) -> PredictionComparison:
    """LibreYOLO's and zoo's ``predict`` on the same perturbed checkpoint and the same two images (module docstring)."""
    import libreyolo

    from zoo_core import LibreYOLO
    from zoo_core.registry import load_registry

    task = load_registry()[family].task
    settings = PREDICT_SETTINGS[family]
    workdir.mkdir(parents=True, exist_ok=True)
    images = write_test_images(workdir, task)
    wrapper = _libreyolo_reference(family, size, workdir, seed)
    head_statistics = perturb(wrapper, family, images, settings, seed)
    checkpoint = workdir / f"libreyolo-{family}-{size}.pt"
    wrapper.save(str(checkpoint))
    reference = libreyolo.LibreYOLO(str(checkpoint), device="cpu")  # the file is the contract: LibreYOLO reads it back
    # LibreYOLO 1.6 leaves D-FINE, DEIM, RT-DETRv4, DEIMv2 and EC networks in train mode when it loads a file (their
    # _load_weights never calls eval()), and predict does not switch: BatchNorms would normalise with the image's
    # own statistics (and update their running ones). The oracle is its eval-mode predict, as users of
    # compare_on_random_weights' reloaded models already do.
    loaded_in_train_mode = reference.model.training
    reference.model.eval()
    zoo = LibreYOLO(checkpoint)
    compared = []
    for image in images:
        expected = reference.predict(str(image), **settings.arguments())
        if isinstance(expected, (list, tuple)):
            (expected,) = expected
        (result,) = zoo.predict(str(image), **settings.arguments())
        compared.append(_COMPARE[task](image, expected, result))
    return PredictionComparison(family, size, task, settings, compared, head_statistics,
                                *_network_differences(family, reference, zoo, images), loaded_in_train_mode)


@torch.no_grad()
def _network_differences(family: str, reference: Any, zoo: Any, images: list[Path]) -> tuple[float, float]:
    """``compare_on_random_weights``'s loaded difference on these weights and on ``images`` (resized to the case's
    square): zoo's model as loaded, and the fused copy its predict runs, against LibreYOLO's network."""
    from PIL import Image

    case = ORACLE_CASES[family]
    side = case.image_size
    batch = torch.stack([
        torch.from_numpy(np.array(Image.open(path).convert("RGB").resize((side, side), Image.Resampling.BILINEAR)))
        .permute(2, 0, 1).float() / 255.0 for path in images])
    expected = case.libreyolo_outputs(reference.model, case.libreyolo_input(batch))
    zoo.model.eval()
    loaded = _max_difference(case.zoo_outputs(zoo.model, case.zoo_input(batch)), expected, case.relative)
    fused = _max_difference(case.zoo_outputs(zoo.inference_model("cpu"), case.zoo_input(batch)), expected, case.relative)
    return loaded, fused
