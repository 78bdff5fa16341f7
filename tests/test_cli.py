"""The declarative commands of ``zoo``: list, info, plugins (in-process, plus exit codes)."""

from __future__ import annotations

import json

import pytest

from zoo_core.cli import main
from zoo_core.registry import load_registry


def test_list_shows_every_family_with_its_sizes(capsys):
    assert main(["list"]) == 0
    output = capsys.readouterr().out
    for name, declaration in load_registry().items():
        line = next(line for line in output.splitlines() if line.startswith(name + " "))
        assert " ".join(declaration.sizes) in line


def test_list_filters_by_task_and_emits_json(capsys):
    assert main(["list", "--task", "classify", "--json"]) == 0
    items = json.loads(capsys.readouterr().out)
    assert items and {item["task"] for item in items} == {"classify"}
    assert {"family", "sizes", "spawn", "sync_bn", "plugin", "distribution"} <= set(items[0])


def test_info_accepts_a_model_name_and_prints_published_counts(capsys):
    assert main(["info", "convnextv2-atto"]) == 0
    output = capsys.readouterr().out
    assert "ConvNeXt V2 (convnextv2)" in output and "3.7M" in output and "660.0M" in output
    assert "sync_bn:   off" in output and "spawn:     yes" in output


def test_info_of_an_unknown_family_exits_2_with_suggestions(capsys):
    assert main(["info", "convnxt"]) == 2
    assert "Did you mean 'convnext'" in capsys.readouterr().err


def test_plugins_lists_builtins_with_the_zoo_core_distribution(capsys):
    assert main(["plugins", "--json"]) == 0
    records = {item["plugin"]: item for item in json.loads(capsys.readouterr().out)}
    assert records["resnet"]["distribution"] == "zoo-core" and records["resnet"]["families"] == ["resnet"]


def test_train_val_and_predict_from_the_command_line(tmp_path, capsys):
    from .support import use_test_families, write_class_folders

    use_test_families()
    data = write_class_folders(tmp_path / "data")
    assert main(["train", "tinynet-s", "--data", str(data), "--epochs", "1", "--imgsz", "32", "--device", "cpu",
                 "--workers", "0", "batch=8", "plots=false", "verbose=false"]) == 0
    output = capsys.readouterr().out
    assert "metrics: top1" in output and "run directory: runs/classify/train" in output
    best = "runs/classify/train/weights/best.pt"
    assert main(["val", best, "--workers", "0"]) == 0  # the dataset it was trained on, recorded in best.pt
    assert "top1" in capsys.readouterr().out
    assert main(["predict", best, str(data / "val" / "c0"), "--save"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5 and all("c0" in line or "c1" in line for line in lines[:4])
    assert lines[-1] == "drawn results written to runs/classify/predict"
    assert len(list((tmp_path / "runs" / "classify" / "predict").iterdir())) == 4


def test_every_argument_can_be_key_value_as_ultralytics_users_type_it(tmp_path, capsys):
    from .support import use_test_families, write_class_folders

    use_test_families()
    data = write_class_folders(tmp_path / "data")
    assert main(["train", "model=tinynet-s", f"data={data}", "epochs=1", "imgsz=32", "device=cpu", "workers=0",
                 "batch=8", "plots=false", "verbose=false", "name=kv"]) == 0
    assert "run directory: runs/classify/kv" in capsys.readouterr().out
    assert main(["val", "model=runs/classify/kv/weights/best.pt", f"data={data}", "workers=0", "batch=4"]) == 0
    assert main(["predict", "model=runs/classify/kv/weights/best.pt", f"source={data / 'val' / 'c1'}", "save=true",
                 "name=kvpredict"]) == 0
    assert "written to runs/classify/kvpredict" in capsys.readouterr().out


def test_a_word_that_is_neither_flag_nor_key_value_is_one_clear_error(capsys):
    assert main(["train", "resnet18", "--data", "x", "lr0"]) == 2
    assert "'lr0' is neither (write it as key=value" in capsys.readouterr().err
    assert main(["train", "resnet18", "data=x", "--data", "y"]) == 2
    assert "data is given twice" in capsys.readouterr().err


@pytest.mark.parametrize("words", [["train", "resnet18", "--epoch", "3"], ["train", "resnet18", "--epoch=3"],
                                   ["val", "resnet18", "--dat", "shapes"], ["list", "--ddp"]])
def test_an_abbreviated_flag_is_an_unknown_argument_with_a_suggestion(words, capsys):
    # argparse's default would read --epoch as --epochs (and --ddp as --ddp-capable) without a word.
    with pytest.raises(SystemExit) as stopped:
        main(words)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert f"unrecognized arguments: {words[2] if words[0] != 'list' else '--ddp'}" in error
    assert "did you mean --" in error


def test_a_broken_pipe_ends_quietly(tmp_path):
    import subprocess
    import sys

    from .conftest import REPO_ROOT
    from .support import script_environment

    listing = subprocess.run(f"{sys.executable} -m zoo_core.cli list | head -1", shell=True, capture_output=True, text=True,
                             env=script_environment(), cwd=REPO_ROOT, timeout=120)
    assert listing.stdout.startswith("FAMILY") and "Traceback" not in listing.stderr and "BrokenPipe" not in listing.stderr


def test_export_writes_a_libreyolo_checkpoint_and_says_where(tmp_path, capsys):
    import torch

    target = tmp_path / "resnet18-for-libreyolo.pt"
    assert main(["export", "resnet18", "--format", "libreyolo", "--output", str(target)]) == 0
    assert f"exported libreyolo: {target}" in capsys.readouterr().out
    checkpoint = torch.load(target, weights_only=True)
    assert (checkpoint["schema_version"], checkpoint["model_family"], checkpoint["size"]) == ("1.0", "resnet", "18")


def test_info_says_where_a_family_runs_in_channels_last(capsys):
    assert main(["info", "yolo9"]) == 0
    assert "memory:    channels-last on a CPU" in capsys.readouterr().out
    assert main(["info", "rtdetr"]) == 0
    assert "channels-last" not in capsys.readouterr().out


def test_train_on_several_devices_starts_the_workers_before_building_the_model(monkeypatch, capsys):
    """The forkserver's imports overlap the command's own; not for one device or under torchrun; a bad device stops first."""
    import zoo_core.cli
    import zoo_core.engine.launcher

    calls: list[str] = []

    def build_model(name):
        calls.append("model")
        raise RuntimeError("stop here")  # main() reports it as one line

    monkeypatch.setattr(zoo_core.engine.launcher, "start_worker_server",
                        lambda modules: calls.append(f"workers {'zoo_core.tasks.metrics' in modules}"))  # validates
    monkeypatch.setattr(zoo_core.cli, "_model", build_model)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for device, expected in (("cpu,cpu", ["workers True", "model"]), ("cpu", ["model"])):
        calls.clear()
        assert main(["train", "resnet18", "--data", "shapes", "--device", device]) == 1
        assert calls == expected, device
    calls.clear()
    assert main(["train", "resnet18", "--data", "shapes", "--device", "cpu,cpu", "val=false"]) == 1
    assert calls == ["workers False", "model"]  # a run that never validates does not import the metrics
    calls.clear()
    capsys.readouterr()
    assert main(["train", "resnet18", "--data", "shapes", "--device", "cpu,,cpu"]) == 2
    assert calls == [] and "accepted forms" in capsys.readouterr().err  # before the model's seconds of building
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    calls.clear()
    main(["train", "resnet18", "--data", "shapes", "--device", "cpu,cpu"])
    assert calls == ["model"]  # torchrun started the ranks already


def _checkpoint_epoch(path: str) -> int:
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=True)["epoch"])


