"""Test doubles: the stand-ins the tests train, validate and spawn instead of real families.

Two kinds live here, and only here:

- ``tinynet`` / ``nospawnnet`` / ``tinynet_nhwc`` (declared ``channels_last``): small real classifier
  families with BatchNorm, registered at run time (``use_test_families``) and re-registered by
  module name in spawned workers. Options make the model observable or faulty: ``trace_dir``
  records, per rank, the batches it sees, the BatchNorm class it runs with, the memory layout
  of its first training step and a digest of the BatchNorm statistics each validation batch runs with; ``fail_rank``/``fail_step``/``fail_how`` make one rank raise or
  be SIGKILLed at a given step (``fail_first_attempt_only``: not again after a torchrun restart); ``nan_step`` makes the outputs NaN from that training step on
  (a diverging run); ``width`` makes the model bigger (slower checkpoint writes);
  ``loss_scale_by_world_size`` reproduces the classic DDP bug (E6)
  so the equivalence test can show it would catch it.
- Tiny models that satisfy each task's model contract (``zoo_core/tasks/base.py``) for the task
  tests: ``TinyClassifier``, ``TinySegmenter``, ``TinyRestorer``, ``GridDetector``,
  ``LookupDetector``, ``TinyInstanceSegmenter``, ``LookupInstanceSegmenter`` (and ``fake_libre``, the
  facade-shaped object the task runner needs).
  ``tests/test_tasks_models.py`` checks that each fulfils its contract.
"""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torchvision.ops import batched_nms

from zoo_core import hookimpl
from zoo_core.building import BuildRequest
from zoo_core.plugin_manager import register_plugin

__all__ = [
    "use_test_families", "TinyNet", "build_tinynet", "TinyClassifier", "TinySegmenter", "TinyRestorer", "GridDetector",
    "LookupDetector", "LookupInstanceSegmenter", "TinyInstanceSegmenter", "fake_libre", "image_key",
]


def use_test_families() -> None:
    """Register the test families (workers re-register them by module name)."""
    import sys

    register_plugin(sys.modules[__name__], "engine-test-families")


# --------------------------------------------------------------------------- test families
SIZES = {"s": {"input_size": 32, "params": 1, "params_source": "engine tests", "config": {"width": 8}}}


def _declaration(name: str, spawn: bool, channels_last: bool = False) -> dict:
    return {
        "name": name, "display": name, "task": "classify", "builder": "tests.doubles:build_tinynet",
        "published_num_classes": 2, "spawn": spawn, "channels_last": channels_last, "sizes": SIZES,
    }


@hookimpl
def zoo_families() -> list[dict]:
    return [_declaration("tinynet", True), _declaration("nospawnnet", False), _declaration("tinynet_nhwc", True, channels_last=True)]


