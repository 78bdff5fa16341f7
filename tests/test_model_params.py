"""Every size of every registry family builds, and its parameter count is the published one.

Parametrized over registry.yaml, so a family added there is tested without touching this file
(the timm pattern). Counts are taken on the meta device: even convnextv2-h (660M) costs nothing.
A model whose published figure counts another form than the trainable graph (re-parameterised
branches merged, training-only auxiliary heads left out) says so with
``published_parameter_count()`` (zoo_core/tasks/base.py).
"""

from __future__ import annotations

import pytest
import torch

from zoo_core.building import count_parameters
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.registry import load_registry

REGISTRY = load_registry()
ALL_SIZES = [
    pytest.param(family, size, id=f"{family}-{size}")
    for family, declaration in REGISTRY.items()
    for size in declaration.sizes
]
SMALLEST_SIZES = [
    pytest.param(family, min(declaration.sizes, key=lambda s: declaration.sizes[s].params), id=family)
    for family, declaration in REGISTRY.items()
]


@pytest.mark.parametrize(("family", "size"), ALL_SIZES)
def test_parameter_count_matches_the_published_one(family: str, size: str):
    declaration = REGISTRY[family]
    published = declaration.sizes[size].params
    with torch.device("meta"):
        model = get_plugin_manager().build_model(family, size, declaration.published_num_classes)
    counter = getattr(model, "published_parameter_count", None)
    built = int(counter()) if callable(counter) else count_parameters(model)
    relative = abs(built - published) / published
    assert relative <= declaration.param_tolerance, (
        f"{family}-{size}: built {built:,} parameters, published {published:,} "
        f"({relative:.2%} off, tolerance {declaration.param_tolerance:.0%}; source: "
        f"{declaration.sizes[size].params_source})"
    )


@pytest.mark.parametrize(("family", "size"), SMALLEST_SIZES)
def test_the_smallest_size_runs_forward_with_few_classes(family: str, size: str):
    declaration = REGISTRY[family]
    torch.manual_seed(0)
    model = get_plugin_manager().build_model(family, size, 3).eval()
    side = max(64, int(getattr(model, "minimum_input_size", 64)))
    with torch.no_grad():
        output = model(torch.rand(1, 3, side, side))
    if declaration.task == "classify":
        assert output.shape == (1, 3)
    elif declaration.task == "semantic":
        assert output.shape == (1, 3, side, side)
    elif declaration.task == "restore":
        assert output.shape == (1, 3, side, side)
    elif declaration.task == "points":  # centroids, not boxes
        (points,) = model.postprocess(output, conf=0.0, max_det=10)
        assert points["points"].shape[1:] == (2,) and len(points["points"]) == len(points["scores"]) <= 10
    else:  # detect: the postprocess contract of zoo_core.tasks.detect
        (detections,) = model.postprocess(output, conf=0.0, iou=0.7, max_det=10)
        assert detections["boxes"].shape[1:] == (4,)
        assert len(detections["boxes"]) == len(detections["scores"]) == len(detections["labels"]) <= 10
