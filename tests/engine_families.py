"""Test-only families for engine tests, registered at run time (and so re-registered in workers).

``tinynet`` is a small real classifier with BatchNorm (fast to spawn and train). Options make
its model observable or faulty: ``trace_dir`` records, per rank, the batches it sees and the
BatchNorm class it runs with; ``fail_rank``/``fail_step``/``fail_how`` make one rank raise or be
SIGKILLed at a given training step; ``loss_scale_by_world_size`` reproduces the classic DDP bug
(E6) so the equivalence test can show it would catch it.
"""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from zoo_core import hookimpl
from zoo_core.building import BuildRequest

SIZES = {"s": {"input_size": 32, "params": 1, "params_source": "engine tests", "config": {"width": 8}}}


def _declaration(name: str, spawn: bool) -> dict:
    return {
        "name": name, "display": name, "task": "classify", "builder": "tests.engine_families:build_tinynet",
        "published_num_classes": 2, "spawn": spawn, "sizes": SIZES,
    }


@hookimpl
def zoo_families() -> list[dict]:
    return [_declaration("tinynet", True), _declaration("nospawnnet", False)]


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
        if self.training:
            self._observe(images)
        return self.head(self.body(images).mean((2, 3)))

    def _observe(self, images: torch.Tensor) -> None:
        rank = int(os.environ.get("RANK", "0"))
        self.steps += 1
        if self.options.get("fail_rank") == rank and self.steps == self.options.get("fail_step", 1):
            if self.options.get("fail_how") == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected failure on rank {rank} at step {self.steps}")
        trace_dir = self.options.get("trace_dir")
        if trace_dir:
            digest = hashlib.sha256(images.detach().cpu().numpy().tobytes()).hexdigest()[:16]
            with open(Path(trace_dir) / f"rank{rank}.txt", "a", encoding="utf-8") as stream:
                stream.write(f"{type(self.body[1]).__name__} {digest}\n")
            if self.steps == 1 and dist.is_initialized():  # the process group's collective timeout (E11)
                backend = dist.group.WORLD._get_backend(images.device)
                (Path(trace_dir) / f"timeout{rank}.txt").write_text(str(backend.options._timeout.total_seconds()))

    def loss(self, outputs: torch.Tensor, batch: dict) -> tuple[torch.Tensor, dict]:
        loss = nn.functional.cross_entropy(outputs, batch["labels"])
        if self.options.get("loss_scale_by_world_size"):
            loss = loss * int(os.environ.get("WORLD_SIZE", "1"))
        return loss, {"cls": loss.detach()}


def build_tinynet(request: BuildRequest) -> TinyNet:
    return TinyNet(request.config["width"], request.num_classes, dict(request.options))
