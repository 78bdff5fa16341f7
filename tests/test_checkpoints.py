"""E16: a checkpoint is written atomically; a SIGKILL at any point of a write leaves the previous one loadable.

A subprocess runs the trainer's real background ``CheckpointWriter``: it writes generation 1,
then starts generation 2 with the writer thread stopped at a chosen point (half the bytes on
disk, all bytes on disk before the rename, the rename done before ``best.pt`` is linked). The
stop is a hook that announces itself in a marker file and blocks, so the parent kills the
process exactly there, without timing guesses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from .support import script_environment

pytestmark = pytest.mark.timeout(120)

WRITER = """
import os, sys, threading, time
from pathlib import Path
import torch
import zoo_core.weights as weights
from zoo_core.engine.checkpoint import CheckpointWriter, snapshot

target, marker, stop_at = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
best = target.with_name("best.pt")

def generation(number):
    return snapshot({"generation": number, "weights": torch.full((2_000_000,), float(number))})

def halt_here():
    marker.write_text(threading.current_thread().name)
    while True:
        time.sleep(60)

writer = CheckpointWriter()
writer.submit(generation(1), target, [best])
writer.wait()

real_fdopen, real_replace, real_link = os.fdopen, os.replace, os.link

class HalfThenHalt:
    def __init__(self, stream):
        self.stream = stream
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self.stream.__exit__(*exc)
    def write(self, data):
        self.stream.write(data[: len(data) // 2])
        self.stream.flush()
        halt_here()
    def __getattr__(self, name):
        return getattr(self.stream, name)

if stop_at == "mid-write":
    weights.os.fdopen = lambda *args, **kwargs: HalfThenHalt(real_fdopen(*args, **kwargs))
elif stop_at == "before-rename":
    weights.os.replace = lambda *args: halt_here()
elif stop_at == "before-best-link":
    weights.os.link = lambda *args: halt_here()
writer.submit(generation(2), target, [best])
writer.wait()
"""


@pytest.mark.parametrize("stop_at", ["mid-write", "before-rename", "before-best-link"])
def test_sigkill_inside_the_background_checkpoint_write_never_corrupts_last_or_best(tmp_path, stop_at):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    target = tmp_path / "weights" / "last.pt"
    target.parent.mkdir()
    marker = tmp_path / "halted"
    writer = subprocess.Popen([sys.executable, str(script), str(target), str(marker), stop_at], env=script_environment(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (marker.exists() and marker.read_text()):  # created empty, then written: wait for the name
            assert writer.poll() is None, f"the writer exited before reaching {stop_at}: {writer.stdout.read()}"
            assert time.monotonic() < deadline, f"the writer never reached {stop_at}"
            time.sleep(0.05)
        assert marker.read_text() == "zoo-checkpoint-writer"  # the real background thread was stopped
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=10)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    last = torch.load(target, map_location="cpu", weights_only=True)
    best = torch.load(target.with_name("best.pt"), map_location="cpu", weights_only=True)
    expected_last = 2 if stop_at == "before-best-link" else 1
    assert last["generation"] == expected_last
    assert torch.equal(last["weights"], torch.full((2_000_000,), float(expected_last)))
    assert best["generation"] == 1 and torch.equal(best["weights"], torch.full((2_000_000,), 1.0))
    # A killed write leaves only hidden temp files beside the checkpoints, which the trainer removes on start.
    assert {path.name for path in target.parent.iterdir() if not path.name.startswith(".")} == {"last.pt", "best.pt"}
