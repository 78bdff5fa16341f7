"""Instance data: YOLO segmentation labels and COCO instance JSON read into InstanceRecords, with bad input reported."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from zoo_core.data.errors import DatasetError, DatasetWarning, ProblemReport
from zoo_core.data.instance_readers import index_instance_split
from zoo_core.data.instances import mask_outline

NAMES = {0: "red", 1: "green"}


def write_png(path: Path, width: int, height: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((height, width, 3), 90, dtype=np.uint8)).save(path)
    return path


def write_yolo_seg(root: Path, stem: str, lines: list[str] | None, size: tuple[int, int] = (80, 60)) -> Path:
    image = write_png(root / "images" / "train" / f"{stem}.png", *size)
    if lines is not None:
        label = root / "labels" / "train" / f"{stem}.txt"
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text("".join(line + "\n" for line in lines))
    return image


def test_a_polygon_line_gives_its_extent_as_the_box_and_rasterises_to_its_region(tmp_path: Path):
    # a right triangle over the left half of an 80×60 image and a square in the right half
    write_yolo_seg(tmp_path, "a", ["0 0.0 0.0 0.5 0.0 0.0 1.0", "1 0.75 0.25 1.0 0.25 1.0 0.75 0.75 0.75"])
    write_yolo_seg(tmp_path, "b", None)  # no label file: a background image
    records = index_instance_split([tmp_path / "images" / "train"], NAMES)
    first, background = sorted(records, key=lambda record: record.image.name)
    np.testing.assert_allclose(first.labels, [[0, 0.0, 0.0, 0.5, 1.0], [1, 0.75, 0.25, 1.0, 0.75]], atol=1e-6)
    assert first.crowd.tolist() == [False, False] and len(background.labels) == len(background.shapes) == 0
    square = first.shapes[1].rasterise(60, 80)
    assert square.sum() == 20 * 30 and square[15:45, 60:80].all()  # x 60..80, y 15..45: its pixels exactly
    triangle = first.shapes[0].rasterise(60, 80)
    assert abs(int(triangle.sum()) - 40 * 60 / 2) <= 40 and triangle[1, 1] and not triangle[50, 30]


@pytest.mark.parametrize(
    "line, reason",
    [
        ("0 0.5 0.5 0.2 0.2", "instance segmentation needs each object's polygon"),
        ("0 0.1 0.1 0.2 0.2 0.3", "odd number of coordinates"),
        ("0 0.1 0.1", "1 points; a polygon needs at least 3"),
        ("2 0.1 0.1 0.5 0.1 0.5 0.5", "class id 2 is outside names"),
        ("0 0.1 0.1 1.5 0.1 0.5 0.5", "coordinates outside [0, 1] (1.5)"),
        ("0 0.1 0.1 x 0.1 0.5 0.5", "not a number"),
        ("0.5 0.1 0.1 0.5 0.1 0.5 0.5", "is not an integer"),
        ("0 0.1 0.1 0.5 0.1 0.9 0.1", "zero width or height"),
    ],
)
def test_a_bad_line_is_skipped_with_its_file_line_and_reason(tmp_path: Path, line: str, reason: str):
    write_yolo_seg(tmp_path, "a", ["1 0.2 0.2 0.8 0.2 0.5 0.9", line])
    report = ProblemReport("test split")
    with pytest.warns(DatasetWarning) as caught:
        (record,) = index_instance_split([tmp_path / "images" / "train"], NAMES, report=report)
    messages = [str(warning.message) for warning in caught]
    assert any(f"a.txt:2: " in message and reason in message for message in messages), messages
    assert record.labels[:, 0].tolist() == [1.0] and len(record.shapes) == 1
    assert report.skipped_lines == 1


def test_three_points_is_the_smallest_polygon_and_many_points_are_kept_in_order(tmp_path: Path):
    write_yolo_seg(tmp_path, "a", ["0 0.1 0.1 0.3 0.1 0.2 0.4", "1 0.5 0.5 0.6 0.5 0.7 0.6 0.6 0.7 0.5 0.6"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DatasetWarning)
        (record,) = index_instance_split([tmp_path / "images" / "train"], NAMES)
    assert [shape.polygons[0].shape for shape in record.shapes] == [(3, 2), (5, 2)]
    np.testing.assert_allclose(record.shapes[1].polygons[0][2], [0.7, 0.6], atol=1e-6)


def test_a_dataset_of_box_lines_only_names_the_fix(tmp_path: Path):
    write_yolo_seg(tmp_path, "a", ["0 0.5 0.5 0.2 0.2"])
    with pytest.warns(DatasetWarning, match="convert the labels to polygons, or train task=detect"):
        (record,) = index_instance_split([tmp_path / "images" / "train"], NAMES)
    assert len(record.labels) == 0


def test_an_empty_split_is_an_error_naming_it(tmp_path: Path):
    (tmp_path / "images" / "train").mkdir(parents=True)
    with pytest.raises(DatasetError, match="no usable image in .*images/train"):
        index_instance_split([tmp_path / "images" / "train"], NAMES, what="my split")


def test_mask_outline_joins_pieces_and_holes_into_one_ring_that_rasterises_back():
    from zoo_core.data.instances import InstanceShape

    mask = np.zeros((40, 50), dtype=bool)
    mask[5:30, 5:30] = True
    mask[12:20, 12:20] = False  # a hole (an occluder inside the object)
    mask[32:38, 35:48] = True  # a second piece
    mask[2, 45] = True  # a single pixel
    outline = mask_outline(mask)
    assert outline.ndim == 2 and outline.shape[1] == 2
    shape = InstanceShape(polygons=(outline / np.array([50, 40], dtype=np.float32),))
    np.testing.assert_array_equal(shape.rasterise(40, 50), mask)
    assert mask_outline(np.zeros((8, 8), dtype=bool)) is None
