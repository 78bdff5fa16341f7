"""D-FINE-seg (plugins/zoo_dfine/segment.py, zoo_core/detr/mask_head.py, mask_losses.py, segmenter.py): LibreYOLO 1.6.0's
parameter counts, its outputs both ways (tests/test_libreyolo_oracle.py runs the oracle case), the mask loss and the
postprocess contract."""

from __future__ import annotations

import pytest
import torch

from zoo_core.plugin_manager import get_plugin_manager

from . import family_checks as checks

_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)
pytestmark = pytest.mark.timeout(600)

# LibreYOLO 1.6.0 LibreDFINEModel(size, 80, enable_mask_head=True, train_from_scratch=True): sum of its parameters.
LIBREYOLO_PARAMS = {"n": 4_193_957, "s": 11_898_069, "m": 21_166_256, "l": 32_866_040, "x": 64_389_976}


def _build(size: str = "n", num_classes: int = 3, **options):
    return get_plugin_manager().build_model("dfine_seg", size, num_classes, options)


@pytest.mark.parametrize("size", list(LIBREYOLO_PARAMS))
def test_parameter_counts_are_libreyolos(size: str):
    with torch.device("meta"):
        model = _build(size, 80)
    assert model.published_parameter_count() == LIBREYOLO_PARAMS[size]


def test_oracle_case_reproduces_libreyolo_both_ways(tmp_path):
    from .oracle_cases import TOLERANCE, compare_on_random_weights

    outcome = compare_on_random_weights("dfine_seg", "n", tmp_path)
    assert outcome["zoo_params"] == outcome["libreyolo_params"]
    assert outcome["loaded_difference"] <= TOLERANCE and outcome["written_difference"] <= TOLERANCE, outcome


def _batch(side: int = 64):
    batch = checks.synthetic_batch(side)
    ys, xs = torch.meshgrid(torch.arange(side) + 0.5, torch.arange(side) + 0.5, indexing="ij")
    masks = []
    for _, _, x1, y1, x2, y2 in batch["targets"].tolist():
        cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
        masks.append((((xs - cx) / rx) ** 2 + ((ys - cy) / ry) ** 2 <= 1).to(torch.uint8))
    return {**batch, "masks": torch.stack(masks)}


def test_loss_has_mask_terms_reaches_every_parameter_and_needs_masks():
    torch.manual_seed(0)
    model = _build(num_queries=10, num_denoising=10).train()
    batch = _batch()
    outputs = model(batch["images"], targets=batch["targets"])
    assert outputs["layers"][-1]["masks"].shape[-2:] == (16, 16)
    loss, items = model.loss(outputs, batch)
    assert {"mask_bce", "mask_dice", "cls", "l1", "giou"} <= set(items)
    assert torch.isfinite(loss) and items["mask_dice"].item() > 0.1 and items["mask_bce"].item() > 0.0
    loss.backward()
    assert [name for name, parameter in model.named_parameters() if parameter.grad is None] == []
    with pytest.raises(ValueError, match="needs 'masks'"):
        model.loss(model(batch["images"], targets=batch["targets"]), {"images": batch["images"], "targets": batch["targets"]})


def test_mask_terms_fall_as_the_masks_are_learnt():
    torch.manual_seed(0)
    model = _build(num_queries=10, num_denoising=10).train()
    batch = _batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    history = []
    for _ in range(10):
        loss, items = model.loss(model(batch["images"], targets=batch["targets"]), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(items["mask_dice"].item() + items["mask_bce"].item())
    assert history[-1] < 0.9 * history[0]


def test_postprocess_contract():
    from zoo_core.ops.boxes import ImagePlacement

    torch.manual_seed(0)
    model = _build(num_queries=10, num_denoising=10).eval()
    with torch.no_grad():
        outputs = model(torch.rand(2, 3, 64, 96))
    assert outputs["mask_coefficients"].shape == (2, 10, 128) and outputs["mask_features"].shape == (2, 128, 16, 24)
    results = model.postprocess(outputs, conf=0.0, iou=0.7, max_det=5)
    for result in results:
        assert len(result["boxes"]) == len(result["masks"]) == 5 and result["masks"].dtype == torch.bool
        assert result["masks"].shape[1:] == (64, 96)
    placed = model.postprocess(outputs, 0.0, 0.7, 5, placements=[ImagePlacement(((0.5, 0.5), (0.0, 0.0)), (128, 192))] * 2)
    assert placed[0]["masks"].shape[1:] == (128, 192)
    with pytest.raises(ValueError, match="one per image"):
        model.postprocess(outputs, 0.1, 0.7, 5, placements=[ImagePlacement(((1.0, 1.0), (0.0, 0.0)), (64, 96))])
