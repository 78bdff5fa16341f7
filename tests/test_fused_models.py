"""Every family's inference form (``zoo_core.export.inference_form``: BatchNorms folded, branches merged, the
DETRs' query order fixed) gives the outputs of the model it was made from: what ``predict`` runs is the model.

RF-DETR's fused decoder once listed its proposals in token order: each query slot carries its own learned
embedding, so that changed its detections (top scores 0.04-0.06 off); this test would catch it again.
"""

from __future__ import annotations

import pytest
import torch

from zoo_core.export import inference_form
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.registry import load_registry

from . import family_checks as checks

REGISTRY = load_registry()
SMALLEST = [
    pytest.param(family, min(declaration.sizes, key=lambda size: declaration.sizes[size].params), id=family)
    for family, declaration in REGISTRY.items()
]

_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)


def _side(model: torch.nn.Module, task: str) -> int:
    side = max(128 if task == "semantic" else 64, int(getattr(model, "minimum_input_size", 64)))
    return -(-side // 32) * 32


def _detections(model: torch.nn.Module, outputs) -> list[tuple[float, int, tuple[float, ...]]]:
    """The best detections of each image as ``(score, label, box)``, those within 1e-4 of the 50th left out: a DETR
    scores many queries alike, and the fused decoder's other summation order may swap two near-equal ones."""
    found = []
    for detection in model.postprocess(outputs, conf=0.0, iou=0.7, max_det=50):
        scores = detection["scores"]
        clear = scores > scores.min() + 1e-4 if len(scores) else scores.bool()
        listed = zip(scores[clear].tolist(), detection["labels"][clear].tolist(), map(tuple, detection["boxes"][clear].tolist()))
        # near-equal scores listed by label and box: the two forms may rank them either way
        found.extend(sorted(listed, key=lambda item: (round(item[0], 4), item[1], item[2])))
    return found


@pytest.mark.parametrize(("family", "size"), SMALLEST)
@torch.no_grad()
def test_the_inference_form_gives_the_models_outputs(family: str, size: str):
    task = REGISTRY[family].task
    torch.manual_seed(0)
    model = get_plugin_manager().build_model(family, size, 3)
    if not callable(getattr(model, "fuse", None)):
        pytest.skip(f"{family} has no fused form: its inference form is the model itself")
    checks.randomise_batch_norms("wide", model)
    model.eval()
    side = _side(model, task)
    images = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(1))
    fused = inference_form(model)
    if task != "detect":
        fused_outputs, outputs = fused(images), model(images)
        if isinstance(outputs, dict) and "boxes" in outputs:
            # Boxes are in pixels after the distribution decode, where folding BatchNorm into the convs moves
            # float32 rounding by ~1e-5 (seen: 1.1e-5 on one of 672 yolo9-seg values): the detection check's 1e-3.
            torch.testing.assert_close(fused_outputs.pop("boxes"), outputs.pop("boxes"), atol=1e-3, rtol=1e-5)
        torch.testing.assert_close(fused_outputs, outputs, atol=1e-5, rtol=1e-5)
        return
    expected, got = _detections(model, model(images)), _detections(fused, fused(images))
    assert len(expected) > 10 and len(got) == len(expected)
    for (score, label, box), (fused_score, fused_label, fused_box) in zip(expected, got):
        assert label == fused_label and abs(score - fused_score) <= 1e-5
        torch.testing.assert_close(torch.tensor(fused_box), torch.tensor(box), atol=1e-3, rtol=1e-5)
