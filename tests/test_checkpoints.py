"""E16: checkpoints are written atomically; a SIGKILL mid-write leaves the previous file loadable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from .engine_support import script_environment

pytestmark = pytest.mark.timeout(180)

WRITER = """
import sys, torch
from zoo_core.weights import atomic_torch_save
target, generation = sys.argv[1], 0
while True:
    generation += 1
    # ~24 MB per write, so a kill lands mid-write most of the time.
    atomic_torch_save({"generation": generation, "weights": torch.full((6_000_000,), float(generation))}, target)
    print(generation, flush=True)
"""


def test_sigkill_during_checkpoint_writes_never_corrupts_last_pt(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    target = tmp_path / "weights" / "last.pt"
    target.parent.mkdir()
    for delay in (0.3, 0.55, 0.8, 1.1, 1.45):
        writer = subprocess.Popen([sys.executable, str(script), str(target)], env=script_environment(),
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert writer.stdout.readline().strip() == "1"  # one complete checkpoint exists
            time.sleep(delay)
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait(timeout=10)
        finally:
            if writer.poll() is None:
                writer.kill()
        checkpoint = torch.load(target, map_location="cpu", weights_only=True)
        generation = checkpoint["generation"]
        assert torch.equal(checkpoint["weights"], torch.full((6_000_000,), float(generation)))
    # Killed writes leave only temp files beside the target, which the trainer removes on start.
    assert {path.name for path in target.parent.iterdir() if not path.name.startswith(".")} == {"last.pt"}
