"""The input pipelines (zoo_core/data/input_pipeline.py): each mode's geometry and the reference kernels' pixels."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from zoo_core.data.input_pipeline import boxes_to_input, boxes_to_original, fit_to_input, logits_to_original
from zoo_core.registry import InputPipeline

LETTERBOX = InputPipeline(resize="letterbox")


def noise(height: int, width: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("shape", "new", "pad"), [((481, 640), (240, 320), (0, 0)), ((640, 478), (320, 239), (0, 0))])
def test_a_top_left_letterbox_truncates_its_new_sides_and_pads_right_and_bottom(shape, new, pad):
    image = noise(*shape)
    fitted, _, ((ratio_x, ratio_y), (left, top)) = fit_to_input(image, 320, LETTERBOX)
    assert fitted.shape == (3, 320, 320) and fitted.dtype == torch.uint8
    assert ratio_x == ratio_y == min(320 / shape[0], 320 / shape[1]) and (left, top) == pad
    height, width = new
    expected = cv2.resize(image.permute(1, 2, 0).numpy(), (width, height), interpolation=cv2.INTER_LINEAR)
    assert np.array_equal(fitted[:, :height, :width].permute(1, 2, 0).numpy(), expected)  # OpenCV's own pixels
    assert (fitted[:, height:, :] == 114).all() and (fitted[:, :, width:] == 114).all()


def test_a_centred_letterbox_with_a_fitting_side_and_rounding_is_yolo_nass():
    pipeline = InputPipeline(resize="letterbox", placement="centre", rounding="round", fit_side=636,
                             interpolation="bilinear_antialiased")
    image = noise(481, 640)
    fitted, _, ((ratio, _), (left, top)) = fit_to_input(image, 640, pipeline)
    assert ratio == pytest.approx(636 / 640)
    new_h, new_w = round(481 * ratio), round(640 * ratio)  # 478 × 636
    assert (new_h, new_w) == (478, 636) and (left, top) == ((640 - 636) // 2, (640 - 478) // 2)
    reference = np.asarray(Image.fromarray(image.permute(1, 2, 0).numpy()).resize((new_w, new_h), Image.Resampling.BILINEAR))
    placed = fitted[:, int(top):int(top) + new_h, int(left):int(left) + new_w].permute(1, 2, 0).numpy()
    assert np.array_equal(placed, reference)  # PIL's antialiased bilinear


def test_a_stretch_ignores_the_aspect_and_maps_boxes_back_per_axis():
    image = noise(481, 640)
    fitted, _, ratio_pad = fit_to_input(image, 320, InputPipeline(resize="stretch"))
    assert fitted.shape == (3, 320, 320) and ratio_pad == ((320 / 640, 320 / 481), (0.0, 0.0))
    boxes = torch.tensor([[10.0, 20.0, 600.0, 470.0]])
    assert torch.allclose(boxes_to_original(boxes_to_input(boxes, ratio_pad), ratio_pad, (481, 640)), boxes, atol=1e-3)


def test_a_float_stretch_resizes_the_unrounded_levels():
    image = noise(100, 150)
    fitted, _, _ = fit_to_input(image, 64, InputPipeline(resize="stretch", resize_in_float=True))
    expected = cv2.resize(image.permute(1, 2, 0).numpy().astype(np.float32) / 255, (64, 64), interpolation=cv2.INTER_LINEAR)
    assert fitted.dtype == torch.float32 and np.allclose(fitted.permute(1, 2, 0).numpy(), expected)


@pytest.mark.parametrize("shape", [(481, 640), (640, 478), (300, 300)])
@pytest.mark.parametrize("crop_pct", [0.875, 0.95])
def test_a_crop_is_torchvisions_shorter_side_resize_and_centre_crop_of_the_pil_image(shape, crop_pct):
    image = noise(*shape)
    pipeline = InputPipeline(resize="crop", crop_pct=crop_pct, interpolation="bicubic_antialiased")
    fitted, _, _ = fit_to_input(image, 224, pipeline)
    reference = transforms.Compose([
        transforms.Resize(math.floor(224 / crop_pct), interpolation=transforms.InterpolationMode.BICUBIC),
        transforms.CenterCrop(224),
    ])(Image.fromarray(image.permute(1, 2, 0).numpy()))
    assert fitted.shape == (3, 224, 224) and np.array_equal(fitted.permute(1, 2, 0).numpy(), np.asarray(reference))


def test_native_keeps_the_image_and_a_mask_travels_with_a_letterbox():
    image = noise(50, 70)
    same, _, ratio_pad = fit_to_input(image, 64, InputPipeline(resize="native"))
    assert same is image and ratio_pad == ((1.0, 1.0), (0.0, 0.0))
    mask = torch.zeros(50, 70, dtype=torch.uint8)
    mask[10:20, 30:40] = 2
    fitted, fitted_mask, _ = fit_to_input(image, (64, 128), LETTERBOX, mask=mask, mask_fill=255)
    assert fitted.shape == (3, 64, 128) and fitted_mask.shape == (64, 128)
    assert (fitted_mask[:, 90:] == 255).all() and (fitted_mask == 2).any()  # 70 px wide -> 89, then padding


def test_logits_lose_the_letterbox_padding_counted_as_the_pipeline_says():
    logits = torch.zeros(2, 64, 64)
    logits[1, :40, :] = 1.0  # class 1 on the first 40 rows
    _, _, ratio_pad = fit_to_input(noise(51, 64), 64, LETTERBOX)  # 51 rows at scale 1: rows 51-63 are padding
    floor = logits_to_original(logits, ratio_pad, (51, 64), LETTERBOX)
    assert floor.shape == (2, 51, 64) and (floor.argmax(0)[:40] == 1).all() and (floor.argmax(0)[40:] == 0).all()
    _, _, half = fit_to_input(noise(101, 128), 64, LETTERBOX)  # 50.5 rows: int() gives 50, round() 50 (half to even)
    assert logits_to_original(logits, half, (101, 128), LETTERBOX.merged({"unpad_rounding": "round"})).shape == (2, 101, 128)
