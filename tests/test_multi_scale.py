"""Multi-scale training and the no-augmentation phase: the published size rules, the batch resize,
which families train multi-scale, what their stop epoch turns off, and the trainer doing both."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from zoo_core.engine.multi_scale import ranged_sizes, scaled_size, sizes_around
from zoo_core.errors import ArgumentError
from zoo_core.facade import LibreYOLO
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.tasks.base import AugmentSettings
from zoo_core.tasks.detect import DetectionDataset, DetectTask

from . import family_checks as checks
from .support import use_test_families, write_class_folders

_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)

# Families whose published recipe trains multi-scale, with the first size that does.
MULTI_SCALE_FAMILIES = {"rtdetr": "r18", "dfine": "s", "deim": "s", "rtdetrv4": "s", "deimv2": "s", "rfdetr": "n"}
# Families whose stop epoch ends every augmentation but the flip (the DETR line's policy).
ONLY_FLIPS_AFTER_STOP = ("rtdetr", "dfine", "dfine_seg", "deim", "rtdetrv4", "deimv2", "ec")


def test_the_detr_rule_gives_rt_detrs_published_list_and_d_fines_repeats():
    assert sizes_around(640, 3) == (480, 512, 544, 576, 608, 640, 640, 640, 672, 704, 736, 768, 800)
    small = sizes_around(640, 20)
    assert small.count(640) == 20 and set(small) == set(sizes_around(640, 3))
    with pytest.raises(ValueError, match="base_repeat must be at least 1"):
        sizes_around(640, 0)


def test_the_yolo_rule_spans_half_to_one_and_a_half_times_in_stride_steps():
    assert ranged_sizes(640, 32) == tuple(range(320, 961, 32))
    assert ranged_sizes(40, 32) == (32,)  # never below one stride
    assert scaled_size(640, 480, 32) == (480, 480)
    assert scaled_size((320, 640), 480, 32) == (256, 480)  # both sides scaled, each a stride multiple


def test_a_resized_batch_keeps_its_boxes_on_the_same_pixels():
    batch = checks.synthetic_batch(64)
    resized = DetectTask().resize_batch(batch, (96, 96))
    assert resized["images"].shape[-2:] == (96, 96)
    torch.testing.assert_close(resized["targets"][:, 2:], batch["targets"][:, 2:] * 1.5)
    torch.testing.assert_close(resized["targets"][:, :2], batch["targets"][:, :2])
    # Inside the first box, the resized image still shows the box's colour.
    index, _, x1, y1, x2, y2 = resized["targets"][0].tolist()
    inside = resized["images"][int(index), :, int(y1) + 2:int(y2) - 2, int(x1) + 2:int(x2) - 2]
    torch.testing.assert_close(inside.mean(dim=(1, 2)), torch.tensor(checks.COLOURS[0]), atol=1e-4, rtol=0)
    assert batch["images"].shape[-2:] == (64, 64)  # the caller's batch is not changed


@pytest.mark.parametrize("family", sorted(get_plugin_manager().families))
def test_the_published_families_and_only_those_train_multi_scale_by_default(family):
    manager = get_plugin_manager()
    sizes = manager.family(family).sizes
    on = {size for size in sizes if manager.training_recipe(family, size).config_defaults.get("multi_scale", False)}
    if family in MULTI_SCALE_FAMILIES:
        assert MULTI_SCALE_FAMILIES[family] in on
    else:
        assert on == set()
    if family in ("dfine", "deim"):
        assert "n" not in on  # D-FINE N trains at one size (base_size_repeat ~)
    if family == "deimv2":
        assert on == {"s", "m", "l", "x"}  # only the DINOv3 sizes


@pytest.mark.parametrize("family", sorted(get_plugin_manager().families))
def test_the_stop_epoch_turns_off_what_the_family_publishes(family):
    manager = get_plugin_manager()
    size = next(iter(manager.family(family).sizes))
    settings = AugmentSettings(mosaic=1.0, mixup=0.5, hsv_h=0.1, degrees=5.0, scale=0.5, translate=0.1, multi_scale=True)
    closed = manager.training_recipe(family, size).closed_augmentation(settings)
    assert (closed.mosaic, closed.mixup, closed.fliplr) == (0.0, 0.0, settings.fliplr)
    if family in ONLY_FLIPS_AFTER_STOP:
        assert closed == AugmentSettings(hsv_h=0, hsv_s=0, hsv_v=0, degrees=0, translate=0, scale=0, mosaic=0, mixup=0,
                                         fliplr=settings.fliplr, multi_scale=False)
    else:
        assert closed == dataclasses.replace(settings, mosaic=0.0, mixup=0.0)


@pytest.mark.parametrize("family", sorted(MULTI_SCALE_FAMILIES))
def test_each_multi_scale_family_trains_at_its_smallest_and_largest_size(family):
    """A training forward pass and the loss at both ends of the size list drawn around 64 px (10 queries: the
    smallest input has fewer encoder tokens than the published 300)."""
    size = MULTI_SCALE_FAMILIES[family]
    recipe = get_plugin_manager().training_recipe(family, size)
    sizes = recipe.multi_scale_sizes(64)
    torch.manual_seed(0)
    model = checks.build_family(family, size, 3, num_queries=10).train()
    batch = checks.synthetic_batch(64)
    for side in (min(sizes), max(sizes)):
        resized = DetectTask().resize_batch(batch, (side, side))
        outputs = model(resized["images"], targets=resized["targets"])
        loss, _ = model.loss(outputs, resized)
        assert torch.isfinite(loss), f"{family}-{size} at {side} px"


def test_the_trainer_draws_a_size_per_batch_until_the_stop_epoch_then_trains_only_flipped(tmp_path: Path, monkeypatch):
    """deimv2-atto (the cheapest DETR; 10 queries for the 64 px end of its sizes) with multi_scale on, two epochs,
    the last one after the stop epoch."""
    resized: list[tuple[int, int]] = []
    updates: list[AugmentSettings] = []
    resize_batch, update = DetectTask.resize_batch, DetectionDataset.update_augmentation
    monkeypatch.setattr(DetectTask, "resize_batch", lambda self, batch, size: resized.append(size) or resize_batch(self, batch, size))
    monkeypatch.setattr(DetectionDataset, "update_augmentation", lambda self, settings: updates.append(settings) or update(self, settings))
    data = checks.sample_on_itself(tmp_path, "detect", images=4, size=96)
    LibreYOLO("deimv2-atto", options={"num_queries": 10}).train(
        data=str(data), epochs=2, batch=2, imgsz=96, close_mosaic=1, multi_scale=True, mosaic=0.0, device="cpu", workers=0,
        val=False, plots=False, verbose=False)
    allowed = set(get_plugin_manager().training_recipe("deimv2", "atto").multi_scale_sizes(96))
    assert len(resized) == 2 and {side for side, _ in resized} <= allowed  # both batches of epoch 1, none after
    assert [side == width for side, width in resized] == [True, True]
    (closed,) = updates
    assert closed.multi_scale is False and closed.hsv_v == 0.0 and closed.scale == 0.0 and closed.fliplr > 0


def test_multi_scale_on_a_task_that_trains_at_one_size_is_an_argument_error(tmp_path: Path):
    use_test_families()
    data = write_class_folders(tmp_path / "data")
    with pytest.raises(ArgumentError, match="multi_scale=True: 'classify' models train at one size; remove multi_scale"):
        LibreYOLO("tinynet-s").train(data=str(data), multi_scale=True, epochs=1, batch=4, imgsz=32, device="cpu", workers=0)


def test_a_run_never_draws_a_size_below_the_models_minimum_input():
    """A DETR needs as many encoder tokens as queries: sizes below ``minimum_input_size`` are left out."""
    from types import SimpleNamespace

    from zoo_core.engine.trainer import Trainer

    recipe = get_plugin_manager().training_recipe("rtdetr", "r18")
    run = SimpleNamespace(image_size=640, recipe=recipe, model=SimpleNamespace(minimum_input_size=576))
    assert Trainer._multi_scale_sides(run) == (576, 608, 640, 640, 640, 672, 704, 736, 768, 800)
    run.model = SimpleNamespace(minimum_input_size=1024)  # nothing fits: the training size itself
    assert Trainer._multi_scale_sides(run) == (640,)
    run.model = torch.nn.Linear(1, 1)  # no minimum
    assert Trainer._multi_scale_sides(run) == sizes_around(640, 3)
