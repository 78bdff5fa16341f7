"""torchrun launches (E2, E7, E16, E17): real ``torchrun`` processes on CPU with gloo.

One script, written into the test's directory, plays every part: it trains ``tinynet`` with
``device="cpu"`` and reports, per rank, what it saw as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zoo_core.engine.distributed import find_free_port

from .support import run_concurrently, run_script, script_environment, torchrun_command, write_class_folders

pytestmark = pytest.mark.timeout(300)

SCRIPT = '''
import hashlib, json, multiprocessing, os, sys
import torch
from zoo_core import LibreYOLO, register_plugin
from zoo_core.engine.callbacks import Callback
from tests import doubles


class Interrupt(Callback):
    def on_epoch_end(self, report):
        if report.epoch == 1:
            raise KeyboardInterrupt("interrupted after epoch 1")


class ChildCounter(Callback):
    def __init__(self):
        self.children = []
    def on_epoch_end(self, report):
        self.children.append(len(multiprocessing.active_children()))


if __name__ == "__main__":
    mode, data, out = sys.argv[1], sys.argv[2], sys.argv[3]
    rank = os.environ["RANK"]
    register_plugin(doubles, "engine-test-families")
    settings = dict(data=data, device="cpu", epochs=3, batch=8, imgsz=32, workers=0, nbs=8, verbose=False,
                    plots=False, optimizer="SGD", lr0=0.05)
    if mode == "autobatch":
        import zoo_core.engine.rank as rank_module
        from zoo_core.tasks.classify import ClassifyTask
        rank_module.probe_batch_size = lambda *args, **kwargs: 6 if rank == "0" else 2
        if rank != "0":
            def refuse(self, data):
                raise AssertionError("only rank 0 may prepare the data")
            ClassifyTask.prepare = refuse
        settings.update(batch=-1, nbs=64, epochs=1, name="autobatch")
    counter = ChildCounter()
    if mode == "cut":
        settings.update(name="cut", callbacks=[Interrupt()])
    elif mode == "resume":
        settings = dict(resume=True, device="cpu")
    elif mode != "autobatch":
        settings.update(name=mode, callbacks=[counter])
    torch.manual_seed(0)  # the same initial weights in every run
    model = LibreYOLO(sys.argv[4]) if mode == "resume" else LibreYOLO("tinynet-s")
    result = model.train(**settings)
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in model.model.state_dict().values())).hexdigest()
    with open(os.path.join(out, f"{mode}-rank{rank}.json"), "w") as stream:
        json.dump({"world_size": result.world_size, "batch": result.batch, "accumulate": result.accumulate,
                   "run_dir": str(result.run_dir), "digest": digest, "children": counter.children,
                   "env_world_size": os.environ["WORLD_SIZE"]}, stream)
'''


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    write_class_folders(tmp_path / "data")
    (tmp_path / "out").mkdir()
    return tmp_path


def torchrun(workspace: Path, *options: str, mode: str, extra: tuple[str, ...] = (), timeout: float = 240):
    return run_script(
        workspace / "train.py", mode, "data", "out", *extra, timeout=timeout,
        launcher=torchrun_command(*options),
    )


def reports(workspace: Path, mode: str) -> list[dict]:
    return [json.loads((workspace / "out" / f"{mode}-rank{rank}.json").read_text()) for rank in (0, 1)]


def test_e2_torchrun_trains_without_spawning(workspace):
    result = torchrun(workspace, "--nproc_per_node=2", f"--master_port={find_free_port()}", mode="single")
    assert result.returncode == 0, result.stdout + result.stderr
    rank0, rank1 = reports(workspace, "single")
    assert rank0["world_size"] == rank1["world_size"] == 2
    assert rank0["digest"] == rank1["digest"] and rank0["run_dir"] == rank1["run_dir"] == "runs/classify/single"
    assert rank0["children"] == [0, 0, 0]  # no process was spawned by train()
    # The small-batch warning points at the user's own training call, not at zoo's code.
    warning = next(line for line in result.stderr.splitlines() if "TrainingWarning: the model has BatchNorm" in line)
    assert warning.startswith(str(workspace / "train.py")), warning
    assert sorted(p.name for p in (workspace / "runs").rglob("*.pt")) == ["best.pt", "last.pt"]


def test_e2_two_node_launch_on_loopback_trains_and_agrees(workspace):
    port = find_free_port()
    nodes = run_concurrently(
        [[*torchrun_command("--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1", "--master_addr=127.0.0.1",
                            f"--master_port={port}"), "train.py", "nodes", "data", "out"] for node in (0, 1)],
        workspace, script_environment(),
    )
    assert [code for code, _ in nodes] == [0, 0], "\n".join(output for _, output in nodes)
    rank0, rank1 = reports(workspace, "nodes")
    assert rank0["env_world_size"] == "2" and rank0["world_size"] == 2
    assert rank0["digest"] == rank1["digest"]


def test_e7_e17_rank0_measures_and_prepares_then_broadcasts(workspace):
    result = torchrun(workspace, "--nproc_per_node=2", f"--master_port={find_free_port()}", mode="autobatch")
    assert result.returncode == 0, result.stdout + result.stderr
    rank0, rank1 = reports(workspace, "autobatch")
    # Rank 0 measured 6 per device, rank 1 would have said 2: both train at rank 0's 6 x 2 = 12.
    assert rank0["batch"] == rank1["batch"] == 12
    assert rank0["accumulate"] == rank1["accumulate"] == 5  # round(64 / 12)


def test_e16_resume_under_torchrun_matches_an_uninterrupted_run(workspace):
    options = ("--nproc_per_node=2",)
    full = torchrun(workspace, *options, f"--master_port={find_free_port()}", mode="full")
    assert full.returncode == 0, full.stdout + full.stderr
    cut = torchrun(workspace, *options, f"--master_port={find_free_port()}", mode="cut")
    assert cut.returncode != 0 and "interrupted after epoch 1" in cut.stdout + cut.stderr
    last = workspace / "runs/classify/cut/weights/last.pt"
    assert torch.load(last, map_location="cpu", weights_only=True)["epoch"] == 0
    resumed = torchrun(workspace, *options, f"--master_port={find_free_port()}", mode="resume", extra=(str(last),))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    expected = torch.load(workspace / "runs/classify/full/weights/last.pt", map_location="cpu", weights_only=True)
    actual = torch.load(last, map_location="cpu", weights_only=True)
    assert actual["epoch"] == 2
    for key in expected["train_model"]:
        assert torch.allclose(expected["train_model"][key].float(), actual["train_model"][key].float(), atol=1e-6), key
