"""The per-class table of a detection validation (``zoo_core.tasks.class_table``): counts, P and R at the confidence
of the best mean F1, per-class AP against torchmetrics' own per-class figures, and what ``val`` prints and returns.

Its equality on two ranks and one process is proved in ``test_tasks_ddp.py`` (the table is part of detect's case).
"""

from __future__ import annotations

import pytest
import torch
from torchmetrics.detection import MeanAveragePrecision

from zoo_core.tasks.class_table import ValidationMetrics, detection_class_table
from zoo_core.tasks.metrics import OrderedMeanAveragePrecision

NAMES = {0: "cat", 1: "dog", 2: "bird"}


def box(x: float, y: float, side: float = 20.0) -> list[float]:
    return [x, y, x + side, y + side]


def case() -> tuple[list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """Three images: every cat found (score 0.9); one of two dogs found (0.8) beside a false dog (0.3); birds absent.

    Image 2 has no box at all, so ``all`` counts 3 images while no class is in more than 2.
    """
    truths = [
        {"boxes": torch.tensor([box(0, 0), box(50, 50)]), "labels": torch.tensor([0, 1])},
        {"boxes": torch.tensor([box(10, 10), box(60, 0)]), "labels": torch.tensor([0, 1])},
        {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long)},
    ]
    predictions = [
        {"boxes": torch.tensor([box(0, 0), box(50, 50)]), "scores": torch.tensor([0.9, 0.8]), "labels": torch.tensor([0, 1])},
        {"boxes": torch.tensor([box(10, 10), box(0, 60)]), "scores": torch.tensor([0.9, 0.3]), "labels": torch.tensor([0, 1])},
        {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)},
    ]
    return predictions, truths


def table_of(predictions, truths):
    metric = OrderedMeanAveragePrecision(extended_summary=True)
    metric.update(predictions, truths, list(range(len(predictions))))
    values = metric.compute()
    return values, detection_class_table(values, NAMES)


def test_counts_precision_recall_and_ap_per_class():
    predictions, truths = case()
    values, table = table_of(predictions, truths)
    rows = {row.name: row for row in table.classes}
    assert list(rows) == ["cat", "dog"], "a class without true boxes gets no row (as Ultralytics)"
    assert (table.all.images, table.all.instances) == (3, 4)
    assert (rows["cat"].images, rows["cat"].instances, rows["dog"].images, rows["dog"].instances) == (2, 2, 2, 2)
    # The best mean F1 is reached above the false dog's 0.3 and at or below 0.8: every cat, one dog of two, no false box.
    assert 0.3 < table.confidence <= 0.8
    assert (rows["cat"].precision, rows["cat"].recall) == pytest.approx((1.0, 1.0))
    assert rows["dog"].precision == pytest.approx(1.0) and rows["dog"].recall == pytest.approx(0.5)
    assert table.all.precision == pytest.approx(1.0) and table.all.recall == pytest.approx(0.75)
    # AP: COCO's own per-class numbers (torchmetrics class_metrics) and the summary mAPs the validation returns.
    reference = MeanAveragePrecision(box_format="xyxy", class_metrics=True)
    reference.update(predictions, truths)
    expected = reference.compute()
    per_class = dict(zip(expected["classes"].tolist(), expected["map_per_class"].tolist()))
    assert rows["cat"].map50_95 == pytest.approx(per_class[0], abs=1e-6) == pytest.approx(1.0)
    assert rows["dog"].map50_95 == pytest.approx(per_class[1], abs=1e-6)
    assert rows["dog"].map50 == pytest.approx(0.5, abs=0.01)  # half the dogs at precision 1: 51 of 101 recall levels
    assert table.all.map50_95 == pytest.approx(float(values["map"]), abs=1e-6)
    assert table.all.map50 == pytest.approx(float(values["map_50"]), abs=1e-6)


def test_the_table_reads_like_ultralytics_and_rows_are_plain_dicts():
    _, table = table_of(*case())
    lines = table.format().splitlines()
    assert lines[0].split() == ["Class", "Images", "Instances", "Box(P", "R", "mAP50", "mAP50-95)"]
    assert lines[1].split()[:3] == ["all", "3", "4"] and lines[2].split()[:3] == ["cat", "2", "2"]
    assert len(lines) == 4
    rows = table.rows()
    assert rows[0]["name"] == "all" and rows[2] == {**rows[2], "name": "dog", "index": 1, "instances": 2}


def test_a_validation_without_true_boxes_has_an_empty_table():
    predictions, truths = case()
    _, table = table_of(predictions[2:], truths[2:])
    assert table.classes == () and (table.all.images, table.all.instances) == (1, 0)


def test_validation_metrics_stay_a_plain_float_dict():
    _, table = table_of(*case())
    metrics = ValidationMetrics({"mAP50": 0.5}, table)
    assert metrics == {"mAP50": 0.5} and metrics.class_table is table
    import pickle

    assert pickle.loads(pickle.dumps(metrics)).class_table == table


def test_val_prints_and_returns_the_table(tmp_path, capsys):
    from zoo_core import LibreYOLO

    model = LibreYOLO("yolo9-t", num_classes=4, names=["circle", "square", "triangle", "cross"])
    metrics = model.val(data="shapes:train=2,val=3,size=64,seed=1", imgsz=64, batch=3, workers=0, plots=False, device="cpu")
    printed = capsys.readouterr().out
    assert metrics.class_table is not None and metrics.class_table.all.images == 3
    assert metrics.class_table.all.map50_95 == pytest.approx(metrics["mAP50-95"], abs=1e-6)
    assert "Instances" in printed and printed.count("\n") >= 2
    model.val(data="shapes:train=2,val=3,size=64,seed=1", imgsz=64, batch=3, workers=0, plots=False, device="cpu", verbose=False)
    assert "Instances" not in capsys.readouterr().out
