"""The parameter count of a DETR's deployed form, the form some published tables count.

D-FINE (and DEIM and RT-DETRv4, built on its code) report the parameters of ``model.deploy()``:
the official ``stats`` helper (D-FINE ``src/misc/profiler_utils.py``, printed as ``Params`` at the
top of every official training log) converts the model first, which

- folds the BatchNorm of every conv-BN of the encoder's cross-scale fusion into a conv bias (its
  ``ConvNormLayer_fuse``: laterals, SCDown, the convs of RepNCSPELAN4) — the 1×1 input
  projections and the backbone keep their BatchNorms;
- folds every RepVGG block (3×3 and 1×1 conv-BN branches) into one biased 3×3 conv;
- drops what inference never runs: the class heads and LQE heads of every decoder layer but the
  evaluated one, and the layers (with their heads) after it.

Nothing is converted here: the count is computed from the trainable modules (it works on the
meta device), so ``tests/test_model_params.py`` compares like with like.
"""

from __future__ import annotations

from typing import Iterable

from torch import nn

from zoo_core.detr.fusion_blocks import RepConvBlock
from zoo_core.nn.conv import ConvNormAct

__all__ = ["folded_norm_savings", "deploy_parameter_count"]


def _numel(module: nn.Module | None) -> int:
    return 0 if module is None else sum(parameter.numel() for parameter in module.parameters())


def folded_norm_savings(modules: Iterable[nn.Module]) -> int:
    """Parameters saved by folding the conv-BN pairs and RepVGG blocks inside ``modules``.

    A conv-BN pair (``ConvNormAct``) becomes a biased conv: the BatchNorm's weight and bias (2·C)
    become a bias (C). A ``RepConvBlock`` becomes one biased 3×3 conv: its 1×1 kernel and both
    BatchNorms (4·C) go, a bias (C) comes.
    """
    saved = 0
    for root in modules:
        inside_rep_blocks: set[int] = set()
        for module in root.modules():
            if isinstance(module, RepConvBlock) and module.fused is None:
                saved += module.conv1x1[0].weight.numel() + 3 * module.conv1x1[1].weight.numel()
                inside_rep_blocks.update(id(branch) for branch in (module.conv3x3, module.conv1x1))
            elif isinstance(module, ConvNormAct) and id(module) not in inside_rep_blocks and isinstance(module[1], nn.BatchNorm2d):
                conv, norm = module[0], module[1]
                saved += norm.weight.numel() + norm.bias.numel() - (0 if conv.bias is not None else conv.out_channels)
    return saved


def deploy_parameter_count(model: nn.Module) -> int:
    """The parameters of ``model``'s deployed form (see the module docstring).

    ``model`` is a ``DETRDetector`` whose encoder is a ``HybridEncoder``; its decoder says what
    inference leaves out (``DETRDecoderBase.inference_unused_parameter_count``).
    """
    encoder = model.encoder
    fusion = [getattr(encoder, name) for name in ("lateral", "top_down", "downsample", "bottom_up") if hasattr(encoder, name)]
    # D-FINE's frozen ``up``/``reg_scale`` scalars are parameters upstream (counted), buffers in zoo.
    total = _numel(model) + sum(buffer.numel() for name, buffer in model.decoder.named_buffers(recurse=False) if name in ("up", "reg_scale"))
    return total - folded_norm_savings(fusion) - model.decoder.inference_unused_parameter_count()
