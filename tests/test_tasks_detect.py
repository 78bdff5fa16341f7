"""Detection: the YOLO format, bad labels, augmentation alignment, mAP, validation and prediction."""

from __future__ import annotations

import dataclasses

import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from zoo_core.data.augment import keep_visible_boxes
from zoo_core.data.input_pipeline import boxes_to_input, boxes_to_original, fit_to_input
from zoo_core.data.errors import DatasetError, DatasetWarning
from zoo_core.errors import ArgumentError
from zoo_core.facade import LibreYOLO
from zoo_core.tasks import get_task
from zoo_core.tasks.base import AugmentSettings, ModelContractError
from zoo_core.tasks.detect import DetectTask
from zoo_core.tasks.metrics import OrderedMeanAveragePrecision
from zoo_core.tasks.runner import predict, validate

from .doubles import GridDetector, LookupDetector, fake_libre, image_key

NAMES = ["red", "green", "blue"]
COLOURS = {0: (230, 20, 20), 1: (20, 230, 20), 2: (20, 20, 230)}


def write_image(path: Path, size: tuple[int, int], rectangles: list[tuple[int, tuple[int, int, int, int]]] = ()) -> None:
    """A grey ``width×height`` PNG with filled rectangles ``(class, (x1, y1, x2, y2))`` (pixel edges)."""
    width, height = size
    pixels = np.full((height, width, 3), 100, dtype=np.uint8)
    for class_id, (x1, y1, x2, y2) in rectangles or ():
        pixels[y1:y2, x1:x2] = COLOURS[class_id]
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def yolo_line(class_id: int, box: tuple[int, int, int, int], size: tuple[int, int]) -> str:
    width, height = size
    x1, y1, x2, y2 = box
    return f"{class_id} {(x1 + x2) / 2 / width:.6f} {(y1 + y2) / 2 / height:.6f} {(x2 - x1) / width:.6f} {(y2 - y1) / height:.6f}"


def make_dataset(root: Path, samples: dict[str, list[tuple[str, tuple[int, int], list]]], names=NAMES, extra: dict | None = None) -> Path:
    """Write images/<split>/<stem>.png and labels/<split>/<stem>.txt plus data.yaml; return the YAML."""
    for split, items in samples.items():
        for stem, size, rectangles in items:
            write_image(root / "images" / split / f"{stem}.png", size, rectangles)
            if rectangles is not None:
                label = root / "labels" / split / f"{stem}.txt"
                label.parent.mkdir(parents=True, exist_ok=True)
                label.write_text("".join(yolo_line(c, box, size) + "\n" for c, box in rectangles))
    content = {"path": ".", "train": "images/train", "val": "images/val", "names": names, **(extra or {})}
    (root / "data.yaml").write_text(yaml.safe_dump(content))
    return root / "data.yaml"


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(path): (path.stat().st_size, path.stat().st_mtime_ns) for path in root.rglob("*")}


@pytest.fixture
def simple_yaml(tmp_path: Path) -> Path:
    return make_dataset(
        tmp_path / "data",
        {
            "train": [("a", (80, 60), [(0, (10, 10, 30, 40)), (2, (40, 5, 70, 25))]), ("b", (64, 64), [(1, (8, 8, 56, 40))])],
            "val": [("c", (100, 50), [(1, (20, 10, 60, 40))]), ("d", (40, 80), [(0, (5, 20, 35, 70))])],
        },
    )


# ---------------------------------------------------------------------------- formats
def test_yaml_with_image_folders_gives_letterboxed_boxes_in_input_pixels(simple_yaml: Path):
    task = DetectTask()
    spec = task.prepare(simple_yaml)
    assert spec.names == {0: "red", 1: "green", 2: "blue"}
    dataset = task.dataset(spec, "val", 64, None)
    sample = dataset[0]  # c.png: 100×50 -> gain 0.64, at the top left (the task's default letterbox), 32 rows padded below
    assert sample["image"].shape == (3, 64, 64) and sample["image"].dtype == torch.uint8
    assert sample["orig_shape"] == (50, 100)
    assert sample["ratio_pad"] == ((0.64, 0.64), (0.0, 0.0))
    assert torch.allclose(sample["boxes"], torch.tensor([[20 * 0.64, 10 * 0.64, 60 * 0.64, 40 * 0.64]]), atol=1e-3)
    assert (sample["image"][:, 32:] == 114).all()
    assert sample["classes"].tolist() == [1]


def test_names_as_mapping_and_a_mismatched_nc(tmp_path: Path):
    yaml_path = make_dataset(tmp_path / "d", {"train": [("a", (32, 32), [(1, (2, 2, 20, 20))])], "val": [("b", (32, 32), [])]}, names={0: "x", 1: "y"})
    assert DetectTask().prepare(yaml_path).names == {0: "x", 1: "y"}
    content = yaml.safe_load(yaml_path.read_text())
    yaml_path.write_text(yaml.safe_dump({**content, "nc": 3}))
    with pytest.raises(DatasetError, match="nc=3"):
        DetectTask().prepare(yaml_path)
    yaml_path.write_text(yaml.safe_dump({**content, "names": {0: "x", 2: "y"}}))
    with pytest.raises(DatasetError, match="without gaps"):
        DetectTask().prepare(yaml_path)