class TinyNet(nn.Module):
    """conv-BN-ReLU, conv-BN-ReLU, global pooling, linear."""

    def __init__(self, width: int, num_classes: int, options: dict) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        )
        self.head = nn.Linear(width, num_classes)
        self.options = dict(options)
        self.steps = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # Only optimisation steps are observed: the engine's validation losses also run the
        # training-mode forward, but without gradients.
        if self.training and torch.is_grad_enabled():
            self._observe(images)
        elif not self.training and self.options.get("trace_dir"):
            self._observe_evaluation()
        logits = self.head(self.body(images).mean((2, 3)))
        nan_step = self.options.get("nan_step")
        if self.training and torch.is_grad_enabled() and nan_step is not None and self.steps >= nan_step:
            logits = logits * float("nan")  # from this training step on, the loss and then the weights are NaN
        return logits

    def _observe(self, images: torch.Tensor) -> None:
        rank = int(os.environ.get("RANK", "0"))
        self.steps += 1
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if (self.options.get("fail_rank") == rank and self.steps == self.options.get("fail_step", 1)
                and (first_attempt or not self.options.get("fail_first_attempt_only"))):
            if self.options.get("fail_how") == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected failure on rank {rank} at step {self.steps}")
        trace_dir = self.options.get("trace_dir")
        if trace_dir:
            digest = hashlib.sha256(images.detach().cpu().numpy().tobytes()).hexdigest()[:16]
            with open(Path(trace_dir) / f"rank{rank}.txt", "a", encoding="utf-8") as stream:
                stream.write(f"{type(self.body[1]).__name__} {digest}\n")
            if self.steps == 1:
                in_channels_last = images.is_contiguous(memory_format=torch.channels_last) and self.body[0].weight.is_contiguous(
                    memory_format=torch.channels_last)
                (Path(trace_dir) / f"layout{rank}.txt").write_text("channels_last" if in_channels_last else "contiguous")
            if self.steps == 1 and dist.is_initialized():  # the process group's collective timeout (E11)
                backend = dist.group.WORLD._get_backend(images.device)
                (Path(trace_dir) / f"timeout{rank}.txt").write_text(str(backend.options._timeout.total_seconds()))

    def _observe_evaluation(self) -> None:
        """Append a digest of the BatchNorm statistics this rank validates with (``eval<rank>.txt``)."""
        rank = int(os.environ.get("RANK", "0"))
        statistics = torch.cat([buffer.detach().double().flatten().cpu() for buffer in self.buffers()])
        digest = hashlib.sha256(statistics.numpy().tobytes()).hexdigest()[:16]
        with open(Path(self.options["trace_dir"]) / f"eval{rank}.txt", "a", encoding="utf-8") as stream:
            stream.write(f"{digest}\n")

    def loss(self, outputs: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        loss = nn.functional.cross_entropy(outputs, batch["labels"])
        if self.options.get("loss_scale_by_world_size"):
            loss = loss * int(os.environ.get("WORLD_SIZE", "1"))
        return loss, {"cls": loss.detach()}


def build_tinynet(request: BuildRequest) -> TinyNet:
    options = dict(request.options)
    return TinyNet(options.pop("width", request.config["width"]), request.num_classes, options)


# --------------------------------------------------------------------------- task contract doubles
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

    def postprocess(self, outputs: torch.Tensor, conf: float, iou: float, max_det: int,
                    placements: Any = None) -> list[dict[str, torch.Tensor]]:
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
        return in_original_pixels(results, placements)


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

    def postprocess(self, outputs: torch.Tensor, conf: float, iou: float, max_det: int,
                    placements: Any = None) -> list[dict[str, torch.Tensor]]:
        empty = {"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
        results = []
        for image in outputs:
            found = self.table.get(image_key(image), empty)
            keep = found["scores"] > conf
            results.append({name: value[keep][:max_det] for name, value in found.items()})
        return in_original_pixels(results, placements)


class TinyInstanceSegmenter(nn.Module):
    """A prototype-mask head in miniature (YOLACT's and YOLO-seg's shape): per 8-pixel cell a box, class logits and
    ``prototypes`` mask coefficients; ``prototypes`` mask features at a quarter of the input. The segment
    task's eval outputs (and so its exported graph's four outputs), and a loss that trains them
    (``tests/segment_family.py`` declares it as the ``tinyseg`` family)."""

    stride = 8

    def __init__(self, num_classes: int, prototypes: int = 4) -> None:
        super().__init__()
        self.num_classes, self.prototypes = num_classes, prototypes
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.AvgPool2d(self.stride), nn.Conv2d(16, 4 + num_classes + prototypes, 1))
        self.features = nn.Sequential(nn.AvgPool2d(4), nn.Conv2d(16, prototypes, 3, padding=1))

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        shared = self.body(images)
        raw = self.head(shared)
        batch, _, rows, columns = raw.shape
        ys, xs = torch.meshgrid(torch.arange(rows, device=raw.device), torch.arange(columns, device=raw.device), indexing="ij")
        centres = torch.stack([xs, ys], dim=-1).reshape(1, -1, 2).float().add(0.5).mul(self.stride)
        cells = raw.flatten(2).transpose(1, 2)
        middle = centres + cells[..., :2].tanh() * self.stride
        half = cells[..., 2:4].sigmoid() * self.stride * 3
        return {
            "boxes": torch.cat([middle - half, middle + half], dim=-1),
            "scores": cells[..., 4:4 + self.num_classes].sigmoid(),
            "mask_coefficients": cells[..., 4 + self.num_classes:],
            "mask_features": self.features(shared),
        }

    def loss(self, outputs: Mapping[str, torch.Tensor], batch: Mapping[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The cell holding a box's centre learns its class, box and mask (coefficients times features against the
        target mask at the features' resolution); every other cell learns background. Per sample, as base.py asks."""
        targets, masks = batch["targets"], batch["masks"]
        scores, boxes = outputs["scores"], outputs["boxes"]
        features = outputs["mask_features"]
        images = len(scores)
        columns = batch["images"].shape[-1] // self.stride
        rows = batch["images"].shape[-2] // self.stride
        image = targets[:, 0].long()
        centres = (targets[:, 2:4] + targets[:, 4:6]) / 2
        cell = (centres[:, 1] // self.stride).long().clamp(0, rows - 1) * columns + (centres[:, 0] // self.stride).long().clamp(0, columns - 1)
        wanted = torch.zeros_like(scores)
        wanted[image, cell, targets[:, 1].long()] = 1.0
        classification = nn.functional.binary_cross_entropy(scores.clamp(1e-6, 1 - 1e-6), wanted, reduction="sum") / images
        box = nn.functional.l1_loss(boxes[image, cell], targets[:, 2:6], reduction="sum") / images / self.stride
        logits = torch.einsum("mk,mkhw->mhw", outputs["mask_coefficients"][image, cell], features[image])
        if len(targets):
            shrunk = nn.functional.interpolate(masks[None].float(), size=tuple(features.shape[-2:]), mode="area")[0]
            mask = nn.functional.binary_cross_entropy_with_logits(logits, shrunk, reduction="mean") * len(targets) / images
        else:
            mask = features.sum() * 0.0
        loss = classification + box + mask
        return loss, {"cls": classification.detach(), "box": box.detach(), "mask": mask.detach()}

    def postprocess(self, outputs: Mapping[str, torch.Tensor], conf: float, iou: float, max_det: int,
                    placements: Any = None) -> list[dict[str, torch.Tensor]]:
        from zoo_core.data.input_pipeline import logits_to_original
        from zoo_core.ops.boxes import boxes_to_original
        from zoo_core.tasks.detect import DetectTask

        results = []
        features = outputs["mask_features"]
        input_size = (features.shape[-2] * 4, features.shape[-1] * 4)
        for position in range(len(outputs["boxes"])):
            scores, labels = outputs["scores"][position].max(dim=1)
            keep = (scores > conf).nonzero(as_tuple=True)[0]
            boxes = outputs["boxes"][position][keep]
            kept = keep[batched_nms(boxes, scores[keep], labels[keep], iou)[:max_det]]
            logits = torch.einsum("ak,khw->ahw", outputs["mask_coefficients"][position][kept], features[position])
            logits = nn.functional.interpolate(logits[None], size=input_size, mode="bilinear", align_corners=False)[0]
            boxes = outputs["boxes"][position][kept]
            if placements is not None:
                ratio_pad, shape = placements[position]
                logits = logits_to_original(logits, ratio_pad, shape, DetectTask.default_input_pipeline)
                boxes = boxes_to_original(boxes, ratio_pad, shape)
            results.append({"boxes": boxes, "scores": scores[kept], "labels": labels[kept], "masks": logits > 0})
        return results


class LookupInstanceSegmenter(nn.Module):
    """The segment task's contract with prepared answers per input image (looked up by ``image_key``): a test oracle.

    ``table`` maps ``image_key(input image)`` to ``boxes`` (input pixels), ``scores``, ``labels`` and ``masks``
    (n×S×S bool, input pixels). ``forward`` returns the contract's dict: every object is a candidate whose
    ``mask_coefficients`` are one-hot over ``mask_features`` (the objects' masks as planes), so ``postprocess``
    builds each mask as a real prototype head does — coefficients times features, thresholded at 0.5, mapped to
    the original image by cropping the letterbox padding and resizing bilinearly first (``logits_to_original``).
    """

    def __init__(self, table: Mapping[int, dict[str, torch.Tensor]], num_classes: int, pipeline: Any = None) -> None:
        super().__init__()
        from zoo_core.tasks.detect import DetectTask

        self.table = dict(table)
        self.num_classes = num_classes
        self.pipeline = pipeline or DetectTask.default_input_pipeline
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        found = [self.table.get(image_key(image)) for image in images]
        candidates = max([len(item["scores"]) for item in found if item is not None] + [1])
        batch, height, width = len(images), int(images.shape[-2]), int(images.shape[-1])
        boxes = torch.zeros(batch, candidates, 4)
        scores = torch.zeros(batch, candidates, self.num_classes)
        features = torch.zeros(batch, candidates, height, width)
        for position, item in enumerate(found):
            if item is None:
                continue
            count = len(item["scores"])
            boxes[position, :count] = item["boxes"].float()
            scores[position, torch.arange(count), item["labels"].long()] = item["scores"].float()
            features[position, :count] = item["masks"].float()
        coefficients = torch.eye(candidates).expand(batch, candidates, candidates).clone()
        return {"boxes": boxes, "scores": scores, "mask_coefficients": coefficients, "mask_features": features}

    def postprocess(self, outputs: Mapping[str, torch.Tensor], conf: float, iou: float, max_det: int,
                    placements: Any = None) -> list[dict[str, torch.Tensor]]:
        from zoo_core.data.input_pipeline import logits_to_original
        from zoo_core.ops.boxes import boxes_to_original

        results = []
        for position in range(len(outputs["boxes"])):
            scores, labels = outputs["scores"][position].max(dim=1)
            keep = (scores > conf).nonzero(as_tuple=True)[0][:max_det]
            features = outputs["mask_features"][position]
            mask_logits = torch.einsum("ak,khw->ahw", outputs["mask_coefficients"][position][keep], features)
            boxes = outputs["boxes"][position][keep]
            if placements is not None:
                ratio_pad, shape = placements[position]
                mask_logits = logits_to_original(mask_logits, ratio_pad, shape, self.pipeline) if len(keep) else \
                    mask_logits.new_zeros((0, *shape))
                boxes = boxes_to_original(boxes, ratio_pad, shape)
            results.append({"boxes": boxes, "scores": scores[keep], "labels": labels[keep], "masks": mask_logits > 0.5})
        return results


def in_original_pixels(detections: list[dict[str, torch.Tensor]], placements: Any) -> list[dict[str, torch.Tensor]]:
    """A double's detections with their boxes mapped back to the original images (``placements``), clipped."""
    from zoo_core.ops.boxes import boxes_to_original

    if placements is None:
        return detections
    return [{**found, "boxes": boxes_to_original(found["boxes"], ratio_pad, shape)} for found, (ratio_pad, shape) in zip(detections, placements)]


def fake_libre(model: nn.Module, task: str, names: Mapping[int, str], input_size: int) -> Any:
    """An object with the facade attributes the runner reads (model, task, names, num_classes, input_size,
    input_pipeline: None, the task's default; inference_model)."""
    return SimpleNamespace(
        model=model, task=task, names=dict(names), num_classes=len(names), input_size=input_size, family="test", size="t", name=f"test-{task}",
        input_pipeline=None, inference_model=lambda device: model.to(device).eval(),
    )


