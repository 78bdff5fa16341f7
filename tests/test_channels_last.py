"""Families declared ``channels_last`` train and predict in channels-last memory on a CPU, with the same outputs.

The declaration is an opt-in per family (registry.yaml): channels-last convolutions are faster on a
CPU for convolutional detectors (benchmarks/channels_last.py), but not for every network, and
torch 2.14 gives different outputs or crashes on some (RT-DETR's query selection, YOLO-NAS).
So every family that declares it is checked here, and the engine and ``predict`` are checked to
honour it.
"""

from __future__ import annotations


import pytest
import torch

from zoo_core.facade import LibreYOLO
from zoo_core.registry import load_registry

from .support import use_test_families, write_class_folders

DECLARED = [(family, next(iter(declaration.sizes))) for family, declaration in load_registry().items() if declaration.channels_last]


def test_the_convolutional_detectors_declare_it():
    assert {family for family, _ in DECLARED} >= {"yolo9", "yolo7", "yolox", "rtmdet", "picodet", "fomo"}


@pytest.mark.parametrize(("family", "size"), DECLARED, ids=[f"{family}-{size}" for family, size in DECLARED])
def test_a_declaring_family_gives_the_same_outputs_in_both_layouts(family, size):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LibreYOLO(f"{family}-{size}").model.eval()
    side = 96 if family != "fomo" else 64
    images = torch.rand(1, 3, side, side)
    with torch.no_grad():
        expected = model(images)
        model.to(memory_format=torch.channels_last)
        actual = model(images.contiguous(memory_format=torch.channels_last))

    def tensors(value):
        if isinstance(value, torch.Tensor):
            return [value]
        if isinstance(value, dict):
            value = list(value.values())
        return [tensor for item in value for tensor in tensors(item)] if isinstance(value, (list, tuple)) else []

    pairs = list(zip(tensors(expected), tensors(actual)))
    assert pairs
    for first, second in pairs:
        assert torch.allclose(first, second, rtol=1e-4, atol=1e-4 * float(first.abs().max()) + 1e-6)


def test_the_engine_trains_a_declaring_family_in_channels_last_on_a_cpu_and_others_not(tmp_path):
    use_test_families()
    data = write_class_folders(tmp_path / "data")
    layouts = {}
    for family in ("tinynet_nhwc", "tinynet"):
        trace = tmp_path / family
        trace.mkdir()
        LibreYOLO(f"{family}-s", options={"trace_dir": str(trace)}).train(
            data=str(data), epochs=1, batch=8, imgsz=32, workers=0, nbs=8, device="cpu", verbose=False, plots=False,
            name=family)
        layouts[family] = (trace / "layout0.txt").read_text()
    assert layouts == {"tinynet_nhwc": "channels_last", "tinynet": "contiguous"}


def test_predict_runs_the_fused_copy_in_channels_last_only_for_declaring_families():
    use_test_families()
    cpu = torch.device("cpu")
    declaring, other = LibreYOLO("tinynet_nhwc-s"), LibreYOLO("tinynet-s")
    assert declaring.inference_model(cpu).body[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not other.inference_model(cpu).body[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not declaring.model.body[0].weight.is_contiguous(memory_format=torch.channels_last)  # the user's model is untouched
