"""Spawn DDP on CPU ranks (gloo, world size 2), each E-behaviour of docs/architecture.md with real processes.

Every test starts real worker processes through ``train(device="cpu,cpu")``; nothing about
torch.distributed or spawning is mocked. The parent-side hooks some tests replace
(``find_free_port``, ``probe_batch_size``, ``Task.prepare``) run in the parent only, which is
the point: workers that called them would see the original and the test would fail.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from pathlib import Path

import pytest
import torch

from zoo_core import hookimpl
from zoo_core.engine import launcher, rank
from zoo_core.engine.callbacks import Callback
from zoo_core.errors import BatchSizeError, SpawnNotSupportedError, UnpicklableArgumentError, WorkerFailedError
from zoo_core.facade import LibreYOLO
from zoo_core.plugin_manager import register_plugin

from .support import use_test_families, write_class_folders

pytestmark = pytest.mark.timeout(240)

FAST = dict(epochs=1, batch=8, imgsz=32, workers=0, nbs=8, verbose=False, plots=False)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_class_folders(tmp_path / "data")


@pytest.fixture(autouse=True)
def _families() -> None:
    use_test_families()


class RankRecorder(Callback):
    """Appends the rank that runs each event (callbacks must run on rank 0 only, E9)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def _record(self, event: str) -> None:
        import os

        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(f"{event} {os.environ.get('RANK', 'none')}\n")

    def on_train_start(self, run_dir, config):
        self._record("start")

    def on_epoch_end(self, report):
        self._record("epoch")

    def on_train_end(self, result):
        self._record("end")


