"""Varifocal and quality focal loss against values worked out by hand (logit 0 means p = 0.5)."""

from __future__ import annotations

import math

import pytest
import torch

from zoo_core.losses.iou_aware_classification import quality_focal_loss, varifocal_loss

LN2 = math.log(2.0)


def test_varifocal_weights_positives_by_their_target_and_negatives_by_alpha_p_gamma():
    logits = torch.zeros(2)
    targets = torch.tensor([0.8, 0.0])
    loss = varifocal_loss(logits, targets, alpha=0.75, gamma=2.0)
    # positive: BCE(0.5, 0.8) = ln 2, weight 0.8; negative: BCE(0.5, 0) = ln 2, weight 0.75 * 0.5**2
    assert torch.allclose(loss, torch.tensor([0.8 * LN2, 0.1875 * LN2]), atol=1e-7)


def test_varifocal_positive_mask_overrides_the_target_sign():
    # A positive whose IoU is 0 is still a positive (weight 0), not a down-weighted negative.
    loss = varifocal_loss(torch.zeros(1), torch.zeros(1), torch.tensor([True]))
    assert loss.item() == 0.0


def test_varifocal_weight_is_not_differentiated():
    logits = torch.tensor([1.5], requires_grad=True)
    varifocal_loss(logits, torch.zeros(1), alpha=1.0, gamma=2.0).sum().backward()
    probability = torch.sigmoid(torch.tensor(1.5))
    # d/dx [BCE(x, 0)] * w = sigmoid(x) * w, with w = p**2 treated as a constant
    assert torch.allclose(logits.grad, (probability * probability**2).reshape(1), atol=1e-6)


def test_varifocal_weight_keeps_its_gradient_when_asked():
    # PP-YOLOE / YOLO-NAS / PicoDet: d/dx [BCE(x, 0) * alpha * p**gamma]
    #   = alpha * (p * p**gamma + BCE(x, 0) * gamma * p**(gamma - 1) * p * (1 - p)), BCE(x, 0) = -ln(1 - p)
    logits = torch.tensor([1.5, -0.5], requires_grad=True)
    loss = varifocal_loss(logits, torch.zeros(2), alpha=0.75, gamma=2.0, detach_weight=False)
    assert torch.allclose(loss, varifocal_loss(logits.detach(), torch.zeros(2)), atol=0)  # same values
    loss.sum().backward()
    p = torch.sigmoid(logits.detach())
    expected = 0.75 * (p * p**2 + -torch.log1p(-p) * 2.0 * p * p * (1 - p))
    assert torch.allclose(logits.grad, expected, atol=1e-6)
    # a positive's weight is its (constant) target: both modes agree there
    positive = torch.tensor([0.3], requires_grad=True)
    varifocal_loss(positive, torch.tensor([0.9]), detach_weight=False).sum().backward()
    assert torch.allclose(positive.grad, 0.9 * (torch.sigmoid(torch.tensor([0.3])) - 0.9), atol=1e-7)


def test_quality_focal_modulates_every_element_by_the_distance_to_its_target():
    loss = quality_focal_loss(torch.zeros(2), torch.tensor([0.8, 0.0]), beta=2.0)
    assert torch.allclose(loss, torch.tensor([0.09 * LN2, 0.25 * LN2]), atol=1e-7)
    assert quality_focal_loss(torch.tensor([100.0]), torch.tensor([1.0])).item() == pytest.approx(0.0, abs=1e-12)


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="one shape"):
        varifocal_loss(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="one shape"):
        quality_focal_loss(torch.zeros(2), torch.zeros(3))
