"""E6: DDP averages gradients, so two ranks at batch 4 equal one process at batch 8.

Same initial weights, same data, no augmentation, SGD (scale-sensitive, unlike Adam), no
clipping: the parameters after three optimizer steps must agree. The same comparison with a
loss multiplied by the world size — the classic bug — must fail, which shows the test would
catch it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zoo_core.facade import LibreYOLO

from .support import use_test_families, write_class_folders

pytestmark = pytest.mark.timeout(240)

SETTINGS = dict(
    epochs=1, batch=8, imgsz=32, workers=0, nbs=8, optimizer="SGD", lr0=0.1, momentum=0.9, weight_decay=5e-4,
    warmup_epochs=0, ema=False, augment=False, val=False, sync_bn=True, max_grad_norm=None, verbose=False, plots=False,
)


def trained_weights(initial: Path, data: Path, device: str, name: str, **options) -> dict[str, torch.Tensor]:
    model = LibreYOLO(initial, options=options)
    result = model.train(data=str(data), device=device, name=name, **SETTINGS)
    assert result.accumulate == 1 and len(result.history) == 1
    return torch.load(result.last, map_location="cpu", weights_only=True)["train_model"]


def differences(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> list[str]:
    return [key for key in first if first[key].is_floating_point() and not torch.allclose(first[key], second[key], rtol=1e-4, atol=1e-6)]


def test_e6_two_ranks_at_half_batch_equal_one_process_and_a_scaled_loss_would_not(tmp_path):
    use_test_families()
    data = write_class_folders(tmp_path / "data")  # 24 images: three steps of 8
    torch.manual_seed(0)
    initial = LibreYOLO("tinynet-s").save(tmp_path / "initial.safetensors")

    one_process = trained_weights(initial, data, "cpu", "single")
    two_ranks = trained_weights(initial, data, "cpu,cpu", "ddp")
    before = LibreYOLO(initial).model.state_dict()
    assert differences(one_process, before), "training changed nothing: the comparison would be vacuous"
    assert differences(one_process, two_ranks) == []

    scaled = trained_weights(initial, data, "cpu,cpu", "ddp-scaled", loss_scale_by_world_size=True)
    assert differences(one_process, scaled), "a loss scaled by world size must change the result"
