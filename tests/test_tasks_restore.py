"""Restoration: on-the-fly degradation, paired folders, PSNR/SSIM by hand, prediction at full size."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from zoo_core.data.errors import DatasetError, DatasetWarning
from zoo_core.data.restore_format import degrade
from zoo_core.tasks.base import AugmentSettings
from zoo_core.tasks.restore import RestoreTask
from zoo_core.tasks.runner import predict, validate

from .doubles import TinyRestorer, fake_libre


def save_random(path: Path, size: tuple[int, int], seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = size
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)).save(path)


def test_clean_folders_are_degraded_on_the_fly_deterministically_in_validation(tmp_path: Path):
    root = tmp_path / "photos"
    for split, count in (("train", 2), ("val", 2)):
        for index in range(count):
            save_random(root / split / f"{index}.png", (40, 30), seed=index + (10 if split == "val" else 0))
    task = RestoreTask()
    spec = task.prepare(root)
    assert spec.extra["degradation"] == {"scale": 2, "noise": 15.0} and spec.names == {}
    val = task.dataset(spec, "val", 32, None)
    first, again = val[1], val[1]
    assert torch.equal(first["image"], again["image"])  # the same noise every time
    assert first["image"].shape == first["target"].shape == (3, 32, 32) and not torch.equal(first["image"], first["target"])
    train = task.dataset(spec, "train", 32, AugmentSettings())
    random.seed(0)
    torch.manual_seed(0)
    one = train[0]
    torch.manual_seed(1)
    random.seed(0)
    two = train[0]
    assert torch.equal(one["target"], two["target"]) and not torch.equal(one["image"], two["image"])  # fresh noise


def test_small_images_are_padded_by_reflection_to_the_crop(tmp_path: Path):
    root = tmp_path / "photos"
    save_random(root / "train" / "a.png", (10, 6), 0)
    save_random(root / "val" / "b.png", (10, 6), 1)
    task = RestoreTask()
    sample = task.dataset(task.prepare(root), "val", 24, None)[0]
    assert sample["target"].shape == (3, 24, 24)


def test_paired_folders_pair_by_stem_and_report_problems(tmp_path: Path):
    root = tmp_path / "pairs"
    for split in ("train", "val"):
        save_random(root / split / "target" / "a.png", (32, 32), 1)
        save_random(root / split / "input" / "a.jpg", (32, 32), 2)
    save_random(root / "train" / "target" / "lonely.png", (32, 32), 3)
    save_random(root / "train" / "target" / "wrong.png", (32, 32), 4)
    save_random(root / "train" / "input" / "wrong.png", (30, 32), 5)
    task = RestoreTask()
    spec = task.prepare(root)
    assert spec.train.paired
    with pytest.warns(DatasetWarning) as caught:
        dataset = task.dataset(spec, "train", 32, None)
    messages = " | ".join(str(w.message) for w in caught)
    assert "lonely.png: no degraded partner" in messages and "wrong.png: size (32, 30) differs" in messages
    assert len(dataset) == 1
    sample = dataset[0]
    expected = torch.from_numpy(np.array(Image.open(root / "train" / "input" / "a.jpg"))).permute(2, 0, 1)
    assert torch.equal(sample["image"], expected)  # the given degraded image, not a synthetic one


def test_yaml_with_degradation_and_its_validation(tmp_path: Path):
    root = tmp_path / "d"
    save_random(root / "clean" / "a.png", (32, 32), 0)
    save_random(root / "noisy" / "a.png", (32, 32), 1)
    config = {"train": "clean", "val": {"input": "noisy", "target": "clean"}, "degradation": {"scale": 4, "noise": 0}}
    (root / "restore.yaml").write_text(yaml.safe_dump(config))
    spec = RestoreTask().prepare(root / "restore.yaml")
    assert spec.extra["degradation"] == {"scale": 4, "noise": 0.0} and spec.val.paired and not spec.train.paired
    for bad, message in (({"scale": 0}, "scale must be an integer >= 1"), ({"noise": -1}, "noise must be a number >= 0"),
                         ({"scale": 1, "noise": 0}, "leaves images unchanged"), ({"blur": 2}, "keys scale and noise")):
        (root / "restore.yaml").write_text(yaml.safe_dump({**config, "degradation": bad}))
        with pytest.raises(DatasetError, match=message):
            RestoreTask().prepare(root / "restore.yaml")
    with pytest.raises(DatasetError, match="missing train/"):
        RestoreTask().prepare(root / "clean")


def test_degrade_blurs_by_the_scale_and_adds_noise_of_the_level():
    torch.manual_seed(0)
    stripes = torch.zeros(3, 64, 64, dtype=torch.uint8)
    stripes[:, :, ::2] = 255  # finest possible detail: lost entirely by a 2x down/up-sampling
    blurred = degrade(stripes, scale=2, noise=0.0)
    assert blurred.float().std() < 0.1 * stripes.float().std()
    flat = torch.full((3, 128, 128), 128, dtype=torch.uint8)
    noisy = degrade(flat, scale=1, noise=10.0, generator=torch.Generator().manual_seed(0))
    assert float((noisy.float() - 128).std()) == pytest.approx(10.0, rel=0.05)


def test_psnr_is_the_per_image_mean_and_ssim_of_a_perfect_restoration_is_one():
    targets = torch.full((2, 3, 8, 8), 128, dtype=torch.uint8)
    # image 0: input off by 25 grey levels everywhere (PSNR 20 log10(255/25)); image 1: off by 5
    inputs = targets.clone()
    inputs[0] += 25
    inputs[1] += 5
    batch = {"images": inputs, "targets": targets, "indices": torch.tensor([0, 1])}

    class Perfect(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return torch.full_like(images, 128 / 255)

    class Identity(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return images

    expected_input = (20 * math.log10(255 / 25) + 20 * math.log10(255 / 5)) / 2  # not the PSNR of the mean MSE
    metrics = RestoreTask().validate(Identity(), [batch], torch.device("cpu"), {})
    assert metrics["psnr"] == pytest.approx(expected_input, abs=1e-4) and metrics["psnr_input"] == pytest.approx(expected_input, abs=1e-4)
    perfect = RestoreTask().validate(Perfect(), [batch], torch.device("cpu"), {})
    assert perfect["psnr"] == pytest.approx(100.0) and perfect["ssim"] == pytest.approx(1.0)
    assert perfect["psnr_input"] == pytest.approx(expected_input, abs=1e-4)


def test_default_loss_and_prediction_at_full_size(tmp_path: Path):
    task = RestoreTask()
    batch = task.preprocess(task.example_batch(2, 16, 0), torch.device("cpu"))
    loss, items = task.loss(torch.nn.Identity(), batch["images"], batch)
    assert loss.item() == pytest.approx(float((batch["images"] - batch["targets"]).abs().mean())) and "l1" in items
    torch.manual_seed(0)
    libre = fake_libre(TinyRestorer(), "restore", {}, 32)
    (result,) = predict(libre, np.zeros((37, 45, 3), dtype=np.uint8), device="cpu", save=True)
    assert result.image.shape == (3, 37, 45) and result.image.dtype == torch.uint8
    assert result.save_path == Path("runs/restore/predict/image0.png")
    assert np.asarray(Image.open(result.save_path)).shape == (37, 45, 3)
    root = tmp_path / "photos"
    for split in ("train", "val"):
        save_random(root / split / "a.png", (40, 40), 0)
    metrics = validate(libre, data=root, imgsz=32, device="cpu", workers=0).metrics
    assert set(metrics) == {"psnr", "ssim", "psnr_input"}
