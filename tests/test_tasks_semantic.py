"""Semantic segmentation: the mask format, bad masks, mask/pixel alignment under augmentation, mIoU."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from zoo_core.data.errors import DatasetError, DatasetWarning
from zoo_core.tasks.base import AugmentSettings
from zoo_core.tasks.runner import predict, validate
from zoo_core.tasks.semantic import SemanticTask

from .doubles import TinySegmenter, fake_libre

NAMES = ["background", "square", "disc"]


def write_pair(root: Path, split: str, stem: str, size: tuple[int, int], square: tuple[int, int, int, int], mask_value: int = 1) -> None:
    """An image with one red square, and its mask (0 background, ``mask_value`` on the square)."""
    width, height = size
    image = np.full((height, width, 3), 60, dtype=np.uint8)
    mask = np.zeros((height, width), dtype=np.uint8)
    x1, y1, x2, y2 = square
    image[y1:y2, x1:x2] = (220, 30, 30)
    mask[y1:y2, x1:x2] = mask_value
    for kind, array in (("images", image), ("masks", mask)):
        (root / kind / split).mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(root / "images" / split / f"{stem}.png")
    Image.fromarray(mask).save(root / "masks" / split / f"{stem}.png")


def make_dataset(root: Path, mapping_form: bool = True) -> Path:
    write_pair(root, "train", "a", (48, 32), (8, 4, 24, 20))
    write_pair(root, "train", "b", (40, 40), (10, 10, 30, 30), mask_value=2)
    write_pair(root, "val", "c", (64, 32), (16, 8, 40, 24))
    if mapping_form:
        splits = {"train": {"images": "images/train", "masks": "masks/train"}, "val": {"images": "images/val", "masks": "masks/val"}}
    else:
        splits = {"train": "images/train", "val": "images/val"}
    (root / "seg.yaml").write_text(yaml.safe_dump({**splits, "names": NAMES, "ignore_index": 255}))
    return root / "seg.yaml"


@pytest.mark.parametrize("mapping_form", [True, False])
def test_both_spellings_find_the_masks_and_letterbox_pads_with_ignore(tmp_path: Path, mapping_form: bool):
    task = SemanticTask()
    spec = task.prepare(make_dataset(tmp_path / "d", mapping_form))
    assert spec.names == {0: "background", 1: "square", 2: "disc"} and spec.extra["ignore_index"] == 255
    sample = task.dataset(spec, "val", 64, None)[0]  # 64×32 -> 64×32 at the top left, 32 padded rows below
    mask = sample["mask"]
    assert mask.shape == (64, 64)
    assert (mask[32:] == 255).all() and (mask[:32] != 255).all()
    assert (mask[8:24, 16:40] == 1).all() and int((mask == 1).sum()) == 16 * 24
    batch = task.preprocess(task.collate([sample]), torch.device("cpu"))
    assert batch["masks"].dtype == torch.long and batch["ignore_index"] == 255
    assert batch["images"].dtype == torch.float32 and batch["images"].min() < 0  # ImageNet-normalised


def test_bad_masks_are_reported_with_their_file_and_skipped(tmp_path: Path):
    root = tmp_path / "d"
    yaml_path = make_dataset(root)
    write_pair(root, "train", "outside", (32, 32), (4, 4, 20, 20), mask_value=7)
    write_pair(root, "train", "ignored", (32, 32), (4, 4, 20, 20), mask_value=255)  # ignore_index is fine
    write_pair(root, "train", "small", (32, 32), (4, 4, 20, 20))
    Image.fromarray(np.zeros((16, 16), dtype=np.uint8)).save(root / "masks" / "train" / "small.png")
    write_pair(root, "train", "rgb", (32, 32), (4, 4, 20, 20))
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(root / "masks" / "train" / "rgb.png")
    write_pair(root, "train", "orphan", (32, 32), (4, 4, 20, 20))
    (root / "masks" / "train" / "orphan.png").unlink()
    task = SemanticTask()
    with pytest.warns(DatasetWarning) as caught:
        dataset = task.dataset(task.prepare(yaml_path), "train", 32, None)
    messages = [str(w.message) for w in caught if issubclass(w.category, DatasetWarning)]
    assert any("outside.png: class index 7 outside names (0..2)" in m for m in messages)
    assert any("small.png: mask is 16×16 but its image is 32×32" in m for m in messages)
    assert any("rgb.png: mask must be a single-channel PNG" in m for m in messages)
    assert any("orphan.png: no mask" in m for m in messages)
    assert len(messages) == 4
    assert sorted(record.image.stem for record in dataset.records) == ["a", "b", "ignored"]


def test_yaml_errors_name_the_key(tmp_path: Path):
    root = tmp_path / "d"
    yaml_path = make_dataset(root)
    content = yaml.safe_load(yaml_path.read_text())
    yaml_path.write_text(yaml.safe_dump({**content, "ignore_index": 1}))
    with pytest.raises(DatasetError, match="ignore_index must be an integer that is not a class index"):
        SemanticTask().prepare(yaml_path)
    yaml_path.write_text(yaml.safe_dump({**content, "train": {"images": "images/train"}}))
    with pytest.raises(DatasetError, match="'images' and 'masks'"):
        SemanticTask().prepare(yaml_path)
    with pytest.raises(DatasetError, match="does not exist"):
        SemanticTask().prepare(tmp_path / "nothing.yaml")


def test_augmentation_keeps_the_mask_on_the_drawn_pixels(tmp_path: Path):
    task = SemanticTask()
    spec = task.prepare(make_dataset(tmp_path / "d"))
    settings = AugmentSettings(hsv_h=0, hsv_s=0, hsv_v=0, degrees=10.0, translate=0.2, scale=0.4, fliplr=0.5)
    dataset = task.dataset(spec, "train", 48, settings)
    for seed in range(8):
        random.seed(seed)
        torch.manual_seed(seed)
        sample = dataset[0]
        image, mask = sample["image"].int(), sample["mask"]
        red = (image[0] > 170) & (image[1] < 80) & (image[2] < 80)
        labelled = mask == 1
        # the square's pixels and its mask agree except on a one-pixel rim (interpolation)
        disagreement = (red ^ labelled).float().sum() / max(float(labelled.sum()), 1.0)
        assert disagreement < 0.25, f"seed {seed}: mask and pixels disagree on {disagreement:.0%}"
        # the grey fill (114; the picture itself is 60 and red) is exactly the ignored area, up to
        # the interpolated rim where the two meet
        ignored = mask == 255
        fill = (image - 114).abs().amax(dim=0) < 3
        assert (fill & ~ignored).sum() <= 0.03 * mask.numel()
        assert (fill & ignored).sum() >= 0.8 * ignored.sum()


def test_miou_and_pixel_accuracy_on_a_tiny_hand_mask():
    # target  [[0, 0, 1, 255],    prediction [[0, 0, 1, 1],
    #          [0, 1, 1, 255]]                [0, 0, 1, 1]]
    # class 0: 3 hits, 1 false positive -> IoU 3/4; class 1: 2 hits, 1 miss -> 2/3; class 2 absent
    # from both -> not averaged. mIoU = (3/4 + 2/3) / 2; pixel accuracy 5/6.
    task = SemanticTask()

    class Fixed(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            prediction = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1]])
            return torch.nn.functional.one_hot(prediction, 3).permute(2, 0, 1)[None].float().expand(images.shape[0], -1, -1, -1)

    batch = {
        "images": torch.zeros(1, 3, 2, 4, dtype=torch.uint8),
        "masks": torch.tensor([[[0, 0, 1, 255], [0, 1, 1, 255]]], dtype=torch.uint8),
        "ignore_index": 255,
        "indices": torch.tensor([0]),
    }
    metrics = task.validate(Fixed(), [batch], torch.device("cpu"), dict(enumerate(NAMES)))
    assert metrics["mIoU"] == pytest.approx((3 / 4 + 2 / 3) / 2)
    assert metrics["pixel_acc"] == pytest.approx(5 / 6)


def test_default_loss_ignores_padding_and_predict_returns_masks_at_original_size(tmp_path: Path):
    task = SemanticTask()
    spec = task.prepare(make_dataset(tmp_path / "d"))
    batch = task.preprocess(task.collate([task.dataset(spec, "val", 64, None)[0]]), torch.device("cpu"))
    logits = torch.zeros(1, 3, 64, 64, requires_grad=True)
    loss, items = task.loss(torch.nn.Identity(), logits, batch)
    assert loss.item() == pytest.approx(float(np.log(3)), rel=1e-5) and "ce" in items  # uniform logits
    torch.manual_seed(0)
    libre = fake_libre(TinySegmenter(3), "semantic", spec.names, 64)
    (result,) = predict(libre, np.zeros((30, 50, 3), dtype=np.uint8), device="cpu", save=True)
    assert result.mask.shape == (30, 50) and result.mask.dtype == torch.long
    assert result.save_path == Path("runs/semantic/predict/image0.png") and result.save_path.is_file()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = validate(libre, data=tmp_path / "d" / "seg.yaml", batch=2, imgsz=64, device="cpu", workers=0).metrics
    assert set(metrics) == {"mIoU", "pixel_acc"} and 0 <= metrics["mIoU"] <= 1


# ------------------------------------------------------------------------------ YOLO-seg polygons as semantic data
def test_yolo_seg_polygons_rasterise_to_the_shapes_class_masks(tmp_path: Path):
    from zoo_core.data.shapes import SHAPES_CLASSES, ShapesConfig, materialize_shapes

    root = materialize_shapes(ShapesConfig(num_train=12, num_val=3, image_size=96, seed=4), cache=tmp_path)
    task = SemanticTask()
    spec = task.prepare(str(root / "segment.yaml"))  # images/ and labels/ only, names without background
    assert spec.names == {0: "background", **{index + 1: name for index, name in enumerate(SHAPES_CLASSES)}}
    exact = task.prepare(str(root / "semantic.yaml"))
    for split in ("train", "val"):
        ours, truth = task.dataset(spec, split, 96, None), task.dataset(exact, split, 96, None)
        assert len(ours) == len(truth)
        for index in range(len(ours)):
            # the visible regions do not overlap and their polygons are exact, so every pixel agrees
            assert torch.equal(ours[index]["mask"], truth[index]["mask"]), (split, index)
            assert torch.equal(ours[index]["image"], truth[index]["image"])


def write_polygon_dataset(root: Path, lines: list[str], names=("big", "small")) -> Path:
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    Image.fromarray(np.full((40, 40, 3), 80, dtype=np.uint8)).save(root / "images" / "train" / "a.png")
    (root / "labels" / "train" / "a.txt").write_text("".join(line + "\n" for line in lines))
    (root / "data.yaml").write_text(yaml.safe_dump({"path": ".", "train": "images/train", "val": "images/train", "names": list(names)}))
    return root / "data.yaml"


@pytest.mark.parametrize("small_first", [True, False])
def test_a_smaller_object_is_painted_over_a_larger_one_whatever_the_line_order(tmp_path: Path, small_first: bool):
    big = "0 0.0 0.0 0.6 0.0 0.6 0.6 0.0 0.6"  # pixels 0..24 × 0..24, class 0 -> index 1
    small = "1 0.25 0.25 0.75 0.25 0.75 0.75 0.25 0.75"  # pixels 10..30 × 10..30, class 1 -> index 2
    data = write_polygon_dataset(tmp_path, [small, big] if small_first else [big, small], names=("big", "small"))
    task = SemanticTask()
    spec = task.prepare(str(data))
    assert spec.names == {0: "background", 1: "big", 2: "small"} and spec.extra["polygon_labels"]
    mask = task.dataset(spec, "train", 40, None)[0]["mask"]
    expected = torch.zeros(40, 40, dtype=torch.uint8)
    expected[0:24, 0:24] = 1
    expected[10:30, 10:30] = 2
    assert torch.equal(mask, expected)


def test_bad_polygon_lines_are_reported_and_masks_still_win_over_labels(tmp_path: Path):
    data = write_polygon_dataset(tmp_path, ["0 0.0 0.0 0.5 0.0 0.5 0.5", "5 0.1 0.1 0.2 0.1 0.2 0.2"])
    task = SemanticTask()
    with pytest.warns(DatasetWarning, match="a.txt:2: class id 5 is outside names"):
        sample = task.dataset(task.prepare(str(data)), "train", 40, None)[0]
    assert set(sample["mask"].unique().tolist()) == {0, 1}
    (tmp_path / "masks" / "train").mkdir(parents=True)  # a masks/ folder beside images/: the ordinary format
    Image.fromarray(np.full((40, 40), 2, dtype=np.uint8)).save(tmp_path / "masks" / "train" / "a.png")
    spec = task.prepare(str(data))
    assert not spec.extra["polygon_labels"] and spec.names == {0: "big", 1: "small"}


def test_segformer_trains_on_a_coco8_seg_style_yaml(tmp_path: Path):
    """``zoo train model=segformer-b0 data=<YOLO-seg YAML>``: images/ and labels/ only, no masks/ (what used to be
    'no usable image with a valid mask')."""
    from zoo_core.data.shapes import ShapesConfig, materialize_shapes
    from zoo_core.facade import LibreYOLO

    root = materialize_shapes(ShapesConfig(num_train=8, num_val=4, image_size=64, seed=0), cache=tmp_path)
    assert not (root / "segment" / "masks").exists()
    model = LibreYOLO("segformer-b0", num_classes=5, seed=0)
    result = model.train(data=str(root / "segment.yaml"), epochs=1, batch=4, imgsz=64, device="cpu", workers=0, seed=0,
                         plots=False, verbose=False, project=str(tmp_path / "runs"))
    assert result.epochs_completed == 1 and np.isfinite(result.history[0]["train/loss"])
    assert 0.0 <= result.metrics["mIoU"] <= 1.0 and model.names[0] == "background"
