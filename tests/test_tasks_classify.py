"""Classification: class folders, bad images, top-1/top-5, prediction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from zoo_core.data.errors import DatasetError, DatasetWarning
from zoo_core.tasks.base import AugmentSettings
from zoo_core.tasks.classify import ClassifyTask
from zoo_core.tasks.runner import predict, validate

from .doubles import TinyClassifier, fake_libre


def make_folders(root: Path, classes=("cat", "dog", "emu"), per_class: int = 2, splits=("train", "val")) -> Path:
    rng = np.random.default_rng(0)
    for split in splits:
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(per_class):
                Image.fromarray(rng.integers(0, 255, (20 + index, 24, 3), dtype=np.uint8)).save(folder / f"{index}.png")
    return root


def test_class_folders_give_sorted_names_and_dict_samples(tmp_path: Path):
    task = ClassifyTask()
    spec = task.prepare(make_folders(tmp_path / "d", classes=("emu", "cat", "dog")))
    assert spec.names == {0: "cat", 1: "dog", 2: "emu"} and spec.test is None
    dataset = task.dataset(spec, "val", 16, None)
    assert len(dataset) == 6
    batch = task.collate([dataset[0], dataset[5]])
    assert batch["images"].shape == (2, 3, 16, 16) and batch["images"].dtype == torch.uint8
    assert batch["labels"].tolist() == [0, 2] and batch["indices"].tolist() == [0, 5]
    augmented = task.dataset(spec, "train", 16, AugmentSettings())[0]["image"]
    assert augmented.shape == (3, 16, 16)


def test_missing_split_unknown_class_and_unreadable_images(tmp_path: Path):
    root = make_folders(tmp_path / "d")
    with pytest.raises(DatasetError, match="not a directory"):
        ClassifyTask().prepare(tmp_path / "absent")
    (root / "val" / "yak").mkdir()
    with pytest.raises(DatasetError, match="class folder not in train"):
        ClassifyTask().dataset(ClassifyTask().prepare(root), "val", 16, None)
    (root / "val" / "yak").rmdir()
    (root / "train" / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    with pytest.warns(DatasetWarning, match=r"cat/broken\.jpg: unreadable image"):
        dataset = ClassifyTask().dataset(ClassifyTask().prepare(root), "train", 16, None)
    assert len(dataset) == 6
    empty = make_folders(tmp_path / "e", per_class=0)
    with pytest.raises(DatasetError, match="no usable images"):
        ClassifyTask().dataset(ClassifyTask().prepare(empty), "train", 16, None)


def test_top1_and_top5_by_hand():
    # six classes; three images whose true class ranks 1st, 3rd and 6th in the logits:
    # top-1 = 1/3, top-5 = 2/3
    logits = torch.tensor([[6.0, 5, 4, 3, 2, 1], [6.0, 5, 4, 3, 2, 1], [6.0, 5, 4, 3, 2, 1]])

    class Fixed(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return logits[: len(images)]

    batch = {"images": torch.zeros(3, 3, 4, 4, dtype=torch.uint8), "labels": torch.tensor([0, 2, 5]), "indices": torch.arange(3)}
    metrics = ClassifyTask().validate(Fixed(), [batch], torch.device("cpu"), {i: str(i) for i in range(6)})
    assert metrics == {"top1": pytest.approx(1 / 3), "top5": pytest.approx(2 / 3)}


def test_runner_validates_and_predicts_probabilities(tmp_path: Path):
    root = make_folders(tmp_path / "d", splits=("train", "val", "test"))
    torch.manual_seed(0)
    libre = fake_libre(TinyClassifier(3), "classify", {0: "cat", 1: "dog", 2: "emu"}, 16)
    metrics = validate(libre, data=root, batch=4, device="cpu", workers=0, split="test").metrics
    assert set(metrics) == {"top1", "top5"} and metrics["top5"] == 1.0  # three classes: top-5 covers all
    (result,) = predict(libre, root / "val" / "dog" / "0.png", save=True, device="cpu")
    assert result.probs.shape == (3,) and float(result.probs.sum()) == pytest.approx(1.0, abs=1e-5)
    assert result.top1 == result.top5[0] and len(result.top5) == 3
    assert result.summary().startswith("0.png: ") and result.save_path == Path("runs/classify/predict/0.png")
    assert result.to_dict()["top1_name"] in ("cat", "dog", "emu")


def test_dropout_reaches_the_classifier_and_its_weights_file_and_other_tasks_refuse_it(tmp_path: Path):
    from zoo_core.errors import ArgumentError
    from zoo_core.facade import LibreYOLO

    data = make_folders(tmp_path / "data", per_class=4)
    model = LibreYOLO("resnet18")
    model.train(data=str(data), dropout=0.3, epochs=1, batch=4, imgsz=32, workers=0, plots=False, verbose=False,
                project=str(tmp_path / "runs"))
    assert model.options["drop_rate"] == 0.3 and model.model.drop_rate == 0.3  # timm's dropout before the fc layer
    reloaded = LibreYOLO(model.weights_path)
    assert reloaded.model.drop_rate == 0.3
    # Dropout is active in training only: two training-mode passes differ, eval passes do not.
    images = torch.rand(2, 3, 32, 32)
    reloaded.model.train()
    assert not torch.equal(reloaded.model(images), reloaded.model(images))
    reloaded.model.eval()
    assert torch.equal(reloaded.model(images), reloaded.model(images))
    with pytest.raises(ArgumentError, match="dropout=0.2: .* 'detect' models do not take it"):
        LibreYOLO("yolo9-t").train(data="shapes:train=4,val=2,size=64", dropout=0.2, epochs=1, imgsz=64, workers=0)