def test_txt_image_lists_relative_to_the_list_and_a_missing_entry_reported_with_its_line(tmp_path: Path):
    root = tmp_path / "d"
    make_dataset(root, {"train": [("a", (32, 32), [(0, (2, 2, 20, 20))]), ("b", (32, 32), [(2, (4, 4, 30, 30))])], "val": [("c", (32, 32), [])]})
    (root / "train.txt").write_text("./images/train/a.png\nimages/train/b.png\nimages/train/missing.png\n")
    (root / "data.yaml").write_text(yaml.safe_dump({"train": "train.txt", "val": ["images/val"], "names": NAMES}))
    task = DetectTask()
    spec = task.prepare(root / "data.yaml")
    with pytest.warns(DatasetWarning, match=r"train\.txt:3: listed image 'images/train/missing.png' does not exist"):
        dataset = task.dataset(spec, "train", 32, None)
    assert [Path(record.image).name for record in dataset.records] == ["a.png", "b.png"]


def test_optional_test_split_and_a_folder_holding_data_yaml(tmp_path: Path):
    root = tmp_path / "d"
    make_dataset(root, {"train": [("a", (32, 32), [(0, (2, 2, 20, 20))])], "val": [("b", (32, 32), [])], "test": [("t", (32, 32), [(1, (1, 1, 9, 9))])]},
                 extra={"test": "images/test"})
    spec = DetectTask().prepare(root)  # the folder: data.yaml inside is used
    assert spec.test == [root.resolve() / "images" / "test"]
    assert len(DetectTask().dataset(spec, "test", 32, None)) == 1
    without = DetectTask().prepare(make_dataset(tmp_path / "e", {"train": [("a", (32, 32), [])], "val": [("b", (32, 32), [])]}))
    with pytest.raises(DatasetError, match="no 'test' split"):
        DetectTask().dataset(without, "test", 32, None)


def test_absolute_root_and_yaml_elsewhere(tmp_path: Path):
    root = tmp_path / "d"
    make_dataset(root, {"train": [("a", (32, 32), [(0, (2, 2, 20, 20))])], "val": [("b", (32, 32), [])]})
    elsewhere = tmp_path / "configs" / "mine.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "names": NAMES}))
    spec = DetectTask().prepare(elsewhere)
    assert spec.root == root.resolve()
    elsewhere.write_text(yaml.safe_dump({"path": "nowhere", "train": "images/train", "val": "images/val", "names": NAMES}))
    with pytest.raises(DatasetError, match="not a folder"):
        DetectTask().prepare(elsewhere)


def test_images_without_labels_are_background_and_polygons_become_boxes(tmp_path: Path):
    root = tmp_path / "d"
    make_dataset(root, {"train": [("a", (40, 40), None), ("b", (40, 40), [])], "val": [("c", (40, 40), [])]})
    (root / "labels" / "train" / "b.txt").write_text("1 0.1 0.2 0.5 0.2 0.3 0.6\n")
    task = DetectTask()
    dataset = task.dataset(task.prepare(root / "data.yaml"), "train", 40, None)
    background, polygon = dataset[0], dataset[1]
    assert background["boxes"].shape == (0, 4)
    assert polygon["classes"].tolist() == [1]
    assert torch.allclose(polygon["boxes"], torch.tensor([[4.0, 8.0, 20.0, 24.0]]), atol=1e-4)
    batch = task.collate([background, polygon])
    assert torch.allclose(batch["targets"], torch.tensor([[1.0, 1.0, 4.0, 8.0, 20.0, 24.0]]), atol=1e-4)
    assert batch["indices"].tolist() == [0, 1] and batch["paths"][0].endswith("a.png")


# ---------------------------------------------------------------------------- bad data
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("0 0.5 0.5 0.2", r"b\.txt:2: 4 fields; expected 5"),
        ("7 0.5 0.5 0.2 0.2", r"b\.txt:2: class id 7 is outside names \(0\.\.2\)"),
        ("1 1.5 0.5 0.2 0.2", r"b\.txt:2: coordinates outside \[0, 1\] \(1\.5\)"),
        ("1 0.5 -0.1 0.2 0.2", r"b\.txt:2: coordinates outside \[0, 1\]"),
        ("1.5 0.5 0.5 0.2 0.2", r"b\.txt:2: class id '1\.5' is not an integer"),
        ("x 0.5 0.5 0.2 0.2", r"b\.txt:2: not a number"),
    ],
)
def test_a_bad_label_line_is_reported_with_file_and_line_and_skipped(tmp_path: Path, line: str, message: str):
    root = tmp_path / "d"
    make_dataset(root, {"train": [("b", (50, 50), [])], "val": [("c", (50, 50), [])]})
    (root / "labels" / "train" / "b.txt").write_text(f"0 0.5 0.5 0.4 0.4\n{line}\n")
    task = DetectTask()
    spec = task.prepare(root / "data.yaml")
    with pytest.warns(DatasetWarning, match=message) as caught:
        dataset = task.dataset(spec, "train", 50, None)
    assert len([w for w in caught if issubclass(w.category, DatasetWarning)]) == 1  # reported once
    assert dataset[0]["classes"].tolist() == [0]  # the good line stays, the bad one is never trained on


