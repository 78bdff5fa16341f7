"""export's options as Ultralytics users pass them: imgsz, half, dynamic, simplify, opset, batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from zoo_core import LibreYOLO
from zoo_core.cli import main
from zoo_core.errors import ArgumentError, ExportError
from zoo_core.export import export_graph

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def detector():
    return LibreYOLO("yolo9-t", num_classes=3)


def _run(path, images: torch.Tensor) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"images": images.numpy()})


def _pytorch(detector, images: torch.Tensor) -> list[np.ndarray]:
    model = detector.model.eval()
    with torch.no_grad():
        outputs = model(images)
    return [outputs[name].numpy() for name in ("boxes", "scores")]


def test_imgsz_sets_the_traced_size_rounded_up_to_the_task_multiple(detector, tmp_path):
    written = detector.export(format="onnx", path=tmp_path / "a.onnx", imgsz=(64, 96))
    assert onnxruntime.InferenceSession(str(written)).get_inputs()[0].shape == ["batch", 3, 64, 96]
    images = torch.rand(2, 3, 64, 96)
    for found, expected in zip(_run(written, images), _pytorch(detector, images)):
        np.testing.assert_allclose(found, expected, rtol=1e-4, atol=1e-3)
    rounded = detector.export(format="onnx", path=tmp_path / "b.onnx", imgsz=50)
    assert onnxruntime.InferenceSession(str(rounded)).get_inputs()[0].shape == ["batch", 3, 64, 64]
    metadata = {entry.key: entry.value for entry in onnx.load(str(rounded)).metadata_props}
    assert json.loads(metadata["zoo.input_size"]) == [64, 64] and metadata["zoo.dynamic"] == "false"
    with pytest.raises(ArgumentError, match=r"export imgsz must be an integer or a \[height, width\]"):
        detector.export(format="onnx", path=tmp_path / "c.onnx", imgsz="big")


def test_half_writes_a_float16_graph_that_computes_what_the_float32_model_does(detector, tmp_path):
    written = detector.export(format="onnx", path=tmp_path / "half.onnx", imgsz=64, half=True)
    assert onnxruntime.InferenceSession(str(written)).get_inputs()[0].type == "tensor(float16)"
    images = torch.rand(1, 3, 64, 64)
    found = _run(written, images.half())
    expected = _pytorch(detector, images)
    np.testing.assert_allclose(found[0].astype(np.float32), expected[0], atol=0.5)  # boxes in pixels of a 64 px input
    np.testing.assert_allclose(found[1].astype(np.float32), expected[1], atol=2e-2)  # probabilities
    assert next(detector.model.parameters()).dtype == torch.float32, "export changed the model's precision"
    script = detector.export(format="torchscript", path=tmp_path / "half.torchscript", imgsz=64, half=True)
    with torch.no_grad():
        boxes, scores = torch.jit.load(str(script))(images.half())
    torch.testing.assert_close(scores.float(), torch.from_numpy(expected[1]), atol=2e-2, rtol=0)


def test_dynamic_makes_height_and_width_dynamic_and_the_graph_is_right_at_another_size(detector, tmp_path):
    written = detector.export(format="onnx", path=tmp_path / "dynamic.onnx", imgsz=64, dynamic=True)
    assert onnxruntime.InferenceSession(str(written)).get_inputs()[0].shape == ["batch", 3, "height", "width"]
    images = torch.rand(1, 3, 128, 96)
    for found, expected in zip(_run(written, images), _pytorch(detector, images)):
        np.testing.assert_allclose(found, expected, rtol=1e-4, atol=1e-3)


class _SizeBakedIn(torch.nn.Module):
    """A head that, like a family computing anchors in Python, turns the traced width into a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        offset = float(int(images.shape[-1]))  # a Python number: the tracer records it as a constant
        return self.conv(images) + offset


@pytest.mark.parametrize("graph_format", ["onnx", "torchscript"])
def test_dynamic_refuses_a_graph_that_holds_its_traced_size_fixed(graph_format, tmp_path):
    path = tmp_path / f"fixed.{graph_format}"
    with pytest.raises(ExportError, match=r"cannot be exported with dynamic=True: at 64x64 its graph's logits differs"):
        export_graph(_SizeBakedIn(), graph_format, path, name="baked", task="semantic", outputs=("logits",), input_size=32,
                     dynamic=True)
    assert not path.exists() and not list(tmp_path.iterdir()), "a refused export left a file behind"


def test_simplify_and_opset_write_a_smaller_graph_at_that_opset(detector, tmp_path):
    plain = detector.export(format="onnx", path=tmp_path / "plain.onnx", imgsz=64, opset=13)
    slim = detector.export(format="onnx", path=tmp_path / "slim.onnx", imgsz=64, opset=13, simplify=True)
    plain_graph, slim_graph = onnx.load(str(plain)), onnx.load(str(slim))
    assert {entry.version for entry in slim_graph.opset_import if entry.domain in ("", "ai.onnx")} == {13}
    assert len(slim_graph.graph.node) < len(plain_graph.graph.node)
    images = torch.rand(1, 3, 64, 64)
    for found, expected in zip(_run(slim, images), _run(plain, images)):
        np.testing.assert_allclose(found, expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(ExportError, match=r"opset=99: give an ONNX opset from 11 to 23"):
        detector.export(format="onnx", path=tmp_path / "x.onnx", imgsz=64, opset=99)
    with pytest.raises(ExportError, match=r"simplify=True simplifies ONNX graphs"):
        detector.export(format="torchscript", path=tmp_path / "x.torchscript", imgsz=64, simplify=True)
    with pytest.raises(ArgumentError, match=r"writes the weights, not a graph: half"):
        detector.export(format="libreyolo", path=tmp_path / "x.pt", half=True)


def test_the_cli_takes_the_export_options_as_key_values(tmp_path, capsys):
    target = tmp_path / "cli.onnx"
    assert main(["export", "yolo9-t", "format=onnx", "imgsz=64", "half=true", "batch=2", f"output={target}"]) == 0
    assert f"exported onnx: {target}" in capsys.readouterr().out
    assert onnxruntime.InferenceSession(str(target)).get_inputs()[0].type == "tensor(float16)"
    assert main(["export", "yolo9-t", "format=onnx", "imgsz=64", "dynamc=true"]) == 2
    assert "Did you mean 'dynamic'?" in capsys.readouterr().err
