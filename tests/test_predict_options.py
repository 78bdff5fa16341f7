"""predict options as Ultralytics users write them (classes, save_txt, save_conf, save_crop, verbose, line_width),
and the "did you mean" of a mistyped predict, val or export keyword."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from PIL import Image

from zoo_core import LibreYOLO, sample_image
from zoo_core.cli import main
from zoo_core.errors import ArgumentError

# An untrained 80-class YOLOv9 at conf 0 finds boxes of many classes in the sample image: enough to filter and write.
SETTINGS = dict(conf=0.0, imgsz=32, max_det=20)


@pytest.fixture(scope="module")
def detector():
    return LibreYOLO("yolo9-t")


def test_classes_keeps_only_the_given_class_indices(detector):
    (everything,) = detector.predict(sample_image(), **SETTINGS)
    present = sorted(set(everything.labels.tolist()))
    assert len(present) >= 2, "the filter would have nothing to remove"
    (kept,) = detector.predict(sample_image(), classes=present[:1], **SETTINGS)
    assert len(kept.boxes) and set(kept.labels.tolist()) == {present[0]}
    assert torch.equal(kept.boxes.xyxy, everything.boxes.xyxy[everything.labels == present[0]])
    (single,) = detector.predict(sample_image(), classes=present[0], **SETTINGS)  # one index, as Ultralytics allows
    assert torch.equal(single.labels, kept.labels)
    with pytest.raises(ArgumentError, match=r"classes=\[80\].*no class 80"):
        detector.predict(sample_image(), classes=[80], **SETTINGS)


def test_save_txt_save_conf_and_save_crop_write_yolo_labels_and_crops_into_the_run_folder(detector, tmp_path):
    (result,) = detector.predict(sample_image(), save=True, save_txt=True, save_conf=True, save_crop=True,
                                 project=str(tmp_path), **SETTINGS)
    run = tmp_path / "detect" / "predict"
    assert result.save_dir == run and result.save_path == run / "sample.jpg"
    lines = (run / "labels" / "sample.txt").read_text().splitlines()
    assert len(lines) == len(result.boxes) > 0
    values = torch.tensor([[float(number) for number in line.split()] for line in lines])
    assert torch.equal(values[:, 0], result.boxes.cls)
    assert torch.allclose(values[:, 1:5], result.boxes.xywhn, atol=1e-5)  # centre x, centre y, width, height in [0, 1]
    assert torch.allclose(values[:, 5], result.boxes.conf, atol=1e-5)
    crops = sorted((run / "crops").rglob("*.jpg"))
    assert {path.parent.name for path in crops} == {result.names[int(label)] for label in result.labels}
    assert len(crops) == len(result.boxes)
    x1, y1, x2, y2 = result.boxes.xyxy[0].tolist()
    first = Image.open(run / "crops" / result.names[int(result.labels[0])] / "sample.jpg")
    assert abs(first.width - (x2 - x1)) <= 2 and abs(first.height - (y2 - y1)) <= 2

    (plain,) = detector.predict(sample_image(), save_txt=True, project=str(tmp_path), name="labels_only", **SETTINGS)
    label_lines = (tmp_path / "detect" / "labels_only" / "labels" / "sample.txt").read_text().splitlines()
    assert [len(line.split()) for line in label_lines] == [5] * len(plain.boxes)  # no score without save_conf
    assert plain.save_path is None and not list((tmp_path / "detect" / "labels_only").glob("*.jpg"))
    with pytest.raises(ArgumentError, match="save_conf=True.*add save_txt=True"):
        detector.predict(sample_image(), save_conf=True, **SETTINGS)


def test_line_width_sets_the_width_of_the_drawn_boxes(detector):
    (result,) = detector.predict(sample_image(), **SETTINGS)
    original = torch.from_numpy(result.orig_img)
    changed = [int((torch.from_numpy(result.plot(line_width=width)) != original).any(-1).sum()) for width in (1, 6)]
    assert changed[1] > changed[0] * 2
    with pytest.raises(ArgumentError, match="line_width=0"):
        detector.predict(sample_image(), line_width=0, **SETTINGS)


def test_verbose_false_drops_the_line_per_image(detector, caplog):
    with caplog.at_level(logging.INFO, logger="zoo.predict"):
        detector.predict([sample_image(), sample_image()], **SETTINGS)
        assert [record.getMessage().split(":")[0] for record in caplog.records if record.name == "zoo.predict"] == [
            "image 1", "image 2"]
        caplog.clear()
        detector.predict(sample_image(), verbose=False, **SETTINGS)
        assert not [record for record in caplog.records if record.name == "zoo.predict"]


def test_zoo_predict_takes_the_options_and_verbose_false_prints_no_line_per_image(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arguments = ["predict", "yolo9-t", str(sample_image()), "conf=0.0", "imgsz=32", "max_det=5", "classes=[0,1,2,3,4,5]",
                 "save_txt=true", "verbose=false"]
    assert main(arguments) == 0
    output = capsys.readouterr().out.splitlines()
    assert output == ["results written to runs/detect/predict"]
    assert main([*arguments[:-1], "verbose=true", "name=again"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("sample")


def test_mistyped_predict_val_and_export_keywords_get_did_you_mean(detector):
    with pytest.raises(ArgumentError, match=r"unknown predict argument 'cof' in predict\(\)\. Did you mean 'conf'"):
        detector.predict(sample_image(), cof=0.5)
    with pytest.raises(ArgumentError, match=r"unknown predict argument 'save_crops'.*Did you mean 'save_crop'"):
        detector.predict(sample_image(), save_crops=True)
    with pytest.raises(ArgumentError, match=r"unknown val argument 'dta' in val\(\)\. Did you mean 'data'"):
        detector.val(dta="shapes")
    with pytest.raises(ArgumentError, match=r"unknown export argument 'fromat' in export\(\)\. Did you mean 'format'"):
        detector.export(fromat="onnx")


def test_box_options_on_a_classifier_name_the_option_and_the_task():
    classifier = LibreYOLO("resnet18", num_classes=2)
    for option, value in (("save_crop", True), ("save_txt", True), ("line_width", 2), ("classes", [0]), ("classes", 0)):
        with pytest.raises(ArgumentError, match=re.escape(f"predict({option}={value!r}) does not apply to 'classify' models")):
            classifier.predict(sample_image(), imgsz=32, **{option: value})


def test_classes_filters_points_results_too():
    from zoo_core.tasks.predictions import PointsResult

    result = PointsResult(orig_image=torch.zeros(3, 8, 8, dtype=torch.uint8), path=None, name="grid", names={0: "a", 1: "b"},
                          points=torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), scores=torch.tensor([0.9, 0.8, 0.7]),
                          labels=torch.tensor([1, 0, 1]))
    kept = result.keep_classes([1])
    assert torch.equal(kept.points, torch.tensor([[1.0, 2.0], [5.0, 6.0]])) and torch.equal(kept.scores, torch.tensor([0.9, 0.7]))
    assert kept.labels.tolist() == [1, 1] and len(result.points) == 3  # a copy: the result itself is unchanged


def test_the_box_options_apply_to_instance_segmentation_results_too(tmp_path):
    from zoo_core.tasks import get_task
    from zoo_core.tasks.predictions import InstanceSegmentationResult

    assert get_task("segment").predict_options == get_task("detect").predict_options
    masks = torch.zeros(2, 40, 60, dtype=torch.bool)
    masks[0, 5:25, 10:30] = True
    masks[1, 20:35, 40:55] = True
    result = InstanceSegmentationResult(
        orig_image=torch.zeros(3, 40, 60, dtype=torch.uint8), path=None, name="scene", names={0: "a", 1: "b"},
        boxes=torch.tensor([[10.0, 5.0, 30.0, 25.0], [40.0, 20.0, 55.0, 35.0]]), scores=torch.tensor([0.9, 0.6]),
        labels=torch.tensor([1, 0]), masks=masks)
    kept = result.keep_classes([0])
    assert kept.labels.tolist() == [0] and torch.equal(kept.masks.data, masks[1:]) and len(result.masks) == 2
    crops = result.save_crops(tmp_path / "crops", "scene")
    assert sorted(path.parent.name for path in crops) == ["a", "b"] and Image.open(tmp_path / "crops" / "b" / "scene.jpg").size == (20, 20)
    original = torch.from_numpy(result.orig_img)
    changed = [int((torch.from_numpy(result.plot(line_width=width)) != original).any(-1).sum()) for width in (1, 4)]
    assert changed[1] > changed[0]
    lines = result.save_txt(tmp_path / "labels" / "scene.txt", save_conf=True).read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["1", "0"] and all(len(line.split()) % 2 == 0 for line in lines)
