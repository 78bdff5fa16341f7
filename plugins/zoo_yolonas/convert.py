"""State-dict conversion between LibreYOLO 1.6.0 / super-gradients YOLO-NAS and zoo's ``yolonas``.

LibreYOLO keeps super-gradients' module tree (``backbone.stage2.blocks.bottlenecks.0.cv1.
branch_3x3.conv.weight``); zoo names modules by role (``backbone.stages.1.bottlenecks.0.first.
kernel3.weight``). The mapping is a schema of module kinds: each kind lists its children as
(LibreYOLO name, zoo name, child kind), and a key is translated by walking it from the root, so
one table serves both directions (``zoo_core.key_renaming.KeySchema``).

QARepVGG blocks carry a ``rbr_reparam`` conv in LibreYOLO's state dict that the unfused
(training) graph never uses; it is dropped on the way in and rebuilt on the way out as the
block's merged kernel (what LibreYOLO's ``partial_fusion`` would write), since LibreYOLO's
loader looks for it.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F

from zoo_core.key_renaming import DROPPED, LEAF, PARAMETER, KeySchema

__all__ = ["from_libreyolo", "to_libreyolo", "convert", "convert_pose"]

_BN_EPS = 1e-3  # every YOLO-NAS BatchNorm (LibreYOLO sets eps 1e-3 on all of them)

# kind -> [(LibreYOLO child, zoo child, child kind)]; a kind "each:<k>" is a list of <k> indexed alike.
_KINDS: dict[str, list[tuple[str, str | None, str]]] = {
    "rep": [
        ("branch_3x3.conv", "kernel3", LEAF),
        ("branch_3x3.bn", "kernel3_norm", LEAF),
        ("branch_1x1", "kernel1", LEAF),
        ("post_bn", "post_norm", LEAF),
        ("rbr_reparam", None, DROPPED),
    ],
    "conv": [("conv", "0", LEAF), ("bn", "1", LEAF)],
    "seqconv": [("seq.conv", "0", LEAF), ("seq.bn", "1", LEAF)],
    "rep_bottleneck": [("cv1", "first", "rep"), ("cv2", "second", "rep"), ("alpha", "residual_scale", PARAMETER)],
    "conv_bottleneck": [("cv1", "first", "conv"), ("cv2", "second", "conv"), ("alpha", "residual_scale", PARAMETER)],
    "rep_csp": [
        ("conv1", "project", "conv"),
        ("conv2", "bypass", "conv"),
        ("conv3", "mix", "conv"),
        ("bottlenecks", "bottlenecks", "each:rep_bottleneck"),
    ],
    "conv_csp": [
        ("conv1", "project", "conv"),
        ("conv2", "bypass", "conv"),
        ("conv3", "mix", "conv"),
        ("bottlenecks", "bottlenecks", "each:conv_bottleneck"),
    ],
    "spp": [("cv1", "reduce", "conv"), ("cv2", "mix", "conv")],
    "top_down": [
        ("conv", "reduce_deep", "conv"),
        ("upsample", "upsample", LEAF),
        ("reduce_skip1", "reduce_lateral", "conv"),
        ("reduce_skip2", "reduce_finer", "conv"),
        ("downsample", "downsample_finer", "conv"),
        ("reduce_after_concat", "merge", "conv"),
        ("blocks", "csp", "rep_csp"),
    ],
    "bottom_up": [("conv", "downsample", "conv"), ("blocks", "csp", "conv_csp")],
    "root": [
        ("backbone.stem.conv", "backbone.stem", "rep"),
        *((f"backbone.stage{n}.downsample", f"backbone.downsamples.{n - 1}", "rep") for n in range(1, 5)),
        *((f"backbone.stage{n}.blocks", f"backbone.stages.{n - 1}", "rep_csp") for n in range(1, 5)),
        ("backbone.context_module", "backbone.spp", "spp"),
        ("neck.neck1", "neck.top_down_p4", "top_down"),
        ("neck.neck2", "neck.top_down_p3", "top_down"),
        ("neck.neck3", "neck.bottom_up_p4", "bottom_up"),
        ("neck.neck4", "neck.bottom_up_p5", "bottom_up"),
        *((f"heads.head{n}.stem", f"head.stems.{n - 1}", "seqconv") for n in range(1, 4)),
        *((f"heads.head{n}.cls_convs.0", f"head.class_convs.{n - 1}", "seqconv") for n in range(1, 4)),
        *((f"heads.head{n}.reg_convs.0", f"head.box_convs.{n - 1}", "seqconv") for n in range(1, 4)),
        *((f"heads.head{n}.cls_pred", f"head.class_preds.{n - 1}", LEAF) for n in range(1, 4)),
        *((f"heads.head{n}.reg_pred", f"head.box_preds.{n - 1}", LEAF) for n in range(1, 4)),
    ],
}
_SCHEMA = KeySchema(_KINDS, what="YOLO-NAS module")

# YOLO-NAS-Pose (LibreYOLONASPoseModel): the detector's backbone and neck, its own head (plugins/zoo_yolonas/pose.py).
_POSE_KINDS = {
    **_KINDS,
    "root": [
        *(entry for entry in _KINDS["root"] if not entry[0].startswith("heads.")),
        *((f"heads.head{n}.bbox_stem", f"head.stems.{n - 1}", "seqconv") for n in range(1, 4)),
        *((f"heads.head{n}.pose_stem", f"head.pose_stems.{n - 1}", "seqconv") for n in range(1, 4)),
        *((f"heads.head{n}.cls_convs.0", f"head.class_convs.{n - 1}", "seqconv") for n in range(1, 4)),
        *((f"heads.head{n}.reg_convs.0", f"head.box_convs.{n - 1}", "seqconv") for n in range(1, 4)),
        *((f"heads.head{n}.pose_convs", f"head.pose_convs.{n - 1}", "each:seqconv") for n in range(1, 4)),
        *((f"heads.head{n}.cls_pred", f"head.class_preds.{n - 1}", LEAF) for n in range(1, 4)),
        *((f"heads.head{n}.reg_pred", f"head.box_preds.{n - 1}", LEAF) for n in range(1, 4)),
        *((f"heads.head{n}.pose_pred", f"head.pose_preds.{n - 1}", LEAF) for n in range(1, 4)),
    ],
}
_POSE_SCHEMA = KeySchema(_POSE_KINDS, what="YOLO-NAS-Pose module")


def _strip_prefixes(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state_dict.items():
        for prefix in ("module.", "net.", "ema_net."):
            if key.startswith(prefix):
                key = key[len(prefix) :]
        out[key] = value
    return out


def from_libreyolo(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO (or super-gradients) YOLO-NAS state dict in zoo's keys (``rbr_reparam`` dropped)."""
    return _SCHEMA.to_zoo(_strip_prefixes(state_dict))


