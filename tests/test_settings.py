"""`zoo settings`: show, set and reset the settings file, and every command honouring it (runs, weights and
datasets folders, default loggers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zoo_core.cli import main
from zoo_core.settings import SettingsError, load_settings, settings_path, update_settings


def test_settings_show_their_defaults_without_a_file(capsys):
    assert not settings_path().exists()
    assert main(["settings", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == {"path": str(settings_path()), "runs_dir": "runs", "weights_dir": None, "datasets_dir": None,
                     "loggers": ["csv"]}


def test_settings_set_show_and_reset_from_the_command_line(tmp_path, capsys):
    assert main(["settings", f"runs_dir={tmp_path / 'elsewhere'}", "loggers=csv,tensorboard"]) == 0
    output = capsys.readouterr().out
    assert f'"{tmp_path / "elsewhere"}"  (set)' in output and '["csv", "tensorboard"]  (set)' in output
    assert load_settings().runs_dir == str(tmp_path / "elsewhere") and load_settings().loggers == ["csv", "tensorboard"]
    assert "weights_dir" not in settings_path().read_text()  # only what differs from the defaults is written
    assert main(["settings", "reset"]) == 0
    assert "settings reset to the defaults" in capsys.readouterr().out
    assert load_settings().runs_dir == "runs" and load_settings().loggers == ["csv"]


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["rnus_dir=x"], r"not a setting: 'rnus_dir' \(did you mean 'runs_dir'\?\)"),
        (["loggers=comet"], r"loggers.0: Input should be 'csv', 'tensorboard', 'mlflow' or 'wandb'"),
        (["reset", "runs_dir=x"], r"reset takes no other word"),
        (["runs_dir"], r"is not key=value"),
    ],
)
def test_a_bad_setting_is_refused_by_name_and_writes_nothing(words, message, capsys):
    assert main(["settings", *words]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not settings_path().exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("runs_dir: [1\n", r"not valid YAML"),
        ("- runs\n", r"must hold a mapping of settings"),
        ("runs: x\n", r"runs is not a setting \(known: runs_dir"),
    ],
)
def test_a_damaged_settings_file_names_itself_and_the_fix(content, message):
    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text(content, encoding="utf-8")
    with pytest.raises(SettingsError, match=message) as caught:
        load_settings()
    assert str(settings_path()) in str(caught.value) and "zoo settings reset" in str(caught.value)
    assert main(["settings", "reset"]) == 0 and load_settings().runs_dir == "runs"


def test_training_validation_and_prediction_write_into_the_runs_dir_setting(tmp_path, capsys):
    from .support import use_test_families, write_class_folders

    use_test_families()
    data = write_class_folders(tmp_path / "data", per_class=4, val_per_class=2, size=16)
    update_settings({"runs_dir": str(tmp_path / "my_runs"), "loggers": ["csv", "tensorboard"]})
    assert main(["train", "tinynet-s", f"data={data}", "epochs=1", "imgsz=16", "batch=8", "device=cpu", "workers=0",
                 "plots=false", "verbose=false"]) == 0
    run = tmp_path / "my_runs" / "classify" / "train"
    assert (run / "weights" / "best.pt").is_file() and not (tmp_path / "runs").exists()
    assert (run / "results.csv").is_file() and list(run.glob("events.out.tfevents.*")), "the default loggers were not both used"
    assert main(["predict", str(run / "weights" / "best.pt"), str(data / "val" / "c0"), "--save"]) == 0
    assert len(list((tmp_path / "my_runs" / "classify" / "predict").iterdir())) == 2
    # An argument given to the command wins over the setting.
    assert main(["predict", str(run / "weights" / "best.pt"), str(data / "val" / "c0"), "--save", "--project",
                 str(tmp_path / "given")]) == 0
    assert (tmp_path / "given" / "classify" / "predict").is_dir()


def test_resume_true_without_a_model_looks_in_the_runs_dir_setting(tmp_path, capsys):
    update_settings({"runs_dir": str(tmp_path / "my_runs")})
    assert main(["train", "resume=true"]) == 2
    assert f"continues the newest run under {tmp_path / 'my_runs'}/" in capsys.readouterr().err


def test_shapes_and_published_weights_use_the_folder_settings(tmp_path):
    from zoo_core.data.shapes import materialize_shapes
    from zoo_core.published_weights import hub_cache_dir, weights_dir

    update_settings({"datasets_dir": str(tmp_path / "datasets"), "weights_dir": str(tmp_path / "weights")})
    folder = materialize_shapes("shapes:train=2,val=1,size=32")
    assert folder.parent == tmp_path / "datasets" and (folder / "detect.yaml").is_file()
    assert weights_dir() == tmp_path / "weights" and hub_cache_dir() == tmp_path / "weights" / "hub"
    update_settings({"datasets_dir": "~/zoo-datasets"})  # a home-relative folder, as users write it
    from zoo_core.settings import datasets_dir

    assert datasets_dir() == Path("~/zoo-datasets").expanduser()