def test_zoo_train_resumes_in_every_form_ultralytics_users_type(tmp_path, capsys):
    from .support import use_test_families, write_class_folders

    use_test_families()
    data = write_class_folders(tmp_path / "data", per_class=4, val_per_class=2, size=16)
    # time= stops every run after one epoch of ten, as an interruption would: each resume then trains one more.
    assert main(["train", "tinynet-s", f"data={data}", "epochs=10", "time=1e-9", "imgsz=16", "batch=8", "device=cpu",
                 "workers=0", "val=false", "plots=false", "verbose=false"]) == 0
    last = "runs/classify/train/weights/last.pt"
    forms = [
        ["train", f"resume={last}"],
        ["train", "--resume", last],
        ["train", last, "resume=true"],
        ["train", "resume=true"],  # no model: the newest run under runs/
        ["train", "--resume"],
        ["train", "--resume", "workers=0"],  # the flag alone, then a key=value argument
    ]
    for expected_epoch, words in enumerate(forms, start=1):
        capsys.readouterr()
        assert main(words) == 0, f"{words}: {capsys.readouterr().err}"
        assert "run directory: runs/classify/train " in capsys.readouterr().out, words  # the same run, continued
        assert _checkpoint_epoch(last) == expected_epoch, words


def test_zoo_train_resume_true_with_no_run_says_where_it_looked(capsys):
    assert main(["train", "resume=true"]) == 2
    error = capsys.readouterr().err
    assert "resume=true without a model continues the newest run under runs/" in error and "resume=runs/" in error
    assert main(["train"]) == 2
    assert "zoo train needs a model" in capsys.readouterr().err


def test_train_help_lists_every_training_argument_with_its_default(capsys):
    from zoo_core.engine.config import TrainConfig

    with pytest.raises(SystemExit) as exited:
        main(["train", "--help"])
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    listed = {line.split()[0] for line in printed.splitlines() if line.startswith("    ") and not line.startswith("     ")}
    assert set(TrainConfig.model_fields) <= listed, set(TrainConfig.model_fields) - listed
    assert "  optimisation:" in printed and "  augmentation" in printed
    lines = {line.split()[0]: line for line in printed.splitlines() if line.startswith("    ")}
    assert lines["epochs"].split()[1] == "100" and lines["data"].split()[1] == "required"
    assert all(TrainConfig.model_fields[name].description for name in TrainConfig.model_fields)