def _merged_rep_kernel(state: Mapping[str, torch.Tensor], prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The QARepVGG branch sum as one 3×3 conv (before ``post_bn``), from LibreYOLO-keyed tensors."""
    kernel = state[f"{prefix}.branch_3x3.conv.weight"].float()
    gamma, beta = state[f"{prefix}.branch_3x3.bn.weight"].float(), state[f"{prefix}.branch_3x3.bn.bias"].float()
    mean, var = state[f"{prefix}.branch_3x3.bn.running_mean"].float(), state[f"{prefix}.branch_3x3.bn.running_var"].float()
    scale = gamma / torch.sqrt(var + _BN_EPS)
    weight = kernel * scale.reshape(-1, 1, 1, 1) + F.pad(state[f"{prefix}.branch_1x1.weight"].float(), (1, 1, 1, 1))
    bias = beta - mean * scale + state[f"{prefix}.branch_1x1.bias"].float()
    if ".bottlenecks." in prefix:  # QARepVGG blocks inside bottlenecks have the identity branch
        index = torch.arange(weight.shape[0])
        weight[index, index, 1, 1] += 1.0
    return weight.to(kernel.dtype), bias.to(kernel.dtype)


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor], schema: KeySchema = _SCHEMA) -> dict[str, torch.Tensor]:
    """A zoo ``yolonas`` state dict (unfused) in LibreYOLO 1.6.0's keys, ``rbr_reparam`` rebuilt.

    ``size`` is accepted for the common converter signature; the key mapping is the same for
    every size.
    """
    del size
    if any(key.endswith(".fused.weight") for key in state_dict):
        raise ValueError("this YOLO-NAS state dict is fused (model.fuse()); convert the training form instead")
    converted = schema.from_zoo(state_dict)
    rep_prefixes = [key[: -len(".branch_3x3.conv.weight")] for key in converted if key.endswith(".branch_3x3.conv.weight")]
    for prefix in rep_prefixes:
        weight, bias = _merged_rep_kernel(converted, prefix)
        converted[f"{prefix}.rbr_reparam.weight"] = weight
        converted[f"{prefix}.rbr_reparam.bias"] = bias
    return converted


def _from_upstream(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """super-gradients' keys (LibreYOLO's, under ``net.``/``ema_net.``), stem turned to RGB input.

    super-gradients' COCO models were trained on BGR images (their ``processing_params`` reverse
    the channels); zoo, like LibreYOLO, feeds RGB, so the stem's input channels are reversed
    once here and the model then computes the published function of an RGB image.
    """
    converted = from_libreyolo(state_dict)
    for key in ("backbone.stem.kernel3.weight", "backbone.stem.kernel1.weight"):
        if key in converted:
            converted[key] = converted[key].flip(1)
    return converted


def convert(size: str, state_dict: Mapping[str, torch.Tensor], source: str, target: str) -> dict[str, torch.Tensor] | None:
    """The registry ``converter`` of yolonas; None for other layouts, or when the keys are not that layout.

    - ``libreyolo`` → zoo: LibreYOLO 1.6 checkpoints (``rbr_reparam`` dropped);
    - ``upstream`` → zoo: super-gradients ``yolo_nas_{s,m,l}`` state dicts (same module names,
      ``net.``/``ema_net.`` prefixes stripped, the stem turned to RGB input: ``_from_upstream``);
    - zoo → ``libreyolo``: ``to_libreyolo`` (``rbr_reparam`` rebuilt).
    """
    if source == "zoo" and target == "libreyolo":
        return to_libreyolo(size, state_dict)
    if target != "zoo" or source not in ("libreyolo", "upstream"):
        return None
    try:
        return from_libreyolo(state_dict) if source == "libreyolo" else _from_upstream(state_dict)
    except KeyError:  # not this layout (e.g. a file already in zoo's keys)
        return None


def convert_pose(size: str, state_dict: Mapping[str, torch.Tensor], source: str, target: str) -> Any:
    """The registry ``converter`` of yolonas_pose (LibreYOLO 1.6's ``LibreYOLONASPoseModel`` layout, both ways).

    LibreYOLO → zoo returns the tensors with the build option ``num_keypoints`` their ``pose_pred`` has (2 channels a
    point); super-gradients' own ``yolo_nas_pose_*`` files (``net.``/``ema_net.`` prefixes, BGR stem) as ``upstream``.
    """
    from zoo_core.building import ConvertedWeights

    if source == "zoo" and target == "libreyolo":
        return to_libreyolo(size, state_dict, _POSE_SCHEMA)
    if target != "zoo" or source not in ("libreyolo", "upstream"):
        return None
    try:
        converted = _POSE_SCHEMA.to_zoo(_strip_prefixes(state_dict))
    except KeyError:
        return None
    if "head.pose_preds.0.weight" not in converted:
        return None
    if source == "upstream":
        for key in ("backbone.stem.kernel3.weight", "backbone.stem.kernel1.weight"):
            if key in converted:
                converted[key] = converted[key].flip(1)
    return ConvertedWeights(converted, options={"num_keypoints": int(converted["head.pose_preds.0.weight"].shape[0]) // 2})
