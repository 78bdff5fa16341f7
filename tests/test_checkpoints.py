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


# --------------------------------------------------------------------------- random kill points, then resume
SUPERVISOR = r'''
import json, os, random, signal, sys, time
from pathlib import Path

import torch

torch.set_num_threads(1)  # no OpenMP pool in this process: its forked children must not inherit one
import tempfile

import zoo_core.weights as weights
from zoo_core.engine.checkpoint import CheckpointWriter, snapshot
from zoo_core.engine.resume import read_training_checkpoint

last, marker_dir, repetitions, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
best = last.with_name("best.pt")
original = torch.load(last, map_location="cpu", weights_only=True)


def generation(number):
    """The original checkpoint, its weights shifted by a generation-specific amount (told apart on load)."""
    shifted = {}
    for key in ("model", "train_model"):
        shifted[key] = {name: tensor + number if tensor.is_floating_point() else tensor
                        for name, tensor in original[key].items()}
    return {**original, **shifted, "generation": number}


def halt(event, marker):
    marker.write_text(event)
    while True:
        time.sleep(60)


def write_halting_at(target, number, marker):
    """In a forked child: write generation ``number`` with the trainer's writer, halting before event ``target``."""
    counter = {"events": 0, "names": []}

    def event(name):
        index = counter["events"]
        counter["events"] += 1
        counter["names"].append(name)
        if index == target:
            halt(name, marker)

    real_mkstemp, real_fdopen, real_fsync, real_replace, real_link, real_unlink = (
        tempfile.mkstemp, os.fdopen, os.fsync, os.replace, os.link, os.unlink)

    class Stream:
        def __init__(self, stream):
            self.stream = stream
        def write(self, data):
            index = counter["events"]
            if index == target:  # a write cut in half: part of the bytes on disk, then the kill
                self.stream.write(bytes(data)[: len(data) // 2])
                self.stream.flush()
            event("write")
            return self.stream.write(data)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.stream.__exit__(*exc)
        def __getattr__(self, name):
            return getattr(self.stream, name)

    def wrap(name, real):
        def call(*args, **kwargs):
            event(name)
            return real(*args, **kwargs)
        return call

    tempfile.mkstemp = wrap("mkstemp", real_mkstemp)
    os.fdopen = lambda *args, **kwargs: Stream(wrap("open", real_fdopen)(*args, **kwargs))
    os.fsync, os.replace, os.link, os.unlink = (wrap("fsync", real_fsync), wrap("replace", real_replace),
                                                wrap("link", real_link), wrap("unlink", real_unlink))
    writer = CheckpointWriter()
    writer.submit(snapshot(generation(number)), last, [best])
    writer.wait()
    return counter["names"]


def run_child(target, number, marker):
    pid = os.fork()
    if pid == 0:
        try:
            names = write_halting_at(target, number, marker)
            marker.with_suffix(".events").write_text(json.dumps(names))
        finally:
            os._exit(0)
    return pid


# A dry run counts the write's events: every file operation and every write() call of torch.save.
dry = marker_dir / "dry"
child = run_child(-1, 0, dry)
os.waitpid(child, 0)
names = json.loads(dry.with_suffix(".events").read_text())
events = len(names)
rng = random.Random(seed)
# A random kind of event (open, write, fsync, replace, link...), then a random occurrence of it: torch.save's
# hundreds of write() calls would otherwise leave the few renames and links almost never hit.
kinds = sorted(set(names))
on_disk = 0  # the generation last.pt holds; the original is generation 0
results = []
for repetition in range(1, repetitions + 1):
    kind = rng.choice(kinds)
    target = rng.choice([index for index, name in enumerate(names) if name == kind])
    marker = marker_dir / f"halt{repetition}"
    child = run_child(target, repetition, marker)
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text()):
        finished, _ = os.waitpid(child, os.WNOHANG)
        assert not finished, f"the writer finished without reaching event {target}"
        assert time.monotonic() < deadline, f"the writer never reached event {target}"
        time.sleep(0.01)
    os.kill(child, signal.SIGKILL)  # rank 0's process, in the middle of its checkpoint write
    os.waitpid(child, 0)
    checkpoint = read_training_checkpoint(last)  # what resume reads: loads, digest checked
    number = checkpoint["generation"] if "generation" in checkpoint else 0
    assert number in (on_disk, repetition), (number, on_disk, repetition)
    expected = generation(number)
    for key in ("model", "train_model"):
        for name, tensor in expected[key].items():
            assert torch.equal(checkpoint[key][name], tensor), (repetition, key, name)
    assert torch.load(best, map_location="cpu", weights_only=True)["epoch"] == original["epoch"]
    visible = sorted(path.name for path in last.parent.iterdir() if not path.name.startswith("."))
    assert visible == ["best.pt", "last.pt"], visible
    results.append({"event": target, "at": marker.read_text(), "last.pt holds": "new" if number == repetition else "previous"})
    on_disk = number
print(json.dumps({"events": events, "kinds": kinds, "results": results, "final generation": on_disk}))
'''

REPETITIONS = 12


