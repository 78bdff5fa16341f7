"""``LibreYOLO("best.onnx")`` / ``LibreYOLO("best.torchscript")``: an exported graph predicts, validates and tracks
through its runtime with the facts its export stored, and gives what the PyTorch model gives."""

from __future__ import annotations

import pytest
import torch

from zoo_core import LibreYOLO, sample_image
from zoo_core.errors import ArgumentError, ExportError

from .support import varied_class_scores

SIDE = 64
DATA = "shapes:train=4,val=4,size=64"


def same_detections(found, expected) -> bool:
    """The same boxes, scores and classes, in any order among equal scores (NMS keeps ties in either order)."""
    def rows(result):
        table = torch.cat([result.scores[:, None], result.labels[:, None].float(), result.boxes.xyxy], dim=1)
        return table[torch.argsort(table[:, 0] * 1e6 + table[:, 1] * 1e3 + table[:, 2], descending=True)]

    return len(found.boxes) == len(expected.boxes) and torch.allclose(rows(found), rows(expected), atol=1e-3)


@pytest.fixture(scope="module")
def detector():
    torch.manual_seed(0)
    model = LibreYOLO("yolo9-t", num_classes=4)
    varied_class_scores(model.model)  # distinct scores: both runtimes keep the same boxes
    model.input_size = SIDE
    return model


@pytest.mark.parametrize("format", ["onnx", "torchscript"])
def test_an_exported_detector_predicts_validates_and_tracks_as_the_pytorch_model(detector, tmp_path, format):
    graph = LibreYOLO(detector.export(format=format, path=tmp_path / f"best.{format}"))
    assert (graph.family, graph.size, graph.names, graph.input_size) == ("yolo9", "t", detector.names, SIDE)
    expected = detector.predict(sample_image(), conf=0.2, verbose=False)[0]
    found = graph.predict(sample_image(), conf=0.2, verbose=False)[0]
    assert len(expected.boxes) > 3 and same_detections(found, expected)
    by_pytorch = detector.val(data=DATA, batch=2, workers=0, plots=False, verbose=False)
    by_graph = graph.val(data=DATA, batch=2, workers=0, plots=False, verbose=False)
    assert by_graph == pytest.approx(by_pytorch, abs=1e-4)
    frames = [sample_image()] * 3
    assert [result.boxes.id.tolist() for result in graph.track(frames, verbose=False)] == \
        [result.boxes.id.tolist() for result in detector.track(frames, verbose=False)]


def test_an_exported_segmenter_gives_the_same_masks(tmp_path):
    torch.manual_seed(0)
    model = LibreYOLO("yolo9_seg-t", num_classes=2)
    varied_class_scores(model.model)
    model.input_size = SIDE
    graph = LibreYOLO(model.export(format="onnx", path=tmp_path / "seg.onnx"))
    expected = model.predict(sample_image(), conf=0.2, verbose=False)[0]
    found = graph.predict(sample_image(), conf=0.2, verbose=False)[0]
    assert len(expected.boxes) > 0 and len(found.boxes) == len(expected.boxes)
    differing = (found.masks.data != expected.masks.data).float().mean()
    assert differing < 1e-3, f"{float(differing):.2%} of the mask pixels differ"


def test_a_fixed_size_graph_names_its_size_and_a_dynamic_one_runs_at_another(detector, tmp_path):
    fixed = LibreYOLO(detector.export(format="onnx", path=tmp_path / "fixed.onnx"))
    with pytest.raises(ExportError, match=r"exported at 64×64 .* pass imgsz=\[64, 64\], or export with dynamic=True"):
        fixed.predict(sample_image(), imgsz=96, verbose=False)
    dynamic = LibreYOLO(detector.export(format="onnx", path=tmp_path / "dynamic.onnx", dynamic=True))
    images = torch.rand(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    expected, found = detector.inference_model("cpu")(images), dynamic.inference_model("cpu")(images)
    assert set(found) == {"boxes", "scores"} and found["boxes"].shape == expected["boxes"].shape
    assert all(torch.allclose(found[name], expected[name], atol=1e-3) for name in found)
    assert len(dynamic.predict(sample_image(), imgsz=96, verbose=False)) == 1


def test_a_graph_cannot_be_trained_saved_or_exported_and_a_foreign_graph_is_named(detector, tmp_path):
    graph = LibreYOLO(detector.export(format="torchscript", path=tmp_path / "best.torchscript"))
    for call in (lambda: graph.train(data=DATA), lambda: graph.save(tmp_path / "again.pt"),
                 lambda: graph.export(format="onnx")):
        with pytest.raises(ArgumentError, match="is an exported graph, which holds no trainable weights"):
            call()
    foreign = tmp_path / "foreign.onnx"
    torch.onnx.export(torch.nn.Conv2d(3, 1, 1), (torch.rand(1, 3, 8, 8),), str(foreign), dynamo=False)
    with pytest.raises(ExportError, match="carries no zoo metadata .*LibreYOLO\\(...\\).export\\(\\)"):
        LibreYOLO(foreign)
