"""The MLflow and Weights & Biases loggers against the real packages: a local MLflow store, W&B offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo_core.facade import LibreYOLO

from .support import alive, children_of, use_test_families, write_class_folders

mlflow = pytest.importorskip("mlflow")
pytestmark = pytest.mark.timeout(240)

FAST = dict(epochs=2, batch=8, imgsz=32, workers=0, nbs=8, device="cpu", verbose=False)


@pytest.fixture(autouse=True)
def _families() -> None:
    use_test_families()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_class_folders(tmp_path / "data", per_class=4, val_per_class=2)


@pytest.fixture
def clean_mlflow(monkeypatch: pytest.MonkeyPatch):
    """No tracking URI or experiment from the environment or an earlier test; no run left active."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN"):
        monkeypatch.delenv(name, raising=False)
    yield
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


def _only_run(tracking_uri: str, experiment: str = "zoo"):
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no {experiment!r} experiment in {tracking_uri}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, [run.info.run_name for run in runs]
    return client, runs[0]


def test_mlflow_logs_params_metrics_per_epoch_plots_and_best_weights_to_a_local_store(data, tmp_path, clean_mlflow):
    result = LibreYOLO("tinynet-s").train(data=str(data), loggers=["csv", "mlflow"], **FAST)
    project = result.run_dir.parent.parent
    client, run = _only_run(f"sqlite:///{project / 'mlflow.db'}")
    assert run.info.run_name == result.run_dir.name and run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "2" and run.data.params["imgsz"] == "32"
    history = client.get_metric_history(run.info.run_id, "metrics/top1")
    assert [point.step for point in history] == [1, 2]
    assert history[-1].value == pytest.approx(result.history[-1]["metrics/top1"])
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"results.csv", "results.png", "args.yaml", "weights"} <= artifacts
    assert [item.path for item in client.list_artifacts(run.info.run_id, "weights")] == ["weights/best.pt"]
    # The artifacts live beside the runs, not in ./mlruns of whatever folder the user trained from.
    assert (project / "mlruns").is_dir() and not (tmp_path / "mlruns").exists()


def test_mlflow_honours_the_tracking_uri_and_logs_into_the_users_own_run(data, tmp_path, clean_mlflow, monkeypatch):
    store = f"sqlite:///{tmp_path / 'team.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "shapes-study")
    result = LibreYOLO("tinynet-s").train(data=str(data), loggers=["mlflow"], **FAST)
    assert not (result.run_dir.parent.parent / "mlflow.db").exists()
    _, run = _only_run(store, "shapes-study")
    assert run.info.status == "FINISHED"

    mlflow.set_experiment("mine")
    with mlflow.start_run(run_name="my-sweep") as mine:
        LibreYOLO("tinynet-s").train(data=str(data), loggers=["mlflow"], **FAST)
        assert mlflow.active_run().info.run_id == mine.info.run_id  # left open: it is the user's
    client, run = _only_run(store, "mine")
    assert run.info.run_id == mine.info.run_id and len(client.get_metric_history(run.info.run_id, "train/loss")) == 2


def test_mlflow_on_two_ranks_is_one_run_logged_by_rank_0(data, clean_mlflow):
    result = LibreYOLO("tinynet-s").train(data=str(data), loggers=["mlflow"], **{**FAST, "device": "cpu,cpu"})
    client, run = _only_run(f"sqlite:///{result.run_dir.parent.parent / 'mlflow.db'}")
    assert [point.step for point in client.get_metric_history(run.info.run_id, "metrics/top1")] == [1, 2]


def test_wandb_offline_logs_metrics_plots_and_the_best_weights_without_an_account(data, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))  # its artifact staging, not the user's home
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    import os

    before = set(children_of(os.getpid()))
    result = LibreYOLO("tinynet-s").train(data=str(data), loggers=["csv", "wandb"], **FAST)
    runs = list((result.run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, runs
    # The offline record is protobuf: keys and file names are stored as plain bytes.
    record = runs[0].read_bytes()
    for expected in (b"metrics/top1", b"train/loss", b"media/images/results_", b"best.pt", f"{result.run_dir.name}-best".encode()):
        assert expected in record, expected
    assert not [pid for pid in set(children_of(os.getpid())) - before if alive(pid)], "the wandb service outlived the run"
