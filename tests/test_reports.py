"""The pictures and charts of a run: what they count, that every task writes them, and what training leaves behind."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from zoo_core.cli import main
from zoo_core.data.shapes import materialize_shapes, parse_shapes
from zoo_core.engine.validation import frozen_training_forward
from zoo_core.reports.confusion import DetectionConfusionMatrix
from zoo_core.reports.dataset_labels import detection_labels_figure, label_statistics
from zoo_core.reports.detection_curves import DetectionCurves
from zoo_core.reports.results_plot import plotted_columns
from zoo_core.tasks.metrics import OrderedMeanAveragePrecision
from zoo_core.tasks.runner import validate

from .doubles import GridDetector, TinyClassifier, TinyInstanceSegmenter, TinyRestorer, TinySegmenter, fake_libre

DATA = "shapes:train=4,val=4,size=64,seed=5"


def box(x1: float, y1: float, x2: float, y2: float) -> list[float]:
    return [x1, y1, x2, y2]


def test_detection_confusion_matrix_counts_matches_confusions_misses_and_false_alarms():
    matrix = DetectionConfusionMatrix(num_classes=2, conf=0.25, iou=0.45)
    truths = [{"boxes": torch.tensor([box(0, 0, 10, 10), box(20, 20, 30, 30), box(40, 40, 50, 50)]), "labels": torch.tensor([0, 1, 1])}]
    predictions = [{
        "boxes": torch.tensor([box(0, 0, 10, 10), box(20, 20, 30, 31), box(60, 60, 70, 70), box(40, 40, 50, 50)]),
        "scores": torch.tensor([0.9, 0.8, 0.7, 0.1]),  # the last one scores under conf: ignored, so its truth is missed
        "labels": torch.tensor([0, 0, 1, 1]),
    }]
    matrix.update(predictions, truths)
    expected = torch.zeros(3, 3, dtype=torch.long)  # [predicted, true], background last
    expected[0, 0] = 1  # class 0 found
    expected[0, 1] = 1  # a class-1 box called class 0
    expected[2, 1] = 1  # a class-1 box missed
    expected[1, 2] = 1  # a class-1 prediction on nothing
    assert torch.equal(matrix.compute(), expected)


def test_one_prediction_matches_at_most_one_true_box():
    matrix = DetectionConfusionMatrix(num_classes=1)
    truths = [{"boxes": torch.tensor([box(0, 0, 10, 10), box(0, 0, 10, 11)]), "labels": torch.tensor([0, 0])}]
    predictions = [{"boxes": torch.tensor([box(0, 0, 10, 10)]), "scores": torch.tensor([0.9]), "labels": torch.tensor([0])}]
    matrix.update(predictions, truths)
    assert matrix.compute().tolist() == [[1, 0], [1, 0]]


def curves_of(predictions: list[dict], truths: list[dict]) -> DetectionCurves:
    metric = OrderedMeanAveragePrecision(extended_summary=True)
    metric.update(predictions, truths, list(range(len(truths))))
    return DetectionCurves(metric.compute())


def test_curves_of_perfect_detections_reach_precision_recall_and_f1_of_one():
    truths = [{"boxes": torch.tensor([box(0, 0, 10, 10), box(20, 20, 40, 40)]), "labels": torch.tensor([0, 1])}]
    predictions = [{"boxes": truths[0]["boxes"].clone(), "scores": torch.tensor([0.9, 0.6]), "labels": torch.tensor([0, 1])}]
    curves = curves_of(predictions, truths)
    assert curves.classes == [0, 1]
    assert torch.allclose(curves.average_precision(), torch.ones(2, dtype=torch.float64))
    assert torch.allclose(curves.precision, torch.ones_like(curves.precision))
    at = {round(float(value), 3): index for index, value in enumerate(curves.confidences)}
    assert curves.f1_at[:, at[0.5]].tolist() == pytest.approx([1.0, 1.0])  # both found at 0.5
    assert curves.recall_at[:, at[0.7]].tolist() == pytest.approx([1.0, 0.0])  # class 1 scored 0.6: lost above it


def test_a_confident_false_alarm_lowers_the_precision_curve():
    truths = [{"boxes": torch.tensor([box(0, 0, 10, 10)]), "labels": torch.tensor([0])}]
    predictions = [{"boxes": torch.tensor([box(50, 50, 60, 60), box(0, 0, 10, 10)]), "scores": torch.tensor([0.9, 0.5]),
                    "labels": torch.tensor([0, 0])}]
    curves = curves_of(predictions, truths)
    assert float(curves.precision[0, -1]) == pytest.approx(0.5)  # full recall costs one false alarm in two
    assert float(curves.average_precision()[0]) == pytest.approx(0.5)


def test_results_png_has_a_panel_per_training_loss_then_validation_loss_then_metric():
    header = ["epoch", "metrics/mAP50", "train/loss", "val/loss", "train/box", "val/box", "metrics/fitness", "lr", "fitness", "seconds"]
    assert plotted_columns(header) == ["train/loss", "train/box", "val/loss", "val/box", "metrics/mAP50", "metrics/fitness"]


def test_the_validation_forward_pass_changes_no_batchnorm_statistic_and_drops_nothing():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(0.9), nn.Flatten())
    model.eval()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    images = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), frozen_training_forward(model):
        assert model.training and not model[1].training and not model[2].training
        first, second = model(images), model(images)
    assert torch.equal(first, second), "dropout stayed active"
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())
    assert not any(module.training for module in model.modules()), "the modes were not restored"


def readable_images(folder: Path) -> dict[str, tuple[int, int]]:
    """Every .png/.jpg in ``folder`` opened and decoded: name -> size."""
    sizes = {}
    for path in sorted(folder.iterdir()):
        if path.suffix in (".png", ".jpg"):
            with Image.open(path) as image:
                image.load()
                sizes[path.name] = image.size
    return sizes


REPORTS = {
    "detect": (lambda names: GridDetector(len(names)), 64, {"confusion_matrix.png", "confusion_matrix_normalized.png", "PR_curve.png",
               "P_curve.png", "R_curve.png", "F1_curve.png", "val_batch0_labels.jpg", "val_batch0_pred.jpg"}),
    "segment": (lambda names: TinyInstanceSegmenter(len(names)), 64, {"confusion_matrix.png", "confusion_matrix_normalized.png",
                "PR_curve.png", "P_curve.png", "R_curve.png", "F1_curve.png", "val_batch0_labels.jpg", "val_batch0_pred.jpg"}),
    "classify": (lambda names: TinyClassifier(len(names)), 32, {"confusion_matrix.png", "confusion_matrix_normalized.png",
                 "val_batch0_labels.jpg", "val_batch0_pred.jpg"}),
    "semantic": (lambda names: TinySegmenter(len(names)), 64, {"per_class_iou.png", "val_batch0_labels.jpg", "val_batch0_pred.jpg"}),
    "restore": (lambda names: TinyRestorer(), 32, {"val_batch0_pred.jpg"}),
}


@pytest.mark.parametrize("task", sorted(REPORTS))
def test_val_writes_the_task_report_into_its_own_run_folder(task: str):
    from zoo_core.tasks import get_task

    build, size, expected = REPORTS[task]
    names = get_task(task).prepare(DATA).names if task != "restore" else {}
    libre = fake_libre(build(names).eval(), task, names, size)
    validate(libre, data=DATA, batch=4, workers=0)
    second = validate(libre, data=DATA, batch=4, workers=0)
    assert second.report_dir == Path("runs") / task / "val2"  # a second val never overwrites the first
    written = readable_images(second.report_dir)
    assert expected <= set(written), f"missing: {expected - set(written)}"


def test_zoo_train_on_a_yolo_yaml_leaves_every_detection_artifact(capsys):
    yaml_path = materialize_shapes(parse_shapes(DATA)) / "detect.yaml"
    assert main(["train", "model=yolo9-t", f"data={yaml_path}", "epochs=1", "imgsz=64", "batch=4", "device=cpu",
                 "workers=0", "verbose=false", "warmup_epochs=0"]) == 0
    run_dir = Path("runs/detect/train")
    written = readable_images(run_dir)
    expected = {
        "results.png", "labels.jpg", "train_batch0.jpg", "confusion_matrix.png", "confusion_matrix_normalized.png",
        "PR_curve.png", "P_curve.png", "R_curve.png", "F1_curve.png", "val_batch0_labels.jpg", "val_batch0_pred.jpg",
    }
    assert expected <= set(written), f"missing: {expected - set(written)}"
    with (run_dir / "results.csv").open() as stream:
        header = next(csv.reader(stream))
    assert {"train/loss", "train/box", "val/loss", "val/box", "metrics/mAP50-95"} <= set(header)
    assert (run_dir / "weights" / "best.pt").is_file()
    print(sorted(written))  # the artifact list, for the record


def _panel_points(axis) -> np.ndarray:
    """The (x, y) of every dot a labels.jpg panel draws."""
    return np.asarray(axis.collections[0].get_offsets())


def test_labels_jpg_plots_true_centres_and_sizes_of_a_known_label_set():
    # Corners (what a dataset's records hold): centre (0.3, 0.4) size (0.2, 0.4), and centre (0.75, 0.5) size (0.5, 0.2).
    labels = [np.array([[0, 0.2, 0.2, 0.4, 0.6]]), np.array([[1, 0.5, 0.4, 1.0, 0.6]])]
    figure = detection_labels_figure(labels, {0: "a", 1: "b"})
    _, centres, sizes = figure.axes[:3]
    np.testing.assert_allclose(_panel_points(centres), [[0.3, 0.4], [0.75, 0.5]], atol=1e-6)
    np.testing.assert_allclose(_panel_points(sizes), [[0.2, 0.4], [0.5, 0.2]], atol=1e-6)
    assert centres.collections[0].get_alpha() == 1.0  # two boxes: fully opaque dots, not near-white ones


def test_labels_jpg_of_the_shapes_dataset_shows_the_generated_widths():
    from zoo_core.data.yolo_format import index_detection_split, read_detection_yaml

    declared = read_detection_yaml(materialize_shapes(parse_shapes(DATA)) / "detect.yaml")
    records = index_detection_split(declared.splits["train"], declared.names)
    statistics = label_statistics([record.labels for record in records])
    # shapes draws boxes about 18-51 % of the image wide; the mean of two corners (the old panel) reads 0.4-0.95.
    assert 0.15 <= statistics.sizes[:, 0].min() and statistics.sizes[:, 0].max() <= 0.55
    figure = detection_labels_figure([record.labels for record in records], declared.names)
    np.testing.assert_allclose(_panel_points(figure.axes[2]), statistics.sizes, atol=1e-6)


def test_labels_jpg_of_many_boxes_is_a_histogram_whose_single_box_bins_are_not_white():
    generator = np.random.default_rng(0)
    corners = generator.uniform(0.0, 0.5, size=(100_000, 2))
    rows = np.concatenate([np.zeros((100_000, 1)), corners, corners + generator.uniform(0.01, 0.5, size=(100_000, 2))], axis=1)
    figure = detection_labels_figure([rows], {0: "a"})
    mesh = figure.axes[1].collections[0]
    counts = np.ma.masked_invalid(np.asarray(mesh.get_array(), dtype=float))
    assert int(counts.sum()) == 100_000  # every centre lies inside [0, 1], so every box is counted
    lightest = mesh.cmap(mesh.norm(1.0))
    assert min(lightest[:3]) < 0.8, f"a bin with one box is drawn as {lightest}, too close to white"
