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
    assert any("a.txt:2: " in message and reason in message for message in messages), messages
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


# ------------------------------------------------------------------------------ COCO instance JSON
def coco_dataset(root: Path, annotations: list[dict], *, images: int = 2, categories=((3, "cat"), (7, "dog")),
                 size: tuple[int, int] = (80, 60), split: str = "val2017") -> Path:
    """COCO's layout: ``root/annotations/instances_<split>.json`` and ``root/<split>/<id>.png``; returns the JSON."""
    width, height = size
    entries = []
    for image_id in range(1, images + 1):
        write_png(root / split / f"{image_id:03d}.png", width, height)
        entries.append({"id": image_id, "file_name": f"{image_id:03d}.png", "height": height, "width": width})
    content = {"images": entries, "annotations": annotations,
               "categories": [{"id": category_id, "name": name} for category_id, name in categories]}
    path = root / "annotations" / f"instances_{split}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(__import__("json").dumps(content))
    return path


def annotation(annotation_id: int, image_id: int, category_id: int, bbox, segmentation, iscrowd: int = 0) -> dict:
    return {"id": annotation_id, "image_id": image_id, "category_id": category_id, "bbox": list(bbox),
            "segmentation": segmentation, "iscrowd": iscrowd, "area": 1.0}


def test_coco_polygons_several_per_object_map_to_normalised_boxes_and_contiguous_classes(tmp_path: Path):
    pieces = [[10, 10, 30, 10, 30, 30, 10, 30], [50, 40, 70, 40, 70, 50, 50, 50]]  # one object in two pieces
    path = coco_dataset(tmp_path, [annotation(1, 1, 7, (10, 10, 60, 40), pieces), annotation(2, 1, 3, (0, 0, 8, 6), [[0, 0, 8, 0, 8, 6, 0, 6]])])
    records = index_instance_split([path], {0: "cat", 1: "dog"})
    assert [record.image for record in records] == [tmp_path / "val2017" / "001.png", tmp_path / "val2017" / "002.png"]
    first, background = records
    # category 7 is the second in sorted id order (3, 7): class 1; the bbox xywh becomes normalised xyxy
    np.testing.assert_allclose(first.labels, [[1, 10 / 80, 10 / 60, 70 / 80, 50 / 60], [0, 0, 0, 8 / 80, 6 / 60]], atol=1e-6)
    region = first.shapes[0].rasterise(60, 80)
    assert region.sum() == 20 * 20 + 20 * 10 and region[10:30, 10:30].all() and region[40:50, 50:70].all()
    assert len(background.labels) == 0 and background.crowd.dtype == bool


def test_coco_rle_compressed_and_uncompressed_and_crowd(tmp_path: Path):
    from pycocotools import mask as mask_utils

    mask = np.zeros((60, 80), dtype=np.uint8)
    mask[5:25, 40:70] = 1
    compressed = mask_utils.encode(np.asfortranarray(mask))
    # COCO's uncompressed form (what iscrowd regions use): run lengths in column-major order, starting with zeros
    flat = mask.reshape(-1, order="F")
    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    counts = np.diff(np.concatenate([[0], changes])).tolist()
    assert sum(counts) == mask.size
    path = coco_dataset(tmp_path, [
        annotation(1, 1, 3, (40, 5, 30, 20), {"size": [60, 80], "counts": compressed["counts"].decode("ascii")}),
        annotation(2, 2, 7, (40, 5, 30, 20), {"size": [60, 80], "counts": counts}, iscrowd=1),
    ])
    first, second = index_instance_split([path], {0: "cat", 1: "dog"})
    np.testing.assert_array_equal(first.shapes[0].rasterise(60, 80), mask.astype(bool))
    np.testing.assert_array_equal(second.shapes[0].rasterise(60, 80), mask.astype(bool))
    assert first.crowd.tolist() == [False] and second.crowd.tolist() == [True]


