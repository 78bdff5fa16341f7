"""YOLO-NAS (Deci AI, 2023; super-gradients): a NAS-found detector of quantisation-aware blocks.

Architecture (per size, data from the registry ``config``; the numbers are those of
super-gradients' ``yolo_nas_{s,m,l}_arch_params.yaml`` as LibreYOLO 1.6.0 ports them):

- **backbone**: a QARepVGG stem (stride 2), four stages each made of a stride-2 QARepVGG
  downsample and a CSP block of QARepVGG bottlenecks (the searched "QSP"/"QCI" stages: hidden
  width, depth and whether every bottleneck's output is concatenated come from the search),
  then an SPP (max-pools 5, 9, 13) on the last stage. It returns the stride 4, 8, 16, 32 maps.
- **neck** (PAN with a C2 input): two top-down stages, each fusing a deeper map (1×1 conv,
  learnt 2× transposed-conv upsampling), the same-level map (1×1) and the next finer map
  (1×1 then a stride-2 3×3), then two bottom-up stages (stride-2 3×3 conv, concat, CSP of
  plain 3×3 conv bottlenecks). Outputs at strides 8, 16, 32.
- **head** per level: 1×1 stem, one 3×3 conv per branch, a class logit per class and a
  distribution of 17 bins (``reg_max`` 16) per box side (DFL), decoded like YOLOv8's head.

Every activation is ReLU; BatchNorms use eps 1e-3 / momentum 0.03 (LibreYOLO's settings).
QARepVGG (Chu et al., "Make RepVGG Greater Again", 2022) trains as 3×3+BN, a biased 1×1 and an
identity, summed then normalised by a post-BN; ``fuse()`` merges those into one biased 3×3 conv
(and folds every other BatchNorm), computing the same function.

Loss: PP-YOLOE's (``loss.PPYOLOELoss``): task-aligned assignment, varifocal loss, GIoU and DFL
with weights 1.0 / 2.5 / 0.5, normalised by the batch's (rank-averaged) target-score sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo_core.building import BuildRequest
from zoo_core.nn.conv import ConvNormAct
from zoo_core.nn.detection_head import make_anchor_points
from zoo_core.nn.gelan import fold_batch_norm, fuse_for_inference
from zoo_core.nn.norm import apply_batchnorm_momentum_option
from zoo_core.ops.dense_postprocess import DenseDetectionPostprocess, DenseNMSDefaults
from zoo_yolonas.loss import PPYOLOELoss

__all__ = [
    "YoloNasSpec",
    "QARepVGGBlock",
    "CSPBlock",
    "YoloNasBackbone",
    "YoloNasNeck",
    "YoloNasHead",
    "YoloNas",
    "build_yolonas",
    "decode_yolonas",
    "count_published_parameters",
]

STRIDES = (8, 16, 32)
REG_BINS = 17  # reg_max 16: bins 0..16 strides
BN_EPS, BN_MOMENTUM = 1e-3, 0.03
CLASS_PRIOR = 0.01  # initial class probability of the head
PRE_NMS_TOP_K = 1000  # super-gradients' PPYoloEPostPredictionCallback nms_top_k
BUILD_OPTIONS = ("static_assigner", "bn_momentum")


def _batch_norm(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


def _conv(in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1) -> ConvNormAct:
    return ConvNormAct(in_channels, out_channels, kernel_size, stride, activation="relu", bn_eps=BN_EPS, bn_momentum=BN_MOMENTUM)


def _positive_int(value: Any, key: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return value


def _rows(value: Any, count: int, width: int, key: str, where: str) -> tuple[tuple[Any, ...], ...]:
    if not isinstance(value, (list, tuple)) or len(value) != count:
        raise ValueError(f"{where}: '{key}' must be a list of {count} rows, got {value!r}")
    rows = []
    for index, row in enumerate(value):
        if not isinstance(row, (list, tuple)) or len(row) != width:
            raise ValueError(f"{where}: '{key}[{index}]' must have {width} entries, got {row!r}")
        rows.append(tuple(row))
    return tuple(rows)


@dataclass(frozen=True)
class YoloNasSpec:
    """Widths and depths of one YOLO-NAS size (the ``config`` of its registry entry).

    ``stages`` rows are ``(out, bottlenecks, hidden, concat_intermediates)``; ``neck_up`` and
    ``neck_down`` rows are ``(out, bottlenecks, hidden)``; ``head`` the inner width per level.
    """

    stem: int
    stages: tuple[tuple[int, int, int, bool], ...]
    spp_kernels: tuple[int, ...]
    neck_up: tuple[tuple[int, int, int], ...]
    neck_down: tuple[tuple[int, int, int], ...]
    head: tuple[int, ...]

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str = "yolonas config") -> "YoloNasSpec":
        """Validate a registry ``config`` mapping; errors name the key and the expected form."""
        expected = set(cls.__dataclass_fields__)
        unknown, missing = set(config) - expected, expected - set(config)
        if unknown or missing:
            raise ValueError(
                f"{where}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}; expected exactly {sorted(expected)}"
            )
        stages = []
        for index, (out, depth, hidden, concat) in enumerate(_rows(config["stages"], 4, 4, "stages", where)):
            for name, value in (("out", out), ("bottlenecks", depth), ("hidden", hidden)):
                _positive_int(value, f"stages[{index}].{name}", where)
            if not isinstance(concat, bool):
                raise ValueError(f"{where}: 'stages[{index}]' concat flag must be true or false, got {concat!r}")
            stages.append((out, depth, hidden, concat))

        def int_rows(key: str, count: int, width: int) -> tuple[tuple[int, ...], ...]:
            rows = _rows(config[key], count, width, key, where)
            for index, row in enumerate(rows):
                for value in row:
                    _positive_int(value, f"{key}[{index}]", where)
            return rows

        kernels = config["spp_kernels"]
        if not isinstance(kernels, (list, tuple)) or not kernels or any(
            not isinstance(k, int) or k < 1 or k % 2 == 0 for k in kernels
        ):
            raise ValueError(f"{where}: 'spp_kernels' must be a list of odd positive integers, got {kernels!r}")
        return cls(
            stem=_positive_int(config["stem"], "stem", where),
            stages=tuple(stages),
            spp_kernels=tuple(kernels),
            neck_up=int_rows("neck_up", 2, 3),
            neck_down=int_rows("neck_down", 2, 3),
            head=tuple(_positive_int(v, "head", where) for v in _rows([config["head"]], 1, len(STRIDES), "head", where)[0]),
        )


class QARepVGGBlock(nn.Module):
    """Quantisation-aware RepVGG block: ``relu(post_bn(bn(conv3×3(x)) + conv1×1(x) + x))``.

    Unlike RepVGG, the 1×1 branch has a bias and no BatchNorm and the identity is not
    normalised; one BatchNorm after the sum (QARepVGG's change) keeps the merged kernel's output
    distribution quantisation-friendly. The identity exists when ``identity`` is set (stride 1,
    equal widths). ``fuse()`` folds all of it into one biased 3×3 conv.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, *, identity: bool = False) -> None:
        super().__init__()
        if identity and (in_channels != out_channels or stride != 1):
            raise ValueError("a QARepVGG identity branch needs equal widths and stride 1")
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        self.has_identity = identity
        self.kernel3 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.kernel3_norm = _batch_norm(out_channels)
        self.kernel1 = nn.Conv2d(in_channels, out_channels, 1, stride, 0, bias=True)
        self.post_norm = _batch_norm(out_channels)
        self.activation = nn.ReLU(inplace=True)
        self.fused: nn.Conv2d | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block (the merged conv once ``fuse()`` ran)."""
        if self.fused is not None:
            return self.activation(self.fused(x))
        y = self.kernel3_norm(self.kernel3(x)) + self.kernel1(x)
        if self.has_identity:
            y = y + x
        return self.activation(self.post_norm(y))

    @torch.no_grad()
    def merged_kernel(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The 3×3 kernel and bias equal to the branch sum before ``post_norm`` (eval statistics)."""
        dense = fold_batch_norm(self.kernel3, self.kernel3_norm)
        weight = dense.weight + F.pad(self.kernel1.weight, (1, 1, 1, 1))
        bias = dense.bias + self.kernel1.bias
        if self.has_identity:
            centre = torch.arange(self.out_channels, device=weight.device)
            weight[centre, centre, 1, 1] += 1.0
        return weight, bias

    @torch.no_grad()
    def fuse(self) -> None:
        """Merge the branches and both BatchNorms into one biased 3×3 conv; idempotent."""
        if self.fused is not None:
            return
        weight, bias = self.merged_kernel()
        merged = nn.Conv2d(self.in_channels, self.out_channels, 3, self.stride, 1, bias=True).to(weight)
        merged.weight.copy_(weight)
        merged.bias.copy_(bias)
        self.fused = fold_batch_norm(merged, self.post_norm)
        del self.kernel3, self.kernel3_norm, self.kernel1, self.post_norm


