"""Prediction results expose what Ultralytics users reach for, and draw readable captions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo_core.reports.drawing import class_colour, drawing_sizes
from zoo_core.tasks.predictions import (
    ClassificationResult, DetectionResult, InstanceSegmentationResult, PointsResult, RestorationResult, SegmentationResult,
)


def detection(shape=(100, 200)) -> DetectionResult:
    return DetectionResult(orig_image=torch.zeros(3, *shape, dtype=torch.uint8), path=None, name="street", names={0: "car", 1: "bus"},
                           boxes=torch.tensor([[10.0, 20.0, 50.0, 60.0], [0.0, 0.0, 200.0, 100.0]]),
                           scores=torch.tensor([0.9, 0.4]), labels=torch.tensor([1, 0]))


def test_detection_boxes_are_the_tensor_they_were_with_ultralytics_views():
    result = detection()
    assert torch.equal(result.boxes, torch.tensor([[10.0, 20.0, 50.0, 60.0], [0.0, 0.0, 200.0, 100.0]]))  # still a tensor
    assert torch.equal(result.boxes.xyxy, result.boxes.as_subclass(torch.Tensor))
    assert torch.equal(result.boxes.xywh, torch.tensor([[30.0, 40.0, 40.0, 40.0], [100.0, 50.0, 200.0, 100.0]]))
    assert torch.allclose(result.boxes.xyxyn[1], torch.ones(4) * torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert torch.equal(result.boxes.conf, result.scores) and torch.equal(result.boxes.cls, torch.tensor([1.0, 0.0]))
    assert result.orig_img.shape == (100, 200, 3) and result.orig_img.dtype == np.uint8


def test_results_serialise_as_json_and_rows():
    result = detection()
    data = json.loads(result.to_json())
    assert data["classes"] == ["bus", "car"] and data["boxes"][0] == [10.0, 20.0, 50.0, 60.0]
    assert [row["class_name"] for row in result.rows()] == ["bus", "car"] and result.rows()[0]["score"] == pytest.approx(0.9)
    try:
        import pandas  # noqa: F401 - optional
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            result.to_df()
    else:
        assert list(result.to_df()["class_name"]) == ["bus", "car"]


def test_captions_sit_on_a_filled_box_in_the_class_colour_sized_to_the_image():
    result = detection(shape=(640, 640))
    drawn = result.plot()
    font_size, line = drawing_sizes((640, 640))
    assert font_size >= 19 and line == 2
    # the caption's filled background, at the first box's top-left corner, has the class colour
    caption_row = drawn[22: 20 + font_size, 12:48]
    colour = np.array(class_colour(1))
    assert (np.abs(caption_row.astype(int) - colour).sum(-1) < 10).mean() > 0.3


def test_classification_probs_offer_top1_and_top5():
    result = ClassificationResult(orig_image=torch.zeros(3, 8, 8, dtype=torch.uint8), path=None, name="pet",
                                  names={0: "cat", 1: "dog", 2: "fox"}, probs=torch.tensor([0.2, 0.7, 0.1]))
    assert result.probs.top1 == 1 and result.probs.top5 == [1, 0, 2]
    assert float(result.probs.top1conf) == pytest.approx(0.7) and result.top1 == 1
    assert [row["class_name"] for row in result.rows()] == ["dog", "cat", "fox"]


def test_segmentation_masks_are_one_boolean_mask_per_present_class():
    mask = torch.tensor([[0, 0, 2], [2, 2, 0]])
    result = SegmentationResult(orig_image=torch.zeros(3, 2, 3, dtype=torch.uint8), path=None, name="scene",
                                names={0: "ground", 1: "sky", 2: "tree"}, mask=mask)
    assert result.classes == [0, 2] and result.masks.shape == (2, 2, 3) and torch.equal(result.masks[1], mask == 2)
    assert {row["class_name"] for row in result.rows()} == {"ground", "tree"}


def test_the_repr_of_every_result_is_one_short_line_without_tensors():
    image = torch.zeros(3, 480, 640, dtype=torch.uint8)
    common = {"orig_image": image, "name": "a.jpg", "names": {0: "car", 1: "bus"}}
    results = {
        "DetectionResult(path='images/a.jpg', image=3×100×200, boxes=2)": DetectionResult(
            orig_image=torch.zeros(3, 100, 200, dtype=torch.uint8), path=Path("images/a.jpg"), name="a.jpg", names={0: "car"},
            boxes=torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]), scores=torch.tensor([0.9, 0.4]),
            labels=torch.tensor([0, 0])),
        "PointsResult(path='a.jpg', image=3×480×640, points=0)": PointsResult(path=None, **common),
        "InstanceSegmentationResult(path='a.jpg', image=3×480×640, boxes=1, masks=1)": InstanceSegmentationResult(
            path=None, boxes=torch.tensor([[1.0, 2.0, 3.0, 4.0]]), scores=torch.tensor([0.9]), labels=torch.tensor([0]),
            masks=torch.ones(1, 480, 640, dtype=torch.bool), **common),
        "ClassificationResult(path='a.jpg', image=3×480×640, classes=2, top1='bus' 0.70)": ClassificationResult(
            path=None, probs=torch.tensor([0.3, 0.7]), **common),
        "SegmentationResult(path='a.jpg', image=3×480×640, mask=480×640, classes=1)": SegmentationResult(
            path=None, mask=torch.zeros(480, 640, dtype=torch.long), **common),
        "RestorationResult(path='a.jpg', image=3×480×640, restored=3×480×640)": RestorationResult(path=None, image=image, **common),
    }
    for expected, result in results.items():
        assert repr(result) == expected
        assert "tensor" not in repr(result) and len(repr(result)) < 120
