"""Every family's smallest size exports to ONNX and TorchScript and computes what PyTorch computes.

Parametrized over registry.yaml (a family added there is exported without touching this file).
Each graph is traced at batch 1 and run at batch 2, which proves the dynamic batch dimension;
the outputs are the pre-NMS candidates / logits its task names (``Task.export_outputs``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from zoo_core import LibreYOLO
from zoo_core.cli import main
from zoo_core.errors import ArgumentError
from zoo_core.export import export_graph, inference_form
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.registry import load_registry
from zoo_core.tasks import get_task

REGISTRY = load_registry()
SMALLEST_SIZES = [
    pytest.param(family, min(declaration.sizes, key=lambda s: declaration.sizes[s].params), id=family)
    for family, declaration in REGISTRY.items()
]
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


def _reference(model: torch.nn.Module, task: str, images: torch.Tensor) -> list[np.ndarray]:
    with torch.no_grad():
        outputs = inference_form(model)(images)
    if isinstance(outputs, torch.Tensor):
        return [outputs.numpy()]
    return [outputs[name].numpy() for name in get_task(task).export_outputs]


def _side(model: torch.nn.Module, task: str) -> int:
    # Semantic heads pool the 1/32 map into bins of up to 4 (PP-LiteSeg's SPPM); ONNX exports that
    # adaptive pooling only when the map is a multiple of the bins: 128 px, not 64.
    side = max(128 if task == "semantic" else 64, int(getattr(model, "minimum_input_size", 64)))
    return -(-side // 32) * 32


# torch.jit is deprecated upstream in favour of torch.export; it still ships, and users run it.
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
@pytest.mark.parametrize(("family", "size"), SMALLEST_SIZES)
def test_the_smallest_size_exports_and_matches_pytorch(family: str, size: str, tmp_path):
    import onnxruntime

    task = REGISTRY[family].task
    torch.manual_seed(0)
    model = get_plugin_manager().build_model(family, size, 3).eval()
    side = _side(model, task)
    images = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(1))
    expected = _reference(model, task, images)

    outputs = get_task(task).export_outputs
    onnx_path = export_graph(model, "onnx", tmp_path / "model.onnx", name=f"{family}-{size}", task=task, outputs=outputs,
                             input_size=side)
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    assert [item.name for item in session.get_inputs()] == ["images"]
    produced = session.run(None, {"images": images.numpy()})
    assert len(produced) == len(expected)
    for got, want in zip(produced, expected):
        np.testing.assert_allclose(got, want, **TOLERANCE, err_msg=f"{family}-{size} ONNX")

    script_path = export_graph(model, "torchscript", tmp_path / "model.torchscript", name=f"{family}-{size}", task=task,
                               outputs=outputs, input_size=side)
    extra = {"zoo.json": ""}
    loaded = torch.jit.load(str(script_path), _extra_files=extra)
    assert json.loads(extra["zoo.json"])["task"] == task
    with torch.no_grad():
        traced = loaded(images)
    for got, want in zip(traced, expected):
        np.testing.assert_allclose(got.numpy(), want, **TOLERANCE, err_msg=f"{family}-{size} TorchScript")
    assert model.training is False and all(p.requires_grad for p in model.parameters()), "export changed the model"


def test_facade_and_cli_export_say_where_and_keep_the_names(tmp_path, capsys):
    import onnx

    model = LibreYOLO("yolo9-t", num_classes=3)
    model.input_size = 64  # the size a trained model records; a small one keeps the test quick
    written = model.export(format="onnx", path=tmp_path / "detector.onnx")
    assert written == tmp_path / "detector.onnx" and written.is_file()
    metadata = {entry.key: entry.value for entry in onnx.load(str(written)).metadata_props}
    assert json.loads(metadata["zoo.input_size"]) == [64, 64]
    assert metadata["zoo.family"] == "yolo9"

    target = tmp_path / "cli" / "model.torchscript"
    assert main(["export", "resnet18", "format=torchscript", f"output={target}"]) == 0
    assert f"exported torchscript: {target}" in capsys.readouterr().out
    assert target.is_file()

    with pytest.raises(ArgumentError, match="'onnx'"):
        model.export(format="tflite")


def test_info_prints_a_layer_summary_and_returns_the_dict(capsys):
    facts = LibreYOLO("resnet18").info()
    printed = capsys.readouterr().out
    assert facts["parameters"] == sum(p.numel() for p in LibreYOLO("resnet18").model.parameters())
    # resnet18 at 224 is 1.82 GMACs, 3.64 GFLOPs (2 FLOPs per multiply-add).
    assert facts["gflops"] == pytest.approx(3.64, rel=0.02)
    assert facts["layers"] > 40
    assert f"{facts['parameters']:,} parameters" in printed and "GFLOPs at 224x224" in printed
    assert LibreYOLO("resnet18").info(verbose=False)["name"] == "resnet-18"
    assert capsys.readouterr().out == ""
