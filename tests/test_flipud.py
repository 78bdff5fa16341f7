"""``flipud``: the up-down flip Ultralytics users set for aerial and microscope images, in every task that flips,
with boxes and masks flipped with the pixels; at its default 0 it draws no random number, so runs stay as they were."""

from __future__ import annotations

import random

import pytest
import torch

from zoo_core.engine.config import TrainConfig
from zoo_core.tasks import get_task
from zoo_core.tasks.base import AugmentSettings

DATA = "shapes:train=2,val=1,size=64,seed=4"
# Every random transform off except the one under test.
STILL = dict(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0, degrees=0.0, translate=0.0, scale=0.0, fliplr=0.0, mosaic=0.0)


def _sample(task_name: str, settings: AugmentSettings | None) -> dict:
    task = get_task(task_name)
    spec = task.prepare(DATA)
    return task.dataset(spec, "train", 64, settings)[0]


@pytest.mark.parametrize("task_name", ["detect", "segment"])
def test_flipud_flips_the_image_its_boxes_and_its_masks(task_name):
    plain = _sample(task_name, AugmentSettings(**STILL))
    flipped = _sample(task_name, AugmentSettings(**STILL, flipud=1.0))
    assert torch.equal(flipped["image"], plain["image"].flip(-2))
    x1, y1, x2, y2 = plain["boxes"].unbind(1)
    torch.testing.assert_close(flipped["boxes"], torch.stack([x1, 64 - y2, x2, 64 - y1], dim=1))
    assert len(plain["boxes"]) and torch.equal(flipped["classes"], plain["classes"])
    if task_name == "segment":
        assert torch.equal(flipped["masks"], plain["masks"].flip(-2))


def test_flipud_flips_semantic_masks_with_their_pixels():
    plain = _sample("semantic", AugmentSettings(**STILL))
    flipped = _sample("semantic", AugmentSettings(**STILL, flipud=1.0))
    assert torch.equal(flipped["image"], plain["image"].flip(-2)) and torch.equal(flipped["mask"], plain["mask"].flip(-2))


def test_flipud_at_its_default_draws_no_random_number_and_reaches_the_tasks_from_the_arguments(monkeypatch):
    from zoo_core.plugin_manager import get_plugin_manager

    draws = []
    original = random.random
    monkeypatch.setattr(random, "random", lambda: draws.append(1) or original())
    _sample("detect", AugmentSettings(**STILL))
    assert draws == [], "an augmentation switched off drew a random number: other runs' draws would shift"
    _sample("detect", AugmentSettings(**STILL, flipud=0.5))
    assert draws == [1]
    recipe = get_plugin_manager().training_recipe("yolo9", "t")
    assert recipe.augment_settings(TrainConfig(data="shapes", flipud=0.5)).flipud == 0.5
    assert recipe.augment_settings(TrainConfig(data="shapes")).flipud == 0.0