class StopAfterEpoch(Callback):
    """Interrupts a run after ``epoch`` (after its checkpoint is written), like a crash would."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, report):
        if report.epoch == self.epoch:
            raise KeyboardInterrupt(f"interrupted after epoch {report.epoch}")


class SyncBatchNormEverywhere:
    """A policy plugin (module level, so it pickles into the workers): sync_bn on by default."""

    @hookimpl
    def default_sync_bn(self, family):
        return True


def no_spawn_leftovers(directory: Path) -> bool:
    return not list(directory.glob("zoo-spawn-*"))


# --------------------------------------------------------------------------- E1, E9
def test_e1_e9_spawn_trains_resnet_and_the_caller_holds_rank0_best_weights(data, tmp_path, monkeypatch):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    Path("runs/classify/train").mkdir(parents=True)  # pre-existing run: both ranks must agree on train2
    log = tmp_path / "events.txt"
    model = LibreYOLO("resnet18")
    result = model.train(data=str(data), device="cpu,cpu", callbacks=[RankRecorder(log)], **{**FAST, "epochs": 2})

    assert result.world_size == 2 and result.batch == 8 and result.epochs_completed == 2
    assert set(result.metrics) >= {"top1", "top5"} and 0.0 <= result.metrics["top1"] <= 1.0
    assert result.run_dir == Path("runs/classify/train2")
    assert sorted(p.name for p in Path("runs/classify").rglob("*.pt")) == ["best.pt", "last.pt"]
    assert not list(Path("runs/classify/train").iterdir())
    best = torch.load(result.best, map_location="cpu", weights_only=True)["model"]
    for key, tensor in model.model.state_dict().items():
        assert torch.equal(tensor.to(best[key].dtype), best[key]), key  # best.pt is float16, the caller's float32
    assert model.names == {0: "c0", 1: "c1"} and model.num_classes == 2
    assert (result.run_dir / "results.csv").read_text().count("\n") == 3
    assert log.read_text().split("\n")[:-1] == ["start 0", "epoch 0", "epoch 0", "end 0"]
    assert no_spawn_leftovers(temporary)


def test_prepare_workers_starts_the_forkserver_before_train_for_several_devices_only(monkeypatch):
    """``zoo_core.prepare_workers(device)`` at the top of a script: the workers' imports overlap the script's own."""
    import multiprocessing.forkserver

    import zoo_core
    from zoo_core.errors import DeviceSpecError

    started: list[str] = []
    real_start = launcher.start_worker_server
    monkeypatch.setattr(launcher, "start_worker_server", lambda modules: started.append("started"))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for device, expected in (("cpu", []), (None, []), ("cpu,cpu", ["started"]), ([0, 1], ["started"])):
        started.clear()
        zoo_core.prepare_workers(device)
        assert started == expected, device
    with pytest.raises(DeviceSpecError, match="accepted forms"):
        zoo_core.prepare_workers("cpu,,cpu")
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    started.clear()
    zoo_core.prepare_workers("cpu,cpu")
    assert started == []  # torchrun started the ranks already
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name)
    monkeypatch.setattr(launcher, "start_worker_server", real_start)
    zoo_core.prepare_workers("cpu,cpu")
    if "forkserver" in multiprocessing.get_all_start_methods():
        assert multiprocessing.forkserver._forkserver._forkserver_pid is not None
        assert launcher.WORKER_SERVER.start_method() == "forkserver"  # train() forks its workers from this one


# --------------------------------------------------------------------------- E4, E5, E13 (refused before any worker)
def test_e4_a_lambda_callback_is_refused_before_spawning(data):
    model = LibreYOLO("tinynet-s")
    model.add_callback("on_train_epoch_end", lambda report: None)
    with pytest.raises(UnpicklableArgumentError) as caught:
        model.train(data=str(data), device="cpu,cpu", **FAST)
    message = str(caught.value)
    assert "callbacks[0] = add_callback('on_train_epoch_end', <function" in message
    assert "module level" in message and "loggers=['csv', 'tensorboard']" in message
    assert not Path("runs").exists() and not multiprocessing.active_children()


def record_epoch(report) -> None:
    """A module-level callback function (picklable): notes the epoch and the process that ran it."""
    import os

    with open(report.run_dir / "epochs.txt", "a", encoding="utf-8") as stream:
        stream.write(f"{report.epoch} {os.getpid()} {os.environ.get('RANK', 'none')}\n")


def test_add_callback_runs_a_module_level_function_in_rank_0_of_a_spawned_run(data):
    import os

    model = LibreYOLO("tinynet-s")
    model.add_callback("on_train_epoch_end", record_epoch)
    result = model.train(data=str(data), device="cpu,cpu", **{**FAST, "epochs": 2})
    lines = [line.split() for line in (result.run_dir / "epochs.txt").read_text().splitlines()]
    assert [(epoch, rank_name) for epoch, _, rank_name in lines] == [("1", "0"), ("2", "0")]
    assert all(int(pid) != os.getpid() for _, pid, _ in lines)  # it ran in the worker, not here


def test_e5_indivisible_batch_is_refused_before_any_worker_starts(data):
    model = LibreYOLO("tinynet-s")
    with pytest.raises(BatchSizeError, match=r"world_size=4.*Use batch=4 or batch=8\."):
        model.train(data=str(data), device="cpu,cpu,cpu,cpu", **{**FAST, "batch": 6})
    assert not multiprocessing.active_children() and not Path("runs").exists()


def test_e13_a_family_without_spawn_support_names_torchrun(data):
    model = LibreYOLO("nospawnnet-s")
    with pytest.raises(SpawnNotSupportedError) as caught:
        model.train(data=str(data), device="cpu,cpu", **FAST)
    message = str(caught.value)
    assert "'nospawnnet'" in message and "torchrun --nproc_per_node=2 your_script.py" in message
    assert "LibreYOLO('nospawnnet-s').train(" in message
    assert not multiprocessing.active_children()


# --------------------------------------------------------------------------- E7, E17 (measured and prepared in the parent)
def test_e7_e17_autobatch_and_data_are_resolved_in_the_parent(data, monkeypatch):
    from zoo_core.tasks.classify import ClassifyTask

    probed: list[str] = []

    def parent_probe(model, recipe, image_size, device, num_classes, fraction=0.6):
        probed.append(str(device))
        return 5  # workers probing themselves would get the CPU default, 16

    real_prepare = ClassifyTask.prepare
    monkeypatch.setattr(rank, "probe_batch_size", parent_probe)
    monkeypatch.setattr(ClassifyTask, "prepare", lambda self, _: real_prepare(self, data))
    model = LibreYOLO("tinynet-s")
    # data= is not a real path: a worker preparing the data itself would fail.
    result = model.train(data="only-the-parent-can-resolve-this", device="cpu,cpu", **{**FAST, "batch": -1, "nbs": 8})
    assert probed == ["cpu"]
    assert (result.batch, result.accumulate) == (8, 1)  # 5 per device x 2 = 10, capped at nbs=8
    result = model.train(data="only-the-parent-can-resolve-this", device="cpu,cpu", **{**FAST, "batch": -1, "nbs": 40})
    assert (result.batch, result.accumulate) == (10, 4)  # round(40 / 10)


# --------------------------------------------------------------------------- E8 (family default), E12
def test_e8_e11_e12_sync_bn_default_warning_timeout_and_ddp_off_switches(data, tmp_path, capfd):
    trace = tmp_path / "trace"
    trace.mkdir()
    model = LibreYOLO("tinynet-s", options={"trace_dir": str(trace)})
    model.train(data=str(data), device="cpu,cpu", cuda_graph=True, profile=True, ddp_timeout=123, **{**FAST, "verbose": True})
    assert (trace / "timeout1.txt").read_text() == "123.0"  # E11: the configured process-group timeout
    output = capfd.readouterr()
    assert output.err.count("sync_bn is off and each rank trains at batch 4") == 1
    # Rank 0 has no user frame on its stack: the warning names no file (it pointed at torch's spawn.py).
    assert "zoo: TrainingWarning: the model has BatchNorm, sync_bn is off" in output.err
    assert "multiprocessing" not in output.err and "warn(" not in output.err
    assert output.out.count("cuda_graph=True is not used under DDP; training eagerly") == 1
    assert output.err.count("profile=True is ignored under DDP") == 1
    assert {line.split()[0] for line in (trace / "rank1.txt").read_text().splitlines()} == {"BatchNorm2d"}

    register_plugin(SyncBatchNormEverywhere(), "sync-everywhere")
    for path in trace.iterdir():
        path.unlink()
    LibreYOLO("tinynet-s", options={"trace_dir": str(trace)}).train(data=str(data), device="cpu,cpu", **FAST)
    assert "sync_bn is off" not in capfd.readouterr().err
    for rank_index in (0, 1):
        assert {line.split()[0] for line in (trace / f"rank{rank_index}.txt").read_text().splitlines()} == {"CpuSyncBatchNorm"}


def test_every_rank_validates_with_rank_0s_batchnorm_statistics_when_sync_bn_is_off(data, tmp_path):
    # Each rank's last training forward updates its running statistics with its own batch; sharded validation
    # then scored rank 1's shard with statistics that neither the checkpoint nor a one-process val() has.
    trace = tmp_path / "trace"
    trace.mkdir()
    LibreYOLO("tinynet-s", options={"trace_dir": str(trace)}).train(data=str(data), device="cpu,cpu", sync_bn=False,
                                                                   **{**FAST, "epochs": 2})
    per_rank = [(trace / f"eval{rank_index}.txt").read_text().splitlines() for rank_index in (0, 1)]
    assert per_rank[0] and per_rank[1]
    assert set(per_rank[0]) == set(per_rank[1])


# --------------------------------------------------------------------------- E10 and two-rank determinism
def test_e10_ranks_draw_different_augmentations_and_identical_runs_repeat(tmp_path):
    same_images = write_class_folders(tmp_path / "same", identical=True)
    traces, finals = [], []
    for run in range(2):
        trace = tmp_path / f"trace{run}"
        trace.mkdir()
        model = LibreYOLO("tinynet-s", options={"trace_dir": str(trace)})
        result = model.train(data=str(same_images), device="cpu,cpu", augment=True, name=f"run{run}", **{**FAST, "epochs": 2})
        traces.append({rank: (trace / f"rank{rank}.txt").read_text() for rank in (0, 1)})
        finals.append(torch.load(result.last, map_location="cpu", weights_only=True)["train_model"])
    # Every image is identical, so batches differ only by augmentation: ranks must differ...
    assert traces[0][0] != traces[0][1]
    # ...and a second identical run must repeat every draw and end with identical weights.
    assert traces[0] == traces[1]
    for key in finals[0]:
        assert torch.equal(finals[0][key], finals[1][key]), key


# --------------------------------------------------------------------------- E14
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_e14_a_failing_rank_is_one_exception_and_nothing_is_left_behind(data, tmp_path, monkeypatch, how):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    model = LibreYOLO("tinynet-s", options={"fail_rank": 1, "fail_step": 2, "fail_how": how})
    before = {key: value.clone() for key, value in model.model.state_dict().items()}
    started = time.monotonic()
    with pytest.raises(WorkerFailedError) as caught:
        model.train(data=str(data), device="cpu,cpu", **{**FAST, "epochs": 3})
    assert time.monotonic() - started < 60
    error = caught.value
    assert error.rank == 1 and "rank 1" in str(error)
    if how == "raise":
        assert "injected failure on rank 1 at step 2" in str(error) and "Traceback" in error.worker_traceback
    else:
        assert "killed by SIGKILL" in str(error)
    assert not multiprocessing.active_children()
    assert no_spawn_leftovers(temporary)
    for key, value in model.model.state_dict().items():
        assert torch.equal(value, before[key]), key


# --------------------------------------------------------------------------- E15
def test_e15_a_taken_port_is_retried_on_a_fresh_one(data, monkeypatch):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    offered = [taken.getsockname()[1]]
    real = launcher.find_free_port

    def first_the_taken_port() -> int:
        offered.append(real())
        return offered.pop(0)

    monkeypatch.setattr(launcher, "find_free_port", first_the_taken_port)
    try:
        result = LibreYOLO("tinynet-s").train(data=str(data), device="cpu,cpu", **FAST)
    finally:
        taken.close()
    assert result.epochs_completed == 1


def test_e15_a_taken_user_port_is_a_clear_error(data):
    import socket

    from zoo_core.errors import MasterPortInUseError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MasterPortInUseError, match=f"master port {port} .*already in use"):
            LibreYOLO("tinynet-s").train(data=str(data), device="cpu,cpu", master_port=port, **FAST)


# --------------------------------------------------------------------------- E16 (spawn)
def test_e16_resume_under_spawn_matches_an_uninterrupted_run(data):
    settings = {**FAST, "epochs": 3, "val": True, "optimizer": "SGD", "lr0": 0.05}
    torch.manual_seed(0)
    initial = LibreYOLO("tinynet-s").save(Path("initial.safetensors"))
    reference = LibreYOLO(initial).train(data=str(data), device="cpu,cpu", name="full", **settings)
    interrupted = LibreYOLO(initial)
    with pytest.raises(WorkerFailedError, match="interrupted after epoch 1"):
        interrupted.train(data=str(data), device="cpu,cpu", name="cut", callbacks=[StopAfterEpoch(1)], **settings)
    last = Path("runs/classify/cut/weights/last.pt")
    assert torch.load(last, map_location="cpu", weights_only=True)["epoch"] == 0
    resumed = LibreYOLO(last).train(resume=True, device="cpu,cpu")
    assert resumed.run_dir == Path("runs/classify/cut") and resumed.epochs_completed == 3
    expected = torch.load(reference.last, map_location="cpu", weights_only=True)
    actual = torch.load(resumed.last, map_location="cpu", weights_only=True)
    for key in expected["train_model"]:
        assert torch.allclose(expected["train_model"][key].float(), actual["train_model"][key].float(), atol=1e-6), key
    for key in expected["model"]:
        assert torch.allclose(expected["model"][key].float(), actual["model"][key].float(), atol=1e-6), key


# --------------------------------------------------------------------------- E19
def test_e19_early_stopping_on_rank0_stops_every_rank_at_the_same_epoch(data, tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    model = LibreYOLO("tinynet-s", options={"trace_dir": str(trace)})
    # A learning rate this small never changes the accuracy, so patience runs out after epoch 3.
    result = model.train(data=str(data), device="cpu,cpu", patience=2, optimizer="SGD", lr0=1e-12, **{**FAST, "epochs": 20})
    assert result.stopped_early and result.epochs_completed == 3
    steps_per_epoch = 3  # 24 images, 4 per rank per step
    for rank_index in (0, 1):
        assert len((trace / f"rank{rank_index}.txt").read_text().splitlines()) == 3 * steps_per_epoch
