"""Tiny test-only models that satisfy each task's model contract (zoo_core/tasks/base.py).

Other task tests import them (and the two-process tests rebuild them inside spawned workers),
so they live at module level. The tests here check that each one fulfils its contract, so the
task tests that rely on them test the tasks and not a broken stand-in.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping

import torch
from torch import nn
from torchvision.ops import batched_nms

__all__ = ["TinyClassifier", "TinySegmenter", "TinyRestorer", "GridDetector", "LookupDetector", "fake_libre", "image_key"]


class TinyClassifier(nn.Module):
    """conv -> global average pool -> linear."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


class TinySegmenter(nn.Module):
    """Two convolutions, logits at the input resolution."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, num_classes, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images)


class TinyRestorer(nn.Module):
    """A residual convolution: the output has the input's size."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images + 0.1 * self.body(images)


class GridDetector(nn.Module):
    """One prediction per 8-pixel cell (box offsets + class logits), decoded by ``postprocess`` with NMS."""

    stride = 8

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AvgPool2d(self.stride), nn.Conv2d(16, 4 + num_classes, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images)

    def postprocess(self, outputs: torch.Tensor, conf: float, iou: float, max_det: int) -> list[dict[str, torch.Tensor]]:
        batch, _, rows, columns = outputs.shape
        ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
        centres = torch.stack([xs, ys], dim=-1).reshape(-1, 2).float().add(0.5).mul(self.stride)
        results = []
        for raw in outputs.permute(0, 2, 3, 1).reshape(batch, rows * columns, -1):
            middle = centres + raw[:, :2].tanh() * self.stride
            half = raw[:, 2:4].sigmoid() * self.stride * 3
            boxes = torch.cat([middle - half, middle + half], dim=1)
            scores, labels = raw[:, 4:].sigmoid().max(dim=1)
            keep = scores > conf
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
            kept = batched_nms(boxes, scores, labels, iou)[:max_det]
            results.append({"boxes": boxes[kept], "scores": scores[kept], "labels": labels[kept]})
        return results


def image_key(image: torch.Tensor) -> int:
    """A key that identifies an input image (its pixel sum, rounded)."""
    return int(round(float(image.double().sum()) * 64))


class LookupDetector(nn.Module):
    """Returns predictions prepared per input image (looked up by ``image_key``): a test oracle.

    ``table`` maps ``image_key(input image)`` to a dict of ``boxes`` (input pixels), ``scores`` and
    ``labels``; unknown images get no detection. The forward pass returns the inputs, so the
    lookup happens on exactly what the task fed the model.
    """

    def __init__(self, table: Mapping[int, dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self.table = dict(table)
        self.anchor = nn.Parameter(torch.zeros(1))  # so .to(device) and .eval() behave as for real models

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images

    def postprocess(self, outputs: torch.Tensor, conf: float, iou: float, max_det: int) -> list[dict[str, torch.Tensor]]:
        empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
        results = []
        for image in outputs:
            found = self.table.get(image_key(image), empty)
            keep = found["scores"] > conf
            results.append({name: value[keep][:max_det] for name, value in found.items()})
        return results


def fake_libre(model: nn.Module, task: str, names: Mapping[int, str], input_size: int) -> Any:
    """An object with the facade attributes the runner reads (model, task, names, num_classes, input_size)."""
    return SimpleNamespace(
        model=model, task=task, names=dict(names), num_classes=len(names), input_size=input_size, family="test", size="t", name=f"test-{task}"
    )


def test_tiny_classifier_returns_one_logit_per_class():
    assert TinyClassifier(4)(torch.rand(2, 3, 32, 32)).shape == (2, 4)


def test_tiny_segmenter_returns_logits_at_input_resolution():
    assert TinySegmenter(5)(torch.rand(2, 3, 32, 48)).shape == (2, 5, 32, 48)


def test_tiny_restorer_keeps_the_image_size():
    assert TinyRestorer()(torch.rand(1, 3, 20, 28)).shape == (1, 3, 20, 28)


def test_grid_detector_fulfils_the_postprocess_contract():
    torch.manual_seed(0)
    model = GridDetector(3).eval()
    (detections,) = model.postprocess(model(torch.rand(1, 3, 64, 64)), conf=0.0, iou=0.7, max_det=10)
    assert detections["boxes"].shape[1:] == (4,)
    assert len(detections["boxes"]) == len(detections["scores"]) == len(detections["labels"]) <= 10
    assert detections["labels"].dtype == torch.long


def test_lookup_detector_returns_what_its_table_holds_for_an_image():
    image = torch.rand(3, 16, 16)
    table = {image_key(image): {"boxes": torch.tensor([[1.0, 2.0, 5.0, 6.0]]), "scores": torch.tensor([0.8]), "labels": torch.tensor([2])}}
    found, missing = LookupDetector(table).postprocess(torch.stack([image, image * 0.5]), conf=0.1, iou=0.7, max_det=5)
    assert found["labels"].tolist() == [2] and found["boxes"].tolist() == [[1.0, 2.0, 5.0, 6.0]]
    assert len(missing["boxes"]) == 0
