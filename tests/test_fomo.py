"""FOMO (plugins/zoo_fomo, task ``points``): LibreYOLO 1.6 parity of heatmap, targets, loss and decoding; learning.

Every size against LibreYOLO (converted checkpoints both ways) is ``benchmarks/libreyolo_oracle.py fomo``.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch
from PIL import Image

from zoo_core.tasks.predictions import PointsResult
from zoo_fomo.convert import convert, from_libreyolo, to_libreyolo
from zoo_fomo.model import FomoSpec, SamePadConv2d, centroid_targets, decode_centroids

from . import family_checks as checks

# one torch thread: the learning runs' scores must not depend on the worker's thread count (reduction order)
_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)

pytestmark = pytest.mark.timeout(600)


def _fomo(size: str = "s", num_classes: int = 1, **options) -> torch.nn.Module:
    return checks.build_family("fomo", size, num_classes, **options)


randomise_batch_norms = partial(checks.randomise_batch_norms, "uniform")


def _oracle_pair(num_classes: int):
    from libreyolo.models.fomo.nn import LibreFOMOModel

    torch.manual_seed(0)
    reference = randomise_batch_norms(LibreFOMOModel("s", nc=num_classes)).eval()
    model = _fomo("s", num_classes).eval()
    model.load_state_dict(convert("s", reference.state_dict(), "libreyolo", "zoo"), strict=True)
    return reference, model


def test_config_and_option_errors_name_the_key():
    with pytest.raises(ValueError, match="'width'"):
        FomoSpec.from_config({"alpha": 0.35})
    with pytest.raises(ValueError, match="object_weight"):
        _fomo(object_weight=-1)
    with pytest.raises(ValueError, match="multiples of 8"):
        _fomo()(torch.rand(1, 3, 60, 64))


def test_same_padding_is_tensorflow_same():
    conv = SamePadConv2d(1, 1, 3, 2)
    assert conv._pads(96, 3, 2) == (0, 1) and conv._pads(97, 3, 2) == (1, 1) and conv._pads(12, 3, 1) == (1, 1)
    assert conv(torch.zeros(1, 1, 97, 96)).shape[-2:] == (49, 48)


def test_heatmap_equals_libreyolo_and_the_keys_convert_both_ways():
    reference, model = _oracle_pair(3)
    images = torch.rand(2, 3, 96, 96)
    with torch.no_grad():
        expected = reference((images - 0.5) / 0.5)  # LibreYOLO's preprocessing; zoo maps [0, 1] inside the model
        logits = model(images)
    assert logits.shape == (2, 4, 12, 12)
    assert float((logits - expected).abs().max()) <= 1e-5
    back = to_libreyolo("s", model.state_dict())
    checks.assert_state_dicts_equal(back, reference.state_dict())
    assert convert("s", model.state_dict(), "zoo", "libreyolo").keys() == back.keys()
    # other layouts: no answer, and zoo-keyed tensors are not LibreYOLO's
    assert convert("s", reference.state_dict(), "upstream", "zoo") is None
    assert convert("s", model.state_dict(), "libreyolo", "zoo") is None
    with pytest.raises(KeyError):
        from_libreyolo({"backbone.block_0.conv.0.0.conv.weight": torch.zeros(1)})


def test_cell_targets_match_libreyolo_and_the_last_box_of_a_cell_wins():
    from libreyolo.models.fomo.dataset import _boxes_xyxy_to_grid

    torch.manual_seed(1)
    corners = torch.rand(12, 2) * 80
    boxes = torch.cat((corners, corners + torch.rand(12, 2) * 20 + 1), dim=1)
    images, classes = torch.tensor([0] * 5 + [1] * 7), torch.randint(0, 3, (12,))
    targets = torch.cat((images[:, None].float(), classes[:, None].float(), boxes), dim=1)
    targets = torch.cat((targets, targets[:1] * torch.tensor([1, 0, 1, 1, 1, 1.0])))  # box 0 again, as class 0
    grid = centroid_targets(targets, 2, (12, 12), (96, 96))
    for image in range(2):
        rows = targets[targets[:, 0] == image]
        assert torch.equal(grid[image], _boxes_xyxy_to_grid(rows[:, 2:].numpy(), rows[:, 1].long().numpy(), 96, 12))


def test_loss_equals_libreyolo_and_reaches_every_parameter():
    from libreyolo.models.fomo.loss import FOMOLoss

    _, model = _oracle_pair(3)
    model.train()
    images = torch.rand(2, 3, 96, 96)
    targets = torch.tensor([[0, 0, 10, 10, 30, 40], [0, 2, 50, 60, 90, 90], [1, 1, 20, 5, 40, 25.0]])
    logits = model(images)
    loss, items = model.loss(logits, {"images": images, "targets": targets})
    expected = FOMOLoss(3, fg_weight=100.0)(logits, centroid_targets(targets, 2, (12, 12), (96, 96)))["total_loss"]
    assert float(loss) == pytest.approx(float(expected), rel=1e-6) and set(items) == {"ce"}
    loss.backward()
    assert all(parameter.grad is not None for parameter in model.parameters())
    empty, _ = model.loss(model(images), {"images": images, "targets": torch.zeros(0, 6)})
    assert math.isfinite(float(empty))


def test_decoding_matches_libreyolo_points_and_the_points_contract():
    from libreyolo.models.fomo.utils import decode_points_from_logits

    torch.manual_seed(2)
    logits = torch.randn(2, 3, 12, 12) * 3
    for radius in (0, 1, 2):
        mine = decode_centroids(logits, (96, 96), conf=0.5, radius=radius)
        theirs = decode_points_from_logits(logits, conf_threshold=0.5, nms_radius=radius)
        for ours, reference in zip(mine, theirs):
            assert len(ours["points"]) == len(reference) > 0
            # LibreYOLO: grid x, y, class + 1, score; zoo: cell centres in input pixels, classes from 0
            assert torch.allclose(ours["points"], (reference[:, :2] + 0.5) * 8)
            assert torch.equal(ours["labels"], reference[:, 2].long() - 1)
            assert torch.allclose(ours["scores"], reference[:, 3])
    model = _fomo("s", 2).eval()
    with torch.no_grad():
        results = model.postprocess(model(torch.rand(3, 3, 96, 64)), conf=0.0, max_det=5)
    for item in results:
        assert item["points"].shape[1:] == (2,) and item["labels"].dtype == torch.int64
        assert len(item["points"]) == len(item["scores"]) == len(item["labels"]) <= 5
        assert (item["points"][:, 0] <= 64).all() and (item["points"][:, 1] <= 96).all()


def test_fomo_s_overfits_a_fixed_sample_to_a_high_centroid_f1(tmp_path: Path, learning):
    # The points task reads detection data; 40 epochs (80 steps; 30 were too few). The threshold is 80 % of the
    # worst f1 over seeds and thread counts (benchmarks/learning_margins.py).
    model, metrics, images = checks.overfit_fixed_sample(tmp_path, "fomo-s", "detect", images=16, size=96, batch=8,
                                                         epochs=40, optimizer="Adam", lr0=0.003, seed=learning.seed)
    first = images / "000000.png"
    (result,) = model.predict(str(first), save=True, conf=0.5)
    assert isinstance(result, PointsResult)
    drawn = (len(result.points) > 0 and bool(set(result.labels.tolist()) & checks.true_classes(first))
             and Image.open(result.save_path).size == (96, 96))
    learning.expect(metrics, {"f1": 0.75}, checks={"drawing": drawn})


def test_fomo_s_trains_one_epoch_on_two_spawned_cpu_ranks():
    model, result = checks.train_on_two_spawned_cpu_ranks("fomo-s", num_train=4, num_val=2, metric="f1", imgsz=32)
    assert set(result.metrics) >= {"precision", "recall", "f1"}
    checks.assert_caller_holds_rank_zeros_best(model, result)
