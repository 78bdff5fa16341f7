"""The OpenCV-backed augmentation transforms: same geometry and statistics as torchvision's, on uint8.

``RandomWarp`` replaced ``v2.RandomAffine`` followed by a centre crop, and ``RandomHSV`` replaced
``v2.ColorJitter`` (zoo_core/data/augment.py says why: speed). These tests hold the replacements
to what they replaced: pixels and boxes move together, masks keep their values, and the boxes a
mosaic yields have the same distribution as before.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from zoo_core.data.augment import PAD_VALUE, RandomHSV, RandomWarp, apply_v2, keep_visible_boxes, make_boxes


def _white_rectangle_canvas(size: int, box: tuple[int, int, int, int]) -> torch.Tensor:
    canvas = torch.full((3, size, size), PAD_VALUE, dtype=torch.uint8)
    x1, y1, x2, y2 = box
    canvas[:, y1:y2, x1:x2] = 255
    return canvas


@pytest.mark.parametrize("degrees", [0.0, 30.0])
def test_the_warped_box_encloses_the_warped_pixels(degrees):
    torch.manual_seed(3)
    box = (40, 50, 90, 80)
    canvas = _white_rectangle_canvas(160, box)
    warp = RandomWarp(degrees=degrees, translate=0.1, scale=0.3, output_size=(96, 96))
    for _ in range(5):
        image, boxes = apply_v2(warp, canvas, make_boxes([box], (160, 160)))
        assert image.shape == (3, 96, 96) and image.dtype == torch.uint8
        assert boxes.canvas_size == (96, 96)
        ys, xs = torch.nonzero(image[0] > 200, as_tuple=True)
        white = torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)
        # an axis-aligned warp gives the rectangle itself; a rotation gives the enclosing box of its corners
        assert torch.allclose(boxes.as_subclass(torch.Tensor)[0].clamp(0, 96), white, atol=1.5), (boxes, white)


def test_masks_keep_their_values_and_the_border_gets_the_mask_fill():
    torch.manual_seed(0)
    mask = torch.zeros((64, 64), dtype=torch.int32)
    mask[16:48, 16:48] = 300  # an ignore index past 8 bits travels through float32, exactly
    mask[20:30, 20:30] = 7
    warp = RandomWarp(degrees=10.0, translate=0.2, scale=0.5, mask_fill=999)
    image, warped = apply_v2(warp, torch.zeros((3, 64, 64), dtype=torch.uint8), tv_tensors.Mask(mask))
    assert warped.dtype == torch.int32 and warped.shape == (64, 64)
    assert set(torch.unique(warped.as_subclass(torch.Tensor)).tolist()) <= {0, 7, 300, 999}
    assert image.shape == (3, 64, 64)


def test_the_identity_warp_changes_nothing():
    image = torch.randint(0, 256, (3, 40, 56), dtype=torch.uint8)
    warped, boxes = apply_v2(RandomWarp(), image, make_boxes([[1.0, 2.0, 30.0, 20.0]], (40, 56)))
    assert torch.equal(warped, image)
    assert torch.allclose(boxes.as_subclass(torch.Tensor), torch.tensor([[1.0, 2.0, 30.0, 20.0]]))


def _mosaic_box_statistics(crop_and_warp, draws: int = 300) -> dict[str, float]:
    """Widths, heights, centres and counts of the boxes a mosaic-sized canvas yields after a warp."""
    size = 96
    grid = [[x, y, x + 20 + (x % 17), y + 14 + (y % 11)] for x in range(4, 2 * size - 40, 30) for y in range(6, 2 * size - 30, 26)]
    canvas = torch.full((3, 2 * size, 2 * size), PAD_VALUE, dtype=torch.uint8)
    widths, heights, centres_x, centres_y, counts = [], [], [], [], []
    for _ in range(draws):
        boxes = make_boxes(grid, (2 * size, 2 * size))
        _, warped = crop_and_warp(canvas, boxes, size)
        kept, _ = keep_visible_boxes(warped, torch.zeros(len(grid), dtype=torch.long), (size, size))
        counts.append(len(kept))
        widths += (kept[:, 2] - kept[:, 0]).tolist()
        heights += (kept[:, 3] - kept[:, 1]).tolist()
        centres_x += ((kept[:, 0] + kept[:, 2]) / 2).tolist()
        centres_y += ((kept[:, 1] + kept[:, 3]) / 2).tolist()
    values = {"width": widths, "height": heights, "centre_x": centres_x, "centre_y": centres_y, "count": counts}
    return {f"{name} {statistic}": float(getattr(np, statistic)(series)) for name, series in values.items() for statistic in ("mean", "std")}


def test_the_mosaic_warp_yields_the_box_statistics_of_torchvisions_affine_and_crop():
    translate, scale, degrees = 0.1, 0.5, 5.0

    def torchvision_way(canvas, boxes, size):  # what the detection dataset did before
        affine = v2.RandomAffine(degrees=degrees, translate=(translate / 2, translate / 2), scale=(1 - scale, 1 + scale),
                                 fill={tv_tensors.Image: PAD_VALUE})
        image, warped = apply_v2(affine, canvas, boxes)
        return F.center_crop(image, [size, size]), F.center_crop(warped, [size, size]).as_subclass(torch.Tensor)

    def one_warp(canvas, boxes, size):
        image, warped = apply_v2(RandomWarp(degrees, translate, scale, output_size=(size, size)), canvas, boxes)
        return image, warped.as_subclass(torch.Tensor)

    torch.manual_seed(11)
    before = _mosaic_box_statistics(torchvision_way)
    torch.manual_seed(12)
    after = _mosaic_box_statistics(one_warp)
    for name, expected in before.items():
        assert after[name] == pytest.approx(expected, rel=0.035, abs=0.5), (name, before, after)


def test_hsv_gains_and_hue_shift_do_what_they_say():
    red = torch.zeros((3, 8, 8), dtype=torch.uint8)
    red[0] = 200
    # a third of the colour circle from red is green
    shifted = RandomHSV().transform(red, {"hue_shift": 1 / 3, "saturation_gain": 1.0, "value_gain": 1.0})
    assert shifted[1].float().mean() == pytest.approx(200, abs=2) and shifted[0].max() <= 2 and shifted[2].max() <= 2
    darker = RandomHSV().transform(red, {"hue_shift": 0.0, "saturation_gain": 1.0, "value_gain": 0.5})
    assert darker[0].float().mean() == pytest.approx(100, abs=1)
    grey = RandomHSV().transform(red, {"hue_shift": 0.0, "saturation_gain": 0.0, "value_gain": 1.0})
    assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])


def test_hsv_draws_stay_within_their_ranges_and_leave_boxes_alone():
    torch.manual_seed(0)
    jitter = RandomHSV(hue=0.015, saturation=0.7, value=0.4)
    for _ in range(50):
        params = jitter.make_params([])
        assert abs(params["hue_shift"]) <= 0.015 and 0.3 <= params["saturation_gain"] <= 1.7 and 0.6 <= params["value_gain"] <= 1.4
    boxes = make_boxes([[1.0, 1.0, 5.0, 5.0]], (8, 8))
    image, same_boxes = apply_v2(jitter, torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8), boxes)
    assert torch.equal(same_boxes.as_subclass(torch.Tensor), boxes.as_subclass(torch.Tensor)) and image.dtype == torch.uint8


def test_hsv_refuses_what_is_not_an_rgb_uint8_image():
    with pytest.raises(ValueError, match="uint8 RGB"):
        RandomHSV(value=0.5)(tv_tensors.Image(torch.rand(3, 8, 8)))