@pytest.mark.parametrize(
    "bad, message",
    [
        (annotation(5, 1, 99, (1, 1, 5, 5), [[1, 1, 6, 1, 6, 6]]), "annotation id 5: category_id 99 is not among the categories"),
        (annotation(6, 9, 3, (1, 1, 5, 5), [[1, 1, 6, 1, 6, 6]]), "annotation id 6: image_id 9 is not among the images"),
        (annotation(7, 1, 3, (1, 1, 0, 5), [[1, 1, 6, 1, 6, 6]]), "annotation id 7: bbox .* has no area"),
        (annotation(8, 1, 3, (1, 1, 5, 5), [[1, 1, 6, 1]]), "annotation id 8: a polygon of 4 coordinates"),
        (annotation(9, 1, 3, (1, 1, 5, 5), {"size": [10, 10], "counts": "abc"}), "annotation id 9: an RLE of size \\[10, 10\\]"),
        (annotation(10, 1, 3, (1, 1, 5, 5), {"size": [60, 80], "counts": [5, 5]}), "annotation id 10: uncompressed RLE counts sum to 10"),
        (annotation(11, 1, 3, (1, 1, 5, 5), []), "annotation id 11: no segmentation; a segmentation dataset needs"),
        ({"id": 12, "image_id": 1, "category_id": 3, "bbox": [1, 2]}, "annotation id 12: malformed \\(bbox"),
    ],
)
def test_a_bad_coco_annotation_is_skipped_naming_the_file_and_its_id(tmp_path: Path, bad: dict, message: str):
    good = annotation(1, 1, 7, (10, 10, 20, 20), [[10, 10, 30, 10, 30, 30]])
    path = coco_dataset(tmp_path, [good, bad], images=1)
    with pytest.warns(DatasetWarning, match=message) as caught:
        (record,) = index_instance_split([path], {0: "cat", 1: "dog"})
    assert any(str(path) in str(warning.message) for warning in caught)
    assert record.labels[:, 0].tolist() == [1.0]


def test_a_missing_image_is_skipped_and_its_annotations_with_it(tmp_path: Path):
    path = coco_dataset(tmp_path, [annotation(1, 2, 3, (1, 1, 5, 5), [[1, 1, 6, 1, 6, 6]])])
    (tmp_path / "val2017" / "002.png").unlink()
    with pytest.warns(DatasetWarning, match="002.png"):
        records = index_instance_split([path], {0: "cat", 1: "dog"})
    assert [record.image.name for record in records] == ["001.png"]


def test_coco_files_that_cannot_be_used_are_errors_naming_the_file_and_the_fix(tmp_path: Path):
    path = coco_dataset(tmp_path, [], images=1)
    with pytest.raises(DatasetError, match="2 categories .* but names lists 3 classes; give one name per category"):
        index_instance_split([path], {0: "a", 1: "b", 2: "c"})
    path.write_text('{"images": [], "annotations": []}')
    with pytest.raises(DatasetError, match=f"{path}: not COCO instance annotations \\(categories: Field required"):
        index_instance_split([path], {0: "a"})
    path.write_text('{"images": [')
    with pytest.raises(DatasetError, match=f"{path}: not valid JSON"):
        index_instance_split([path], {0: "a"})
    elsewhere = tmp_path / "lonely" / "instances_train.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text('{"images": [{"id": 1, "file_name": "x.png"}], "categories": [{"id": 1, "name": "a"}]}')
    with pytest.raises(DatasetError, match="cannot find the image folder: .* holds its first image 'x.png'"):
        index_instance_split([elsewhere], {0: "a"})


def test_an_annotations_file_beside_its_images_and_a_declared_size_that_is_wrong(tmp_path: Path):
    write_png(tmp_path / "data" / "a.png", 40, 30)
    write_png(tmp_path / "data" / "b.png", 40, 30)
    path = tmp_path / "data" / "_annotations.coco.json"  # Roboflow's export: the file among its images
    path.write_text(__import__("json").dumps({
        "images": [{"id": 1, "file_name": "a.png", "height": 30, "width": 40}, {"id": 2, "file_name": "b.png", "height": 31, "width": 40}],
        "categories": [{"id": 0, "name": "thing"}], "annotations": [annotation(1, 1, 0, (1, 1, 10, 10), [[1, 1, 11, 1, 11, 11]])],
    }))
    with pytest.warns(DatasetWarning, match="image id 2 \\(b.png\\) is declared 31×40 but is 30×40 on disk"):
        (record,) = index_instance_split([path], {0: "thing"})
    assert record.image == tmp_path / "data" / "a.png" and len(record.labels) == 1


def test_the_shapes_coco_json_and_its_yolo_seg_twin_give_the_same_objects(tmp_path: Path):
    from zoo_core.data.shapes import SHAPES_CLASSES, ShapesConfig, materialize_shapes

    root = materialize_shapes(ShapesConfig(num_train=8, num_val=2, image_size=64, seed=3), cache=tmp_path)
    names = dict(enumerate(SHAPES_CLASSES))
    from_coco = index_instance_split([root / "coco" / "instances_train.json"], names)
    from_yolo = index_instance_split([root / "segment" / "images" / "train"], names)
    assert [record.image.name for record in from_coco] == [record.image.name for record in from_yolo]
    for coco, yolo in zip(from_coco, from_yolo):
        assert coco.image == root / "images" / "train" / coco.image.name  # COCO's file_name, found in images/train
        np.testing.assert_allclose(coco.labels, yolo.labels, atol=1e-5)
        for coco_shape, yolo_shape in zip(coco.shapes, yolo.shapes):
            assert coco_shape.rle is not None and yolo_shape.polygons
            np.testing.assert_array_equal(coco_shape.rasterise(64, 64), yolo_shape.rasterise(64, 64))