def test_sigkill_at_random_points_of_rank0s_checkpoint_write_always_leaves_a_resumable_last(tmp_path):
    """12 kills at random points (seeded) of a real training checkpoint's write, then a real resume from what is left."""
    import json

    from zoo_core import LibreYOLO

    from .support import use_test_families, write_class_folders

    use_test_families()
    data = write_class_folders(tmp_path / "data", per_class=4, val_per_class=2, size=16)
    settings = dict(device="cpu", batch=8, imgsz=16, workers=0, nbs=8, plots=False, verbose=False, val=False)
    # time= stops the run after its first epoch (of three), as a crash would, leaving a resumable last.pt.
    first = LibreYOLO("tinynet-s").train(data=str(data), epochs=3, time=1e-9, **settings)
    last = first.last
    before = torch.load(last, map_location="cpu", weights_only=True)
    assert before["epoch"] == 0 and first.epochs_completed == 1
    script = tmp_path / "supervisor.py"
    script.write_text(SUPERVISOR)
    markers = tmp_path / "markers"
    markers.mkdir()
    run = subprocess.run([sys.executable, str(script), str(last), str(markers), str(REPETITIONS), "2024"],
                         env=script_environment(), capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    print("kill points:", report)
    assert len(report["results"]) == REPETITIONS
    assert len({result["event"] for result in report["results"]}) >= REPETITIONS // 2  # spread over the write
    # some kills came before last.pt's rename (the previous one stays), some after it (the new one is whole)
    assert {result["last.pt holds"] for result in report["results"]} == {"previous", "new"}
    # resume continues from whatever last.pt holds now: the epoch after it, with the history before it
    resumed = LibreYOLO("tinynet-s").train(resume=str(last), **{key: settings[key] for key in ("device", "workers")})
    after = torch.load(last, map_location="cpu", weights_only=True)
    assert after["epoch"] == before["epoch"] + 1 and resumed.epochs_completed == 2
    assert after["history"][0] == before["history"][0] and len(after["history"]) == 2
    assert not list(last.parent.glob(".*.tmp")), "the resumed run did not sweep the killed writers' temp files"


# --------------------------------------------------------------------------- the final best.pt is lean
def test_the_final_best_pt_is_lean_half_precision_weights_and_predicts_like_the_full_checkpoint(tmp_path):
    """Once training ends, best.pt holds the EMA weights in float16 and no optimizer or second copy; last.pt stays
    resumable; LibreYOLO(best.pt) predicts and validates like the full weights, and still exports for LibreYOLO."""
    from zoo_core import LibreYOLO
    from zoo_core.weights import read_checkpoint

    data = "shapes:train=4,val=2,size=32"
    model = LibreYOLO("yolo9-t")
    result = model.train(data=data, epochs=1, batch=4, imgsz=32, workers=0, plots=False, verbose=False, val=False,
                         project=str(tmp_path / "runs"))
    best = torch.load(result.best, map_location="cpu", weights_only=True)
    last = torch.load(result.last, map_location="cpu", weights_only=True)
    assert not {"optimizer", "train_model", "scaler", "history"} & set(best), sorted(best)
    assert {"optimizer", "train_model", "epoch", "config", "run_dir"} <= set(last)  # last.pt: still a full checkpoint
    floats = [tensor for tensor in best["model"].values() if tensor.is_floating_point()]
    assert floats and all(tensor.dtype == torch.float16 for tensor in floats)
    assert result.best.stat().st_size * 4 < result.last.stat().st_size
    assert best["epoch"] == last["epoch"] == 0 and best["meta"]["family"] == "yolo9"
    read_checkpoint(result.best)  # its checksum is over the half-precision tensors it holds

    # One epoch: best.pt and last.pt hold the same (EMA) weights, one in float32, one in float16; the caller the float32.
    assert all(torch.equal(value, last["model"][key]) for key, value in model.model.state_dict().items())
    full, lean = LibreYOLO(result.last), LibreYOLO(result.best)
    for key, tensor in full.model.state_dict().items():
        assert torch.allclose(tensor.float(), lean.model.state_dict()[key].float(), rtol=1e-3, atol=1e-4), key
    image = torch.randint(0, 255, (32, 32, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)).numpy()
    expected, actual = full.predict(image, conf=0.0)[0], lean.predict(image, conf=0.0)[0]
    assert len(expected.boxes) > 0 and len(actual.boxes) == len(expected.boxes)
    assert torch.allclose(expected.boxes.conf, actual.boxes.conf, atol=2e-3)
    assert torch.allclose(expected.boxes.xyxy, actual.boxes.xyxy, atol=0.5)

    libreyolo = pytest.importorskip("libreyolo")
    exported = lean.export("libreyolo", tmp_path / "LibreYOLO9t.pt")  # LibreYOLO's own format, in float32
    reference = libreyolo.LibreYOLO(str(exported))
    assert sum(parameter.numel() for parameter in reference.model.parameters()) == sum(
        parameter.numel() for parameter in lean.model.parameters())


def test_resuming_from_a_lean_best_pt_names_the_last_pt_beside_it(tmp_path):
    from zoo_core import LibreYOLO
    from zoo_core.errors import ResumeError

    from .support import use_test_families, write_class_folders

    use_test_families()
    data = write_class_folders(tmp_path / "data", per_class=4, val_per_class=2, size=16)
    settings = dict(device="cpu", batch=8, imgsz=16, workers=0, nbs=8, plots=False, verbose=False)
    # time= stops the run after its first epoch of three: last.pt can be resumed, best.pt cannot.
    result = LibreYOLO("tinynet-s").train(data=str(data), epochs=3, time=1e-9, project=str(tmp_path / "runs"), **settings)
    with pytest.raises(ResumeError, match="kept lean") as caught:
        LibreYOLO("tinynet-s").train(resume=str(result.best), device="cpu", workers=0)
    assert str(result.last) in str(caught.value)
    with pytest.raises(ResumeError, match="kept lean"):
        LibreYOLO(result.best).train(resume=True, device="cpu", workers=0)
    resumed = LibreYOLO(result.last).train(resume=True, device="cpu", workers=0)
    assert resumed.epochs_completed == 2  # one more epoch: the saved time= stops it again