@pytest.mark.parametrize("damage", ["truncated_png", "truncated_jpeg", "not_an_image"])
def test_unreadable_or_truncated_images_are_reported_and_skipped(tmp_path: Path, damage: str):
    root = tmp_path / "d"
    make_dataset(root, {"train": [("good", (40, 40), [(0, (2, 2, 20, 20))])], "val": [("c", (40, 40), [])]})
    image_dir = root / "images" / "train"
    if damage == "truncated_png":
        write_image(image_dir / "bad.png", (64, 64), [(1, (4, 4, 40, 40))])
        data = (image_dir / "bad.png").read_bytes()
        (image_dir / "bad.png").write_bytes(data[: len(data) // 2])
        name = "bad.png"
    elif damage == "truncated_jpeg":
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(image_dir / "bad.jpg", quality=90)
        data = (image_dir / "bad.jpg").read_bytes()
        (image_dir / "bad.jpg").write_bytes(data[: len(data) - 200])
        name = "bad.jpg"
    else:
        (image_dir / "bad.jpg").write_bytes(b"this is not a jpeg")
        name = "bad.jpg"
    task = DetectTask()
    with pytest.warns(DatasetWarning, match=rf"{name}: (truncated|unreadable)"):
        dataset = task.dataset(task.prepare(root / "data.yaml"), "train", 40, None)
    assert [record.image.name for record in dataset.records] == ["good.png"]


def test_missing_paths_and_empty_datasets_are_errors(tmp_path: Path):
    with pytest.raises(DatasetError, match="does not exist"):
        DetectTask().prepare(tmp_path / "absent.yaml")
    with pytest.raises(DatasetError, match="folder without data.yaml"):
        DetectTask().prepare(tmp_path)
    with pytest.raises(DatasetError, match="must be a dataset YAML"):
        DetectTask().prepare(tmp_path / "images.zip")
    root = tmp_path / "d"
    make_dataset(root, {"train": [("a", (32, 32), [])], "val": [("b", (32, 32), [])]})
    content = yaml.safe_load((root / "data.yaml").read_text())
    (root / "data.yaml").write_text(yaml.safe_dump({**content, "val": "images/missing"}))
    with pytest.raises(DatasetError, match="val entry .* does not exist"):
        DetectTask().prepare(root / "data.yaml")
    (root / "data.yaml").write_text(yaml.safe_dump({k: v for k, v in content.items() if k != "names"}))
    with pytest.raises(DatasetError, match="'names' is required"):
        DetectTask().prepare(root / "data.yaml")
    (root / "images" / "train" / "a.png").write_bytes(b"broken")
    (root / "data.yaml").write_text(yaml.safe_dump(content))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DatasetWarning)
        with pytest.raises(DatasetError, match="no usable image"):
            DetectTask().dataset(DetectTask().prepare(root / "data.yaml"), "train", 32, None)


def test_nothing_under_the_users_data_folder_is_written(simple_yaml: Path, tmp_path: Path):
    root = simple_yaml.parent
    (root / "labels" / "train" / "a.txt").write_text("0 0.5 0.5 0.2\n")  # a bad line too
    before = snapshot(root)
    torch.manual_seed(0)
    libre = fake_libre(GridDetector(3), "detect", dict(enumerate(NAMES)), 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DatasetWarning)
        task = DetectTask()
        spec = task.prepare(simple_yaml)
        dataset = task.dataset(spec, "train", 64, AugmentSettings())
        task.collate([dataset[0], dataset[1]])
        validate(libre, data=simple_yaml, batch=2, imgsz=64, device="cpu", workers=0)
    assert snapshot(root) == before


# ---------------------------------------------------------------------------- augmentation
def coloured_pixels(image: torch.Tensor, class_id: int) -> torch.Tensor:
    """Pixels close to the class colour (a boolean H×W map)."""
    colour = torch.tensor(COLOURS[class_id]).view(3, 1, 1)
    return (image.int() - colour).abs().amax(dim=0) < 60


def test_affine_flip_and_letterbox_keep_boxes_on_their_rectangles(tmp_path: Path):
    root = tmp_path / "d"
    make_dataset(root, {"train": [("a", (96, 64), [(0, (20, 12, 52, 40))])], "val": [("b", (32, 32), [])]})
    task = DetectTask()
    spec = task.prepare(root / "data.yaml")
    settings = AugmentSettings(hsv_h=0, hsv_s=0, hsv_v=0, degrees=0, translate=0.2, scale=0.4, fliplr=0.5, mosaic=0.0)
    dataset = task.dataset(spec, "train", 64, settings)
    checked = 0
    for seed in range(12):
        random.seed(seed)
        torch.manual_seed(seed)
        sample = dataset[0]
        pixels = coloured_pixels(sample["image"], 0)
        if len(sample["boxes"]) == 0:
            assert pixels.sum() < 30  # a box is only dropped when its rectangle (nearly) left the image
            continue
        (x1, y1, x2, y2) = sample["boxes"][0].tolist()
        rows, columns = torch.nonzero(pixels, as_tuple=True)
        # every pixel of the rectangle lies inside the box, and the box is tight around them
        assert columns.min() >= x1 - 1.5 and columns.max() + 1 <= x2 + 1.5
        assert rows.min() >= y1 - 1.5 and rows.max() + 1 <= y2 + 1.5
        assert abs(columns.min() - x1) <= 2 and abs(columns.max() + 1 - x2) <= 2
        assert abs(rows.min() - y1) <= 2 and abs(rows.max() + 1 - y2) <= 2
        checked += 1
    assert checked >= 8


def test_mosaic_keeps_every_box_on_its_rectangle(tmp_path: Path):
    root = tmp_path / "d"
    rectangles = [(0, (6, 6, 26, 30)), (1, (34, 8, 58, 28)), (2, (10, 36, 50, 58))]
    make_dataset(root, {"train": [("a", (64, 64), rectangles)], "val": [("b", (32, 32), [])]})
    task = DetectTask()
    settings = AugmentSettings(hsv_h=0, hsv_s=0, hsv_v=0, translate=0.1, scale=0.3, fliplr=0.5, mosaic=1.0)
    dataset = task.dataset(task.prepare(root / "data.yaml"), "train", 64, settings)
    boxes_seen = 0
    for seed in range(6):
        random.seed(seed)
        torch.manual_seed(seed)
        sample = dataset[0]
        covered = torch.zeros(64, 64, dtype=torch.bool)
        for class_id, box in zip(sample["classes"].tolist(), sample["boxes"].tolist()):
            x1, y1, x2, y2 = [int(round(value)) for value in box]
            inside = coloured_pixels(sample["image"], class_id)[y1:y2, x1:x2]
            assert inside.float().mean() > 0.6, f"seed {seed}: box {box} of class {class_id} is not on its rectangle"
            covered[max(y1 - 2, 0) : y2 + 2, max(x1 - 2, 0) : x2 + 2] = True
            boxes_seen += 1
        # Rectangles cut down to a sliver at the border (under 2 px or 10% of their area) lose
        # their box, as in YOLO; any other coloured pixel must be inside a box.
        interior = torch.zeros(64, 64, dtype=torch.bool)
        interior[6:-6, 6:-6] = True
        for class_id in range(3):
            stray = coloured_pixels(sample["image"], class_id) & ~covered & interior
            assert stray.sum() <= 4, f"seed {seed}: class {class_id} pixels outside every box"
    assert boxes_seen >= 12


def test_mixup_blends_two_mosaics_and_keeps_both_sets_of_boxes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "d"
    make_dataset(root, {"train": [("a", (64, 64), [(0, (6, 6, 26, 30))]), ("b", (64, 64), [(1, (34, 30, 58, 58))])],
                        "val": [("c", (32, 32), [])]})
    task = DetectTask()
    plain = AugmentSettings(hsv_h=0, hsv_s=0, hsv_v=0, translate=0.0, scale=0.0, fliplr=0.0, mosaic=1.0)
    mixed = AugmentSettings(hsv_h=0, hsv_s=0, hsv_v=0, translate=0.0, scale=0.0, fliplr=0.0, mosaic=1.0, mixup=1.0)
    spec = task.prepare(root / "data.yaml")
    alone, blended = task.dataset(spec, "train", 64, plain), task.dataset(spec, "train", 64, mixed)
    drawn: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = type(blended)._mosaic

    def recording(self, index, settings):
        image, boxes, classes = original(self, index, settings)
        drawn.append((image, keep_visible_boxes(boxes, classes, (64, 64))[1]))  # the boxes a sample keeps
        return image, boxes, classes

    monkeypatch.setattr(type(blended), "_mosaic", recording)
    random.seed(3)
    sample = blended[0]
    (first, first_classes), (second, second_classes) = drawn
    # Every pixel lies between the two mosaics' pixels: a blend, not a paste.
    low, high = torch.minimum(first, second).float(), torch.maximum(first, second).float()
    assert bool(((sample["image"].float() >= low - 1) & (sample["image"].float() <= high + 1)).all())
    assert not torch.equal(first, second), "the two mosaics should differ"
    assert len(first_classes) > 0 and len(second_classes) > 0
    assert sample["classes"].tolist() == first_classes.tolist() + second_classes.tolist()
    # Without mixup the same draw gives one mosaic's boxes only.
    random.seed(3)
    assert len(alone[0]["classes"]) == len(first_classes)
    blended.update_augmentation(dataclasses.replace(blended.augment, mosaic=0.0))
    assert blended.augment.mixup > 0  # MixUp rides on mosaic: without mosaic there is none
    drawn.clear()
    blended[0]
    assert drawn == []


def test_the_default_no_augmentation_phase_turns_mosaic_off_and_leaves_the_rest(simple_yaml: Path):
    from zoo_core.engine.recipe import TrainingRecipe
    from zoo_core.plugin_manager import get_plugin_manager

    settings = AugmentSettings(mosaic=1.0, mixup=0.5, multi_scale=True)
    task = DetectTask()
    dataset = task.dataset(task.prepare(simple_yaml), "train", 64, settings)
    closed = TrainingRecipe(get_plugin_manager().family("yolo9"), "t").closed_augmentation(settings)
    dataset.update_augmentation(closed)
    assert (dataset.augment.mosaic, dataset.augment.mixup) == (0.0, 0.0)
    assert dataset.augment == dataclasses.replace(settings, mosaic=0.0, mixup=0.0)  # flips, HSV, affine, multi-scale stay
    assert settings.mosaic == 1.0  # the caller's settings are not modified
    random.seed(0)
    torch.manual_seed(0)
    sample = dataset[0]
    assert sample["orig_shape"] == (60, 80)  # a letterboxed single image, not a mosaic


def test_validation_is_deterministic_letterbox_only(simple_yaml: Path):
    task = DetectTask()
    dataset = task.dataset(task.prepare(simple_yaml), "val", 64, AugmentSettings())  # val ignores augmentation
    first, second = dataset[1], dataset[1]
    assert torch.equal(first["image"], second["image"]) and torch.equal(first["boxes"], second["boxes"])


def test_the_default_letterbox_round_trip_maps_boxes_back_to_the_original_image():
    image = torch.zeros(3, 50, 120, dtype=torch.uint8)
    original = torch.tensor([[10.0, 5.0, 100.0, 45.0]])
    _, _, ratio_pad = fit_to_input(image, 96, DetectTask.default_input_pipeline)
    assert torch.allclose(boxes_to_original(boxes_to_input(original, ratio_pad), ratio_pad, (50, 120)), original, atol=1e-4)


# ---------------------------------------------------------------------------- metrics
def test_map_is_one_for_perfect_predictions_whatever_the_update_order():
    truths = [
        {"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 40.0, 50.0]]), "labels": torch.tensor([0, 1])},
        {"boxes": torch.tensor([[5.0, 5.0, 25.0, 15.0]]), "labels": torch.tensor([1])},
    ]
    predictions = [{"boxes": truth["boxes"], "scores": torch.linspace(0.9, 0.5, len(truth["labels"])), "labels": truth["labels"]} for truth in truths]
    metric = OrderedMeanAveragePrecision()
    metric.update(predictions[1:], truths[1:], [1])
    metric.update(predictions[:1], truths[:1], [0])
    metric.update(predictions[:1], truths[:1], [0])  # a repeated sample (padding) counts once
    values = metric.compute()
    assert float(values["map"]) == pytest.approx(1.0) and float(values["map_50"]) == pytest.approx(1.0)


def test_map_of_a_constructed_case_by_hand():
    # One image, two ground truths of class 0: a perfect detection (score 0.9), then a false
    # positive (0.8). Recall never exceeds 0.5, precision is 1 up to it: COCO's 101-point
    # interpolation gives 51/101 at every IoU threshold.
    truth = {"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0], [50.0, 50.0, 70.0, 70.0]]), "labels": torch.tensor([0, 0])}
    prediction = {"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0], [80.0, 0.0, 95.0, 20.0]]), "scores": torch.tensor([0.9, 0.8]), "labels": torch.tensor([0, 0])}
    metric = OrderedMeanAveragePrecision()
    metric.update([prediction], [truth], [0])
    values = metric.compute()
    assert float(values["map"]) == pytest.approx(51 / 101, abs=1e-6)
    assert float(values["map_50"]) == pytest.approx(51 / 101, abs=1e-6)
    # One box of IoU 0.62: a true positive at IoU thresholds 0.50, 0.55, 0.60 and a miss at the
    # seven above, so mAP50-95 = 3/10 while mAP50 = 1.
    metric = OrderedMeanAveragePrecision()
    metric.update(
        [{"boxes": torch.tensor([[0.0, 0.0, 10.0, 6.2]]), "scores": torch.tensor([0.7]), "labels": torch.tensor([0])}],
        [{"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0]]), "labels": torch.tensor([0])}],
        [0],
    )
    values = metric.compute()
    assert float(values["map"]) == pytest.approx(0.3, abs=1e-6) and float(values["map_50"]) == pytest.approx(1.0)


def oracle_for(task: DetectTask, dataset, shift: float = 0.0) -> LookupDetector:
    """A detector that returns each validation image's ground truth (shifted by ``shift`` pixels)."""
    table = {}
    for index in range(len(dataset)):
        batch = task.preprocess(task.collate([dataset[index]]), torch.device("cpu"))
        rows = batch["targets"]
        table[image_key(batch["images"][0])] = {
            "boxes": rows[:, 2:6] + shift,
            "scores": torch.linspace(0.9, 0.6, len(rows)),
            "labels": rows[:, 1].long(),
        }
    return LookupDetector(table)


def test_validate_gives_perfect_scores_to_an_oracle_and_fitness_mixes_the_maps(simple_yaml: Path):
    task = DetectTask()
    spec = task.prepare(simple_yaml)
    dataset = task.dataset(spec, "val", 64, None)
    loader = [task.collate([dataset[0], dataset[1]])]
    metrics = task.validate(oracle_for(task, dataset).eval(), loader, torch.device("cpu"), spec.names)
    assert metrics["mAP50-95"] == pytest.approx(1.0) and metrics["mAP50"] == pytest.approx(1.0)
    assert metrics["fitness"] == pytest.approx(1.0)
    shifted = task.validate(oracle_for(task, dataset, shift=3.0).eval(), loader, torch.device("cpu"), spec.names)
    assert 0 < shifted["mAP50-95"] < shifted["mAP50"] <= 1.0
    assert shifted["fitness"] == pytest.approx(0.1 * shifted["mAP50"] + 0.9 * shifted["mAP50-95"])


def test_a_model_without_postprocess_or_loss_breaks_the_contract_clearly(simple_yaml: Path):
    task = get_task("detect")
    with pytest.raises(ModelContractError, match="postprocess"):
        task.validate(torch.nn.Conv2d(3, 3, 1), [], torch.device("cpu"), {0: "a"})
    with pytest.raises(ModelContractError, match="loss"):
        task.loss(torch.nn.Conv2d(3, 3, 1), None, {})


def test_example_batch_has_the_collated_keys():
    batch = DetectTask().example_batch(2, 64, 3)
    assert batch["images"].shape == (2, 3, 64, 64) and batch["targets"].shape[1] == 6
    assert set(batch) >= {"images", "targets", "orig_shapes", "ratio_pads", "paths", "indices"}
    assert DetectTask().preprocess(batch, torch.device("cpu"))["images"].max() <= 1.0


# ---------------------------------------------------------------------------- runner
def test_runner_validate_checks_the_class_count(simple_yaml: Path):
    libre = fake_libre(GridDetector(5), "detect", {i: str(i) for i in range(5)}, 64)
    with pytest.raises(DatasetError, match="3 classes .* the model has 5"):
        validate(libre, data=simple_yaml, device="cpu", workers=0)
    with pytest.raises(ValueError, match="needs data"):
        validate(libre)


def test_predict_maps_boxes_to_the_original_image_and_saves_drawings(tmp_path: Path):
    image = np.full((60, 100, 3), 90, dtype=np.uint8)
    image[10:40, 20:50] = COLOURS[0]
    tensor = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    letterboxed, _, ((ratio_x, ratio_y), (pad_left, pad_top)) = fit_to_input(tensor, 64, DetectTask.default_input_pipeline)
    assert (ratio_x, ratio_y, pad_left, pad_top) == (0.64, 0.64, 0.0, 0.0)  # 100×60 -> 64×38 at the top left
    box_in_input = torch.tensor([[20.0 * ratio_x, 10.0 * ratio_y + pad_top, 50.0 * ratio_x, 40.0 * ratio_y + pad_top]])
    model = LookupDetector({image_key(letterboxed.float() / 255): {"boxes": box_in_input, "scores": torch.tensor([0.9]), "labels": torch.tensor([0])}})
    libre = fake_libre(model, "detect", dict(enumerate(NAMES)), 64)
    Image.fromarray(image).save(tmp_path / "scene.png")
    for source in (tmp_path / "scene.png", image, Image.fromarray(image)):
        (result,) = predict(libre, source, device="cpu")
        assert torch.allclose(result.boxes, torch.tensor([[20.0, 10.0, 50.0, 40.0]]), atol=1e-3)
        assert result.labels.tolist() == [0] and result.summary().endswith("1 red")
    results = predict(libre, [tmp_path / "scene.png", image], save=True, device="cpu", conf=0.5)
    assert [r.save_path for r in results] == [Path("runs/detect/predict/scene.png"), Path("runs/detect/predict/image1.png")]
    drawn = np.asarray(Image.open(results[0].save_path))
    assert drawn.shape == image.shape and not np.array_equal(drawn, image)  # the box is drawn
    again = predict(libre, image, save=True, device="cpu", name="predict")
    assert again[0].save_path.parent == Path("runs/detect/predict2")
    assert predict(libre, image, device="cpu", conf=0.95)[0].boxes.shape == (0, 4)  # conf filters


# ------------------------------------------------------------------------------ COCO instance JSON
def test_a_coco_dataset_gives_the_same_samples_as_its_yolo_twin_and_every_spelling_finds_it(tmp_path: Path):
    from zoo_core.data.shapes import SHAPES_CLASSES, ShapesConfig, materialize_shapes

    root = materialize_shapes(ShapesConfig(num_train=6, num_val=3, image_size=64, seed=2), cache=tmp_path)
    task = get_task("detect")
    twin = task.prepare(str(root / "detect.yaml"))
    spellings = [root / "coco.yaml", root / "coco" / "instances_train.json", root / "coco"]
    for spelling in spellings:
        spec = task.prepare(str(spelling))
        assert spec.names == dict(enumerate(SHAPES_CLASSES)), spelling  # from the JSON's categories
        assert [path.name for path in spec.val] == ["instances_val.json"], spelling
        for split in ("train", "val"):
            ours, theirs = task.dataset(spec, split, 64, None), task.dataset(twin, split, 64, None)
            assert len(ours) == len(theirs)
            for index in range(len(ours)):
                sample, expected = ours[index], theirs[index]
                assert torch.equal(sample["image"], expected["image"]) and torch.equal(sample["classes"], expected["classes"])
                torch.testing.assert_close(sample["boxes"], expected["boxes"], atol=1e-3, rtol=0)


def test_coco_crowd_boxes_are_left_out_and_yaml_names_override_the_categories(tmp_path: Path):
    import json

    write_image(tmp_path / "images" / "train" / "a.png", (64, 48), [(0, (4, 4, 20, 20))])
    write_image(tmp_path / "images" / "val" / "a.png", (64, 48), [(0, (4, 4, 20, 20))])
    for split in ("train", "val"):
        content = {
            "images": [{"id": 1, "file_name": "a.png", "height": 48, "width": 64}],
            "categories": [{"id": 5, "name": "thing"}],
            "annotations": [
                {"id": 1, "image_id": 1, "category_id": 5, "bbox": [4, 4, 16, 16], "iscrowd": 0, "segmentation": []},
                {"id": 2, "image_id": 1, "category_id": 5, "bbox": [30, 10, 20, 20], "iscrowd": 1,
                 "segmentation": {"size": [48, 64], "counts": [48 * 64]}},
            ],
        }
        (tmp_path / "annotations").mkdir(exist_ok=True)
        (tmp_path / "annotations" / f"instances_{split}.json").write_text(json.dumps(content))
    (tmp_path / "data.yaml").write_text(yaml.safe_dump(
        {"path": ".", "train": "annotations/instances_train.json", "val": "annotations/instances_val.json", "names": ["red"]}))
    spec = get_task("detect").prepare(str(tmp_path / "data.yaml"))
    assert spec.names == {0: "red"}
    for split in ("train", "val"):  # a box without segmentation is fine for detection; the crowd box is not kept
        sample = get_task("detect").dataset(spec, split, 64, None)[0]
        assert sample["classes"].tolist() == [0]
        torch.testing.assert_close(sample["boxes"], torch.tensor([[4.0, 4.0, 20.0, 20.0]]))
    (tmp_path / "data.yaml").write_text(yaml.safe_dump(
        {"path": ".", "train": "annotations/instances_train.json", "val": "annotations/instances_val.json", "names": ["a", "b"]}))
    with pytest.raises(DatasetError, match="1 categories .* but names lists 2 classes"):
        get_task("detect").dataset(get_task("detect").prepare(str(tmp_path / "data.yaml")), "train", 64, None)
    for split in ("train", "val"):  # only the crowd region left: nothing to learn, and the error says where
        content["annotations"] = content["annotations"][1:]
        (tmp_path / "annotations" / f"instances_{split}.json").write_text(json.dumps(content))
    (tmp_path / "data.yaml").write_text(yaml.safe_dump(
        {"path": ".", "train": "annotations/instances_train.json", "val": "annotations/instances_val.json"}))
    with pytest.raises(DatasetError, match="instances_train.json: none of the 1 training images has a box \\(crowd"):
        get_task("detect").dataset(get_task("detect").prepare(str(tmp_path / "data.yaml")), "train", 64, None)
    with pytest.raises(DatasetError, match="COCO layout needs both instances_train"):
        (tmp_path / "annotations" / "instances_val.json").unlink()
        (tmp_path / "data.yaml").unlink()
        get_task("detect").prepare(str(tmp_path))


def test_a_coco_json_dataset_trains_a_detector_exactly_as_its_yolo_twin(tmp_path: Path):
    """yolo9-t, one epoch at 64 px on the shapes scenes, once from coco.yaml and once from detect.yaml: the same
    samples in the same order give the same losses and weights."""
    from zoo_core.data.shapes import ShapesConfig, materialize_shapes
    from zoo_core.facade import LibreYOLO

    root = materialize_shapes(ShapesConfig(num_train=8, num_val=4, image_size=64, seed=0), cache=tmp_path)
    runs = []
    for name in ("coco.yaml", "detect.yaml"):
        model = LibreYOLO("yolo9-t", num_classes=4, seed=0)
        result = model.train(data=str(root / name), epochs=1, batch=4, imgsz=64, device="cpu", workers=0, seed=0,
                             plots=False, verbose=False, project=str(tmp_path / "runs"), name=name.split(".")[0])
        runs.append((result, model.model.state_dict()))
    (coco_result, coco_weights), (yolo_result, yolo_weights) = runs
    losses = {key: value for key, value in coco_result.history[0].items() if "loss" in key}
    assert losses and all(np.isfinite(float(value)) and float(value) > 0 for value in losses.values())
    # YOLO's label text rounds the normalised boxes to 6 decimals: the runs agree to float precision, not bit for bit
    assert losses == pytest.approx({key: value for key, value in yolo_result.history[0].items() if "loss" in key}, rel=1e-4)
    for key, value in coco_weights.items():
        torch.testing.assert_close(value, yolo_weights[key], rtol=1e-3, atol=1e-4, msg=key)


# ---------------------------------------------------------------------------- single_cls
def test_single_cls_reads_every_class_as_item_and_scores_boxes_whatever_their_class(simple_yaml: Path):
    from zoo_core.tasks.runner import one_class_data

    task = DetectTask()
    spec = task.prepare(simple_yaml)
    one_class = one_class_data(spec, task)
    assert one_class.names == {0: "item"} and one_class.label_names == spec.names
    dataset, collapsed = task.dataset(spec, "val", 64, None), task.dataset(one_class, "val", 64, None)
    rows = task.collate([dataset[0], dataset[1]])["targets"]
    collapsed_rows = task.collate([collapsed[0], collapsed[1]])["targets"]
    assert set(rows[:, 1].tolist()) == {0.0, 1.0}, "the fixture's boxes must be of two classes"
    assert torch.equal(collapsed_rows[:, 2:], rows[:, 2:]) and set(collapsed_rows[:, 1].tolist()) == {0.0}

    # A detector that finds every box but names the wrong class: nothing with classes, everything as one class.
    wrong = oracle_for(task, dataset)
    for answer in wrong.table.values():
        answer["labels"] = 2 - answer["labels"]  # 0 -> 2 and 1 -> 1: the class-1 box stays right, the class-0 one not
    loader = [task.collate([dataset[0], dataset[1]])]
    with_classes = task.validate(wrong.eval(), loader, torch.device("cpu"), spec.names)
    for answer in wrong.table.values():
        answer["labels"] = torch.zeros_like(answer["labels"])
    as_one = task.validate(wrong.eval(), [task.collate([collapsed[0], collapsed[1]])], torch.device("cpu"), one_class.names)
    assert with_classes["mAP50"] < 0.9 and as_one["mAP50"] == pytest.approx(1.0)


def test_single_cls_trains_a_one_class_model_and_is_refused_where_there_are_no_boxes(simple_yaml: Path, tmp_path: Path):
    from zoo_core.tasks.classify import ClassifyTask
    from zoo_core.tasks.runner import one_class_data

    model = LibreYOLO("yolo9-t")
    model.train(data=str(simple_yaml), single_cls=True, epochs=1, batch=2, imgsz=64, workers=0, plots=False, verbose=False,
                project=str(tmp_path / "runs"))
    assert model.names == {0: "item"} and model.num_classes == 1
    assert LibreYOLO(model.weights_path).names == {0: "item"}
    metrics = model.val(data=str(simple_yaml), single_cls=True, plots=False, verbose=False, workers=0)
    assert set(metrics) >= {"mAP50", "mAP50-95"}
    with pytest.raises(ArgumentError, match="single_cls=True .* 'classify' models have no boxes"):
        one_class_data(DetectTask().prepare(simple_yaml), ClassifyTask())


# ---------------------------------------------------------------------------- cache
@pytest.mark.parametrize("mode", ["ram", "disk"])
def test_cached_images_give_the_same_samples_and_are_decoded_once(simple_yaml: Path, mode: str, monkeypatch):
    import zoo_core.data.image_cache as image_cache
    from zoo_core.paths import zoo_home

    task = DetectTask()
    spec = task.prepare(simple_yaml)
    plain = task.dataset(spec, "train", 64, None)
    expected = [plain[index] for index in range(len(plain))]
    cached = task.dataset(spec, "train", 64, None)
    decoded = []
    original = image_cache.read_image
    monkeypatch.setattr(image_cache, "read_image", lambda path: decoded.append(Path(path).name) or original(path))
    before = sorted(simple_yaml.parent.rglob("*"))
    cached.cache_images(mode)
    assert sorted(decoded) == ["a.png", "b.png"]
    for _ in range(2):  # two epochs
        for index, first in enumerate(expected):
            second = cached[index]
            assert torch.equal(first["image"], second["image"]) and torch.equal(first["boxes"], second["boxes"])
    assert len(decoded) == 2, "a cached image was decoded again"
    assert sorted(simple_yaml.parent.rglob("*")) == before, "the cache wrote into the user's dataset folder"
    if mode == "disk":
        assert len(list((zoo_home() / "cache" / "images").rglob("*.npy"))) == 2
        task.dataset(spec, "train", 64, None).cache_images("disk")  # a second run finds them
        assert len(decoded) == 2


def test_train_caches_what_it_reads_and_a_bad_cache_value_is_named(tmp_path: Path, capsys):
    from pydantic import ValidationError

    from .support import use_test_families, write_class_folders

    use_test_families()
    data = write_class_folders(tmp_path / "data", per_class=4, val_per_class=2)
    LibreYOLO("tinynet-s").train(data=str(data), cache=True, epochs=1, batch=4, imgsz=32, workers=0, plots=False,
                                 project=str(tmp_path / "runs"))
    printed = capsys.readouterr().out
    assert "train: cached 8 images" in printed and "MB in RAM" in printed and "val: cached 4 images" in printed
    with pytest.raises((ValidationError, ValueError), match="cache"):
        LibreYOLO("tinynet-s").train(data=str(data), cache="gpu", epochs=1, workers=0)
