"""One-device training: outputs, loggers, profiler trace, stop guards and resume errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from zoo_core.errors import ResumeError, TrainConfigError, TrainingDivergedError
from zoo_core.facade import LibreYOLO

from .support import use_test_families, write_class_folders

pytestmark = pytest.mark.timeout(180)

FAST = dict(epochs=2, batch=8, imgsz=32, workers=0, nbs=8, device="cpu", verbose=False)


@pytest.fixture(autouse=True)
def _families() -> None:
    use_test_families()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_class_folders(tmp_path / "data")


def test_a_run_writes_what_people_expect(data, capsys):
    model = LibreYOLO("tinynet-s")
    result = model.train(data=str(data), loggers=["csv", "tensorboard"], **{**FAST, "verbose": True})
    run = result.run_dir
    assert {path.name for path in run.iterdir()} >= {"results.csv", "results.png", "args.yaml", "weights"}
    assert list(run.glob("events.out.tfevents.*")), "the tensorboard logger wrote nothing"
    rows = list(csv.DictReader((run / "results.csv").open()))
    assert [row["epoch"] for row in rows] == ["1", "2"] and {"train/loss", "metrics/top1", "lr"} <= set(rows[0])
    assert len(result.history) == 2 and result.metrics["top1"] == result.best_fitness
    printed = capsys.readouterr().out
    assert printed.count("epoch 1/2  loss") == 1 and f"-> {run}" in printed
    checkpoint = torch.load(result.last, map_location="cpu", weights_only=True)
    assert {"model", "train_model", "optimizer", "iteration", "epoch", "config", "meta", "history"} <= set(checkpoint)
    assert LibreYOLO(result.best).names == {0: "c0", 1: "c1"}


def test_profile_on_one_device_writes_a_trace(data):
    result = LibreYOLO("tinynet-s").train(data=str(data), profile=True, **FAST)
    assert (result.run_dir / "profile_trace.json").stat().st_size > 0


def test_a_diverging_loss_stops_with_a_clear_error(data):
    model = LibreYOLO("tinynet-s")
    with pytest.raises(TrainingDivergedError, match="diverged in epoch 1: .*NaN or infinite.*Lower lr0"):
        model.train(data=str(data), optimizer="SGD", lr0=1e30, momentum=0.0, max_grad_norm=None, warmup_epochs=0, **FAST)


def test_the_time_limit_stops_after_the_first_epoch(data):
    result = LibreYOLO("tinynet-s").train(data=str(data), time=1e-9, **{**FAST, "epochs": 5})
    assert result.epochs_completed == 1 and result.stopped_early


def test_resume_errors_say_what_to_do(data):
    model = LibreYOLO("tinynet-s")
    with pytest.raises(ResumeError, match="resume=True found no checkpoint"):
        model.train(resume=True)
    with pytest.raises(ResumeError, match="no such checkpoint file"):
        model.train(resume="runs/nothing/last.pt")
    finished = model.train(data=str(data), **FAST)
    with pytest.raises(ResumeError, match="finished all 2 epochs"):
        LibreYOLO(finished.last).train(resume=True)
    with pytest.raises(ResumeError, match="'lr0' differ"):
        LibreYOLO(finished.last).train(resume=True, lr0=0.5)
    with pytest.raises(TrainConfigError, match="unknown training argument 'epoch'"):
        model.train(data=str(data), epoch=3)


def test_classes_follow_the_data_and_the_callers_model_changes_only_on_success(data, tmp_path):
    model = LibreYOLO("tinynet-s", num_classes=5)
    assert model.num_classes == 5
    with pytest.raises(Exception):
        model.train(data=str(tmp_path / "missing"), **FAST)
    assert model.num_classes == 5
    model.train(data=str(data), **FAST)
    assert model.num_classes == 2 and model.names == {0: "c0", 1: "c1"} and model.input_size == 32


def test_training_leaves_the_matplotlib_backend_alone_and_a_failed_run_leaves_no_folder(data):
    import matplotlib

    previous = matplotlib.get_backend()
    matplotlib.use("svg")  # the caller's choice, e.g. a notebook's
    try:
        result = LibreYOLO("tinynet-s").train(data=str(data), **{**FAST, "plots": True})
        assert (result.run_dir / "results.png").is_file() and matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(previous)
    with pytest.raises(RuntimeError, match="injected failure"):
        LibreYOLO("tinynet-s", options={"fail_rank": 0, "fail_step": 1}).train(data=str(data), name="broken", **FAST)
    assert not list(Path("runs").glob("classify/broken*")), "a run that wrote no checkpoint left its folder"


def test_add_callback_calls_a_function_at_its_event_and_a_plain_function_in_callbacks_names_the_fix(data):
    epochs, steps, starts, ends = [], [], [], []
    model = LibreYOLO("tinynet-s")
    model.add_callback("on_train_start", lambda run_dir, config: starts.append(config["epochs"]))
    model.add_callback("optimizer_step", steps.append)
    model.add_callback("on_train_epoch_end", lambda report: epochs.append(report.epoch))
    model.add_callback("on_train_end", ends.append)
    result = model.train(data=str(data), **FAST)
    assert starts == [2] and epochs == [1, 2] and ends == [result] and steps == list(range(1, len(steps) + 1)) and steps
    with pytest.raises(TrainConfigError, match=r"callbacks\[0\] = .* is a plain function.*add_callback\('on_train_epoch_end', fn\)"):
        LibreYOLO("tinynet-s").train(data=str(data), callbacks=[print], **FAST)
    with pytest.raises(TrainConfigError, match=r"unknown event 'on_train_epoch_ends'\. Did you mean 'on_train_epoch_end'\?"):
        LibreYOLO("tinynet-s").add_callback("on_train_epoch_ends", print)


def test_freeze_keeps_the_named_modules_fixed_and_names_what_matches_nothing(data, capsys):
    from zoo_core.errors import TrainConfigError

    model = LibreYOLO("tinynet-s")
    before = {key: value.clone() for key, value in model.model.state_dict().items()}
    model.train(data=str(data), freeze=["body"], **{**FAST, "verbose": True})
    assert "freeze=['body']: these modules stay fixed: body;" in capsys.readouterr().out
    after = model.model.state_dict()
    assert all(torch.equal(after[key], before[key]) for key in after if key.startswith("body.") and "running" not in key
               and "num_batches" not in key)
    assert not torch.equal(after["head.weight"], before["head.weight"])
    with pytest.raises(TrainConfigError, match=r"freeze names \['neck'\] match no parameter.*body, head"):
        LibreYOLO("tinynet-s").train(data=str(data), freeze=["neck"], **FAST)


def test_freeze_n_freezes_the_first_n_blocks_in_forward_order_and_prints_them(capsys):
    model = LibreYOLO("yolo9-t")
    before = {key: value.clone() for key, value in model.model.state_dict().items()}
    model.train(data="shapes:train=4,val=4,size=64,seed=5", freeze=5, epochs=1, batch=4, imgsz=64, workers=0, val=False,
                plots=False, warmup_epochs=0, device="cpu")
    # Forward order: GELAN registers its four downsamples before its blocks, but runs them in turn.
    expected = "backbone.stem.0, backbone.stem.1, backbone.p2_block, backbone.downsamples.0, backbone.blocks.0"
    assert f"freeze=5: 5 blocks stay fixed (forward order): {expected};" in capsys.readouterr().out
    after = model.model.state_dict()
    frozen = tuple(f"{name}." for name in expected.split(", "))
    trained = [key for key in after if after[key].is_floating_point() and "running" not in key]
    assert all(torch.equal(after[key], before[key]) for key in trained if key.startswith(frozen))
    assert not all(torch.equal(after[key], before[key]) for key in trained if key.startswith("backbone.downsamples.1."))
    with pytest.raises(TrainConfigError, match=r"freeze=33: the model has 32 blocks \(backbone\.stem\.0, .*freeze=\['backbone'\]"):
        LibreYOLO("yolo9-t").train(data="shapes:train=4,val=4,size=64,seed=5", freeze=33, epochs=1, batch=4, imgsz=64,
                                   workers=0, device="cpu")


def test_compile_runs_the_training_forward_through_torch_compile(data, monkeypatch):
    # Real dynamo capture with AOT autograd, short of inductor's C++ build (benchmarks/compile_gain.py runs that).
    compiled: list[dict] = []
    real_compile = torch.compile

    def compile_without_inductor(module, **options):
        compiled.append(options)
        return real_compile(module, **{**options, "backend": "aot_eager"})

    monkeypatch.setattr(torch, "compile", compile_without_inductor)
    torch.manual_seed(0)
    model = LibreYOLO("tinynet-s")
    before = {key: value.clone() for key, value in model.model.state_dict().items()}
    result = model.train(data=str(data), compile=True, **{**FAST, "epochs": 1})
    assert compiled == [{"mode": None}]
    assert result.epochs_completed == 1 and 0.0 <= result.metrics["top1"] <= 1.0
    assert any(not torch.equal(before[key], value) for key, value in model.model.state_dict().items())
    assert not any(key.startswith("_orig_mod") for key in torch.load(result.best, weights_only=True)["model"])
