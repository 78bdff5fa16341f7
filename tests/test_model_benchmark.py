"""``zoo benchmark``: PyTorch, ONNX and TorchScript of one model in one table, the same accuracy in each."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from zoo_core import LibreYOLO
from zoo_core.cli import main
from zoo_core.model_benchmark import benchmark

DATA = "shapes:train=4,val=4,size=64"


def test_every_format_validates_to_the_same_score_and_leaves_nothing_behind(tmp_path, capsys, monkeypatch):
    torch.manual_seed(0)
    weights = LibreYOLO("yolo9-t", num_classes=4).save(tmp_path / "best.safetensors")
    before = set(Path(tempfile.gettempdir()).glob("zoo-benchmark-*"))
    rows = benchmark(str(weights), data=DATA, imgsz=64, runs=2)
    assert [row.format for row in rows] == ["pytorch", "onnx", "torchscript"]
    assert all(not row.error and row.metric == "mAP50-95" for row in rows), [row.error for row in rows]
    assert all(row.file_mb > 1 and row.ms_per_image > 0 for row in rows)
    assert max(row.score for row in rows) - min(row.score for row in rows) < 1e-3
    assert set(Path(tempfile.gettempdir()).glob("zoo-benchmark-*")) == before

    monkeypatch.chdir(tmp_path)
    assert main(["benchmark", str(weights), f"data={DATA}", "imgsz=64", "formats=onnx"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split() == ["format", "file", "MB", "mAP50-95", "ms/image"] and printed[1].startswith("onnx")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["best.safetensors"], "the benchmark wrote into the folder"


def test_a_format_that_fails_says_why_in_its_row():
    rows = benchmark(LibreYOLO("yolo9-t"), data=DATA, imgsz=64, formats=("onnx",), runs=1)
    assert rows[0].error.startswith("DatasetError") and "4 classes" in rows[0].error