class _Bottleneck(nn.Module):
    """Two 3×3 blocks (QARepVGG or conv-BN-ReLU) and a residual scaled by a learnt scalar."""

    def __init__(self, channels: int, rep: bool) -> None:
        super().__init__()
        if rep:
            self.first: nn.Module = QARepVGGBlock(channels, channels, identity=True)
            self.second: nn.Module = QARepVGGBlock(channels, channels, identity=True)
        else:
            self.first, self.second = _conv(channels, channels, 3), _conv(channels, channels, 3)
        self.residual_scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.residual_scale * x + self.second(self.first(x))


class CSPBlock(nn.Module):
    """CSP: two 1×1 projections to ``hidden``; bottlenecks run on the first; concatenate the
    bypass with the bottlenecks' last output (or, ``concat_intermediates``, with the projection
    and every bottleneck's output); a 1×1 conv mixes the result to ``out_channels``."""

    def __init__(
        self, in_channels: int, out_channels: int, depth: int, hidden: int, *, rep: bool = True, concat_intermediates: bool = False
    ) -> None:
        super().__init__()
        self.project = _conv(in_channels, hidden)
        self.bypass = _conv(in_channels, hidden)
        self.bottlenecks = nn.ModuleList(_Bottleneck(hidden, rep) for _ in range(depth))
        self.concat_intermediates = concat_intermediates
        pieces = depth + 2 if concat_intermediates else 2
        self.mix = _conv(hidden * pieces, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(x)
        kept = [y] if self.concat_intermediates else []
        for bottleneck in self.bottlenecks:
            y = bottleneck(y)
            if self.concat_intermediates:
                kept.append(y)
        if not self.concat_intermediates:
            kept.append(y)
        kept.append(self.bypass(x))
        return self.mix(torch.cat(kept, dim=1))


class _SpatialPyramidPooling(nn.Module):
    """1×1 halving conv, stride-1 max-pools of several sizes, concat, 1×1 conv."""

    def __init__(self, in_channels: int, out_channels: int, kernels: Sequence[int]) -> None:
        super().__init__()
        hidden = in_channels // 2
        self.reduce = _conv(in_channels, hidden)
        self.pools = nn.ModuleList(nn.MaxPool2d(k, stride=1, padding=k // 2) for k in kernels)
        self.mix = _conv(hidden * (len(kernels) + 1), out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.reduce(x)
        return self.mix(torch.cat([x, *(pool(x) for pool in self.pools)], dim=1))


class YoloNasBackbone(nn.Module):
    """QARepVGG stem, four (downsample + CSP) stages and SPP; returns the stride 4, 8, 16, 32 maps."""

    def __init__(self, spec: YoloNasSpec, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = QARepVGGBlock(in_channels, spec.stem, stride=2)
        self.downsamples, self.stages = nn.ModuleList(), nn.ModuleList()
        width = spec.stem
        for out, depth, hidden, concat in spec.stages:
            self.downsamples.append(QARepVGGBlock(width, out, stride=2))
            self.stages.append(CSPBlock(out, out, depth, hidden, concat_intermediates=concat))
            width = out
        self.spp = _SpatialPyramidPooling(width, width, spec.spp_kernels)
        self.out_channels = [out for out, *_ in spec.stages]

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(images)
        levels = []
        for downsample, stage in zip(self.downsamples, self.stages):
            x = stage(downsample(x))
            levels.append(x)
        levels[-1] = self.spp(levels[-1])
        return levels


class _TopDownStage(nn.Module):
    """Fuse a deeper map (1×1, 2× transposed conv), the same-level map (1×1) and the next finer
    map (1×1, stride-2 3×3); concat, 1×1, CSP. Returns the deep map's 1×1 output (reused by the
    bottom-up path) and the fused map."""

    def __init__(self, deep: int, lateral: int, finer: int, out: int, depth: int, hidden: int) -> None:
        super().__init__()
        self.reduce_deep = _conv(deep, out)
        self.upsample = nn.ConvTranspose2d(out, out, kernel_size=2, stride=2)
        self.reduce_lateral = _conv(lateral, out)
        self.reduce_finer = _conv(finer, out)
        self.downsample_finer = _conv(out, out, 3, 2)
        self.merge = _conv(3 * out, out)
        self.csp = CSPBlock(out, out, depth, hidden)

    def forward(self, deep: torch.Tensor, lateral: torch.Tensor, finer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        reduced = self.reduce_deep(deep)
        fused = torch.cat(
            (self.upsample(reduced), self.reduce_lateral(lateral), self.downsample_finer(self.reduce_finer(finer))), dim=1
        )
        return reduced, self.csp(self.merge(fused))


class _BottomUpStage(nn.Module):
    """Stride-2 3×3 conv to half width, concat with the skip map, CSP of plain 3×3 bottlenecks."""

    def __init__(self, in_channels: int, skip: int, out: int, depth: int, hidden: int) -> None:
        super().__init__()
        self.downsample = _conv(in_channels, out // 2, 3, 2)
        self.csp = CSPBlock(out // 2 + skip, out, depth, hidden, rep=False)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.csp(torch.cat((self.downsample(x), skip), dim=1))


class YoloNasNeck(nn.Module):
    """PAN neck with a C2 input: two top-down then two bottom-up stages; outputs strides 8, 16, 32."""

    def __init__(self, spec: YoloNasSpec, backbone_channels: Sequence[int]) -> None:
        super().__init__()
        c2, c3, c4, c5 = backbone_channels
        (up1, up1_depth, up1_hidden), (up2, up2_depth, up2_hidden) = spec.neck_up
        (down1, down1_depth, down1_hidden), (down2, down2_depth, down2_hidden) = spec.neck_down
        self.top_down_p4 = _TopDownStage(c5, c4, c3, up1, up1_depth, up1_hidden)
        self.top_down_p3 = _TopDownStage(up1, c3, c2, up2, up2_depth, up2_hidden)
        self.bottom_up_p4 = _BottomUpStage(up2, up2, down1, down1_depth, down1_hidden)
        self.bottom_up_p5 = _BottomUpStage(down1, up1, down2, down2_depth, down2_hidden)
        self.out_channels = [up2, down1, down2]

    def forward(self, features: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        c2, c3, c4, c5 = features
        reduced5, p4 = self.top_down_p4(c5, c4, c3)
        reduced4, p3 = self.top_down_p3(p4, c3, c2)
        out4 = self.bottom_up_p4(p3, reduced4)
        out5 = self.bottom_up_p5(out4, reduced5)
        return [p3, out4, out5]


class YoloNasHead(nn.Module):
    """Per level: 1×1 stem, a 3×3 conv per branch, class logits and 4 × ``bins`` box logits.

    Output: the dense-head dict of ``zoo_core.nn.detection_head`` (``box_logits`` N×A×4·bins
    side-major, ``class_logits``, ``anchor_points``/``anchor_strides`` in pixels; decoded
    ``boxes``/``scores`` in eval mode).
    """

    def __init__(
        self, num_classes: int, in_channels: Sequence[int], widths: Sequence[int], strides: Sequence[int], bins: int
    ) -> None:
        super().__init__()
        self.num_classes, self.bins, self.strides = num_classes, bins, tuple(strides)
        self.stems = nn.ModuleList(_conv(c, w) for c, w in zip(in_channels, widths))
        self.class_convs = nn.ModuleList(_conv(w, w, 3) for w in widths)
        self.box_convs = nn.ModuleList(_conv(w, w, 3) for w in widths)
        self.class_preds = nn.ModuleList(nn.Conv2d(w, num_classes, 1) for w in widths)
        self.box_preds = nn.ModuleList(nn.Conv2d(w, 4 * bins, 1) for w in widths)
        with torch.no_grad():
            for pred in self.class_preds:
                pred.bias.fill_(-math.log((1 - CLASS_PRIOR) / CLASS_PRIOR))

    def forward(self, features: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        box_logits, class_logits = [], []
        for level, x in enumerate(features):
            x = self.stems[level](x)
            class_logits.append(self.class_preds[level](self.class_convs[level](x)).flatten(2))
            box_logits.append(self.box_preds[level](self.box_convs[level](x)).flatten(2))
        anchor_points, anchor_strides = make_anchor_points(
            [tuple(level.shape[2:]) for level in features], self.strides, device=features[0].device
        )
        outputs = {
            "box_logits": torch.cat(box_logits, dim=2).transpose(1, 2),
            "class_logits": torch.cat(class_logits, dim=2).transpose(1, 2),
            "anchor_points": anchor_points,
            "anchor_strides": anchor_strides,
        }
        if not self.training:
            outputs["boxes"], outputs["scores"] = decode_yolonas(outputs, self.bins)
        return outputs


def decode_yolonas(outputs: Mapping[str, torch.Tensor], bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(boxes N×A×4 xyxy pixels, scores N×A×C)`` of a head dict, in super-gradients' op order.

    Same values as ``zoo_core.nn.detection_head.decode_dense_predictions``; the softmax and the
    expectation run over a bins-first view and boxes are measured in strides, then scaled, as the
    published head does, so decoded boxes match checkpoints' reference outputs to the last bit
    instead of to a few float32 ulps (about 1e-4 pixels at 640).
    """
    box_logits, strides = outputs["box_logits"], outputs["anchor_strides"]
    probabilities = box_logits.unflatten(-1, (4, bins)).permute(0, 3, 1, 2).softmax(dim=1)
    levels = torch.arange(bins, device=box_logits.device, dtype=probabilities.dtype).reshape(1, bins, 1, 1)
    distances = (probabilities * levels).sum(dim=1)
    cells = outputs["anchor_points"] / strides
    boxes = torch.cat((cells - distances[..., :2], cells + distances[..., 2:]), dim=-1) * strides
    return boxes, outputs["class_logits"].sigmoid()


class YoloNas(DenseDetectionPostprocess, nn.Module):
    """The YOLO-NAS detector, zoo's detection model contract.

    - ``forward(images)`` (N×3×H×W RGB in [0, 1], H and W multiples of 32): the head dict.
    - ``loss(outputs, batch)``: PP-YOLOE's loss; ``use_static_assigner`` switches from the
      task-aligned assigner to ATSS (YOLO-NAS's published recipe never does; PP-YOLOE does for its
      first epochs).
    - ``postprocess(outputs, conf, iou, max_det)``: per-class NMS over the 1000 best candidates.
    - ``fuse()``: QARepVGG blocks merged and BatchNorms folded (inference form).
    - ``published_parameter_count()``: the re-parameterised count the published figures use.
    """

    nms_defaults = DenseNMSDefaults(iou=0.7, max_candidates=PRE_NMS_TOP_K)

    def __init__(self, num_classes: int, spec: YoloNasSpec, *, use_static_assigner: bool = False) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, got {num_classes}")
        self.num_classes = num_classes
        self.strides = STRIDES
        self.max_stride = max(STRIDES)
        self.reg_bins = REG_BINS
        self.backbone = YoloNasBackbone(spec)
        self.neck = YoloNasNeck(spec, self.backbone.out_channels)
        self.head = YoloNasHead(num_classes, self.neck.out_channels, spec.head, STRIDES, REG_BINS)
        self.use_static_assigner = use_static_assigner
        self.criterion = PPYOLOELoss(num_classes, REG_BINS)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Dense predictions of ``images``; see the class docstring."""
        if images.dim() != 4 or images.shape[2] % self.max_stride or images.shape[3] % self.max_stride:
            raise ValueError(
                f"YOLO-NAS takes N×3×H×W images with H and W multiples of {self.max_stride}, got {tuple(images.shape)}; "
                "letterbox or resize the input"
            )
        return self.head(self.neck(self.backbone(images)))

    def loss(self, outputs: Mapping[str, Any], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, items)``: weighted varifocal + GIoU + DFL terms (see ``loss.PPYOLOELoss``)."""
        images = batch["images"]
        height, width = images.shape[2:]
        level_sizes = [(height // s) * (width // s) for s in self.strides]
        terms = self.criterion(outputs, batch["targets"], int(images.shape[0]), level_sizes, static=self.use_static_assigner)
        items = {"cls": terms.cls.detach(), "iou": terms.iou.detach(), "dfl": terms.dfl.detach()}
        return terms.total(), items

    def decode(self, outputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(boxes N×A×4 xyxy in input pixels, scores N×A×C)`` from the raw head outputs (``decode_yolonas``)."""
        return decode_yolonas(outputs, self.reg_bins)

    def published_parameter_count(self) -> int:
        """The count Deci publishes (12.18M / 31.92M / 42.02M at 80 classes): the re-parameterised
        model, every QARepVGG block one biased 3×3 conv plus its post-BatchNorm
        (``count_published_parameters``). Works on the meta device."""
        return count_published_parameters(self)

    @torch.no_grad()
    def fuse(self) -> "YoloNas":
        """Inference form: every QARepVGG block merged, every conv's BatchNorm folded (eval mode)."""
        self.eval()
        for module in list(self.modules()):
            if isinstance(module, QARepVGGBlock):
                module.fuse()
        fuse_for_inference(self)
        return self


def count_published_parameters(model: nn.Module) -> int:
    """Parameters of ``model`` in the form YOLO-NAS's published counts use (super-gradients'
    ``prep_model_for_conversion``): every unfused QARepVGG block as one biased 3×3 conv plus its
    post-BatchNorm, every other layer as built. Works on the meta device."""
    blocks = {name: module for name, module in model.named_modules() if isinstance(module, QARepVGGBlock) and module.fused is None}
    total = 0
    for name, parameter in model.named_parameters():
        if name.rsplit(".", 2)[0] not in blocks:
            total += parameter.numel()
    for block in blocks.values():
        total += block.kernel3.weight.numel() + block.out_channels  # the merged kernel and its bias
        total += sum(p.numel() for p in block.post_norm.parameters())
    return total


def build_yolonas(request: BuildRequest) -> YoloNas:
    """The registry builder of ``yolonas``: ``request.config`` is the size's ``YoloNasSpec`` data.

    Options: ``static_assigner`` (bool, default False) starts with PP-YOLOE's ATSS assigner;
    ``bn_momentum`` (float in (0, 1], default 0.03, super-gradients' value) is the weight of
    each batch in the BatchNorm running statistics. A short run (a test, a few hundred steps) is
    validated with statistics still dominated by its first, very different batches at 0.03; a larger
    value lets them follow the weights.
    """
    unknown = sorted(set(request.options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"yolonas does not take the option(s) {unknown}; accepted options: {', '.join(BUILD_OPTIONS)}")
    static = request.options.get("static_assigner", False)
    if not isinstance(static, bool):
        raise ValueError(f"yolonas option static_assigner must be True or False, got {static!r}")
    spec = YoloNasSpec.from_config(request.config, where=f"registry.yaml yolonas size {request.size!r} config")
    model = YoloNas(request.num_classes, spec, use_static_assigner=static)
    return apply_batchnorm_momentum_option(model, request.options, family="yolonas")
