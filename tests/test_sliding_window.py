"""zoo_core/ops/sliding_window.py: window placement, overlap averaging, and agreement with whole-image inference."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo_core.ops.sliding_window import sliding_window_logits, window_starts

from .segmentation_oracle import build


# ------------------------------------------------------------------------------ placement
@pytest.mark.parametrize(
    ("length", "window", "stride", "starts"),
    [
        (10, 4, 3, [0, 3, 6]),  # fits exactly: the last window ends on the border
        (11, 4, 3, [0, 3, 6, 7]),  # the last window is pulled back to end on the border
        (8, 4, 4, [0, 4]),  # tiling without overlap
        (4, 4, 2, [0]),  # window == side: one window
        (3, 4, 2, [0]),  # side shorter than the window: the side is processed whole
        (6, 4, 1, [0, 1, 2]),
    ],
)
def test_window_starts_by_hand(length, window, stride, starts):
    assert window_starts(length, window, stride) == starts


# ------------------------------------------------------------------------------ averaging
class CropMean(nn.Module):
    """Logits that depend on the whole crop (its mean), so overlaps average distinct values."""

    def forward(self, crop: torch.Tensor) -> torch.Tensor:
        return crop.mean(dim=(1, 2, 3), keepdim=True).expand(-1, 1, *crop.shape[-2:])


def test_overlapping_windows_average_by_hand():
    image = torch.arange(6.0).view(1, 1, 1, 6)  # values 0..5 along the width
    # Windows of width 4, stride 2: [0, 4) has mean 1.5 and [2, 6) has mean 3.5.
    logits = sliding_window_logits(CropMean(), image, window=(1, 4), stride=(1, 2), num_classes=1)
    assert torch.equal(logits.view(-1), torch.tensor([1.5, 1.5, 2.5, 2.5, 3.5, 3.5]))


def test_shifted_last_window_by_hand():
    image = torch.arange(5.0).view(1, 1, 5, 1)  # 0..4 along the height
    # Window 3, stride 2: starts [0, 2]; crops [0, 1, 2] (mean 1) and [2, 3, 4] (mean 3).
    logits = sliding_window_logits(CropMean(), image, window=(3, 1), stride=(2, 1), num_classes=1)
    assert torch.equal(logits.view(-1), torch.tensor([1.0, 1.0, 2.0, 3.0, 3.0]))


# ------------------------------------------------------------------------------ agreement with whole-image inference
@pytest.mark.parametrize(
    ("height", "width", "window", "stride"),
    [
        (64, 96, 32, 16),
        (64, 96, (32, 48), (20, 30)),  # rectangular windows, strides that do not divide the image
        (50, 70, 32, 32),  # no overlap, shifted last windows
        (40, 40, 64, 32),  # window larger than the image: one whole-image pass
    ],
)
def test_a_pointwise_model_gives_the_whole_image_logits(height, width, window, stride):
    torch.manual_seed(0)
    model = nn.Conv2d(3, 5, 1).eval()  # a 1×1 conv: each pixel's logits depend on that pixel only
    image = torch.randn(2, 3, height, width)
    with torch.no_grad():
        whole = model(image)
        slid = sliding_window_logits(model, image, window, stride, num_classes=5)
    assert slid.shape == whole.shape
    torch.testing.assert_close(slid, whole, rtol=0, atol=1e-6)


def test_a_window_covering_the_image_equals_one_segformer_pass():
    torch.manual_seed(0)
    model = build("segformer", "b0", 4).eval()
    image = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        torch.testing.assert_close(sliding_window_logits(model, image, (64, 96), 32, 4), model(image), rtol=0, atol=0)


def test_segformer_windows_cover_the_image_with_the_right_shape():
    model = build("segformer", "b0", 4).eval()
    with torch.no_grad():
        logits = sliding_window_logits(model, torch.randn(1, 3, 96, 160), 64, 48, 4)
    assert logits.shape == (1, 4, 96, 160) and torch.isfinite(logits).all()


def test_coarse_model_outputs_are_resized_to_the_crop():
    class Coarse(nn.Module):
        def forward(self, crop):  # a constant map at half resolution
            return torch.ones(crop.shape[0], 2, crop.shape[-2] // 2, crop.shape[-1] // 2)

    logits = sliding_window_logits(Coarse(), torch.zeros(1, 3, 16, 24), 8, 4, 2)
    assert logits.shape == (1, 2, 16, 24) and torch.allclose(logits, torch.ones_like(logits))


def test_half_precision_outputs_accumulate_in_float32():
    model = lambda crop: torch.full((crop.shape[0], 1, *crop.shape[-2:]), 0.1, dtype=torch.float16)  # noqa: E731
    logits = sliding_window_logits(model, torch.zeros(1, 3, 8, 8), 4, 1, 1)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, torch.full_like(logits, torch.tensor(0.1, dtype=torch.float16).item()))


# ------------------------------------------------------------------------------ errors
def test_bad_arguments_are_named():
    model = nn.Conv2d(3, 2, 1)
    image = torch.zeros(1, 3, 8, 8)
    with pytest.raises(ValueError, match="exceeds window"):
        sliding_window_logits(model, image, 4, 5, 2)
    with pytest.raises(ValueError, match="expected 1×3×h×w"):
        sliding_window_logits(model, image, 4, 4, 3)
    with pytest.raises(ValueError, match="window"):
        sliding_window_logits(model, image, (4, 4, 4), 4, 2)
    with pytest.raises(ValueError, match="N×C×H×W"):
        sliding_window_logits(model, image[0], 4, 4, 2)
