"""Experiment-tracker loggers: MLflow and Weights & Biases (``loggers=["mlflow"]``, ``["wandb"]``).

Like every callback they run on rank 0 only (E9), so a two-rank run is one tracked run. Each logs
the run's arguments once, every epoch's ``results.csv`` row as metrics (step = epoch), and at the
end the plots and ``best.pt`` as artifacts, as Ultralytics' integrations do.

Where they write, and how to point them elsewhere:

- MLflow: ``MLFLOW_TRACKING_URI`` when set; otherwise a local store beside the run folders,
  ``<project>/mlflow.db`` (SQLite, MLflow 3's own default backend; its plain-file backend now refuses
  to start) with artifacts under ``<project>/mlruns``. ``MLFLOW_EXPERIMENT_NAME`` (default ``zoo``)
  and ``MLFLOW_RUN`` (default the run folder's name) name the experiment and run. A run you started
  yourself (``mlflow.start_run()``) is logged into and left open.
- Weights & Biases: project ``WANDB_PROJECT`` (default ``zoo``), run name the run folder's name,
  files under the run folder. ``WANDB_MODE=offline`` works without an account (``wandb sync``
  uploads later). A run you started yourself (``wandb.init()``) is logged into and left open.

A missing package is a warning naming the install command, and the run goes on without that logger.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from zoo_core.engine.callbacks import BuiltinLogger
from zoo_core.engine.train_result import EpochReport, TrainResult
from zoo_core.errors import warn

__all__ = ["MlflowLogger", "WandbLogger", "run_artifacts"]

_INSTALL = 'pip install "zoo-core[loggers]"'
# MLflow's parameter values are capped (6000 characters in MLflow 3); arguments longer than this are cut.
_PARAM_LENGTH = 500


def run_artifacts(run_dir: Path) -> list[Path]:
    """The files a tracker keeps of a finished run: its plots, results.csv, args.yaml and ``weights/best.pt``."""
    files = sorted(path for path in run_dir.iterdir()
                   if path.is_file() and path.suffix.lower() in {".png", ".jpg", ".csv", ".yaml"})
    best = run_dir / "weights" / "best.pt"
    return [*files, *([best] if best.is_file() else [])]


def _import_or_warn(package: str) -> Any:
    """The tracker's package, or None after a warning naming the install command (the run goes on without it)."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError:
        warn(f"loggers=['{package}'] needs the {package} package ({_INSTALL}); skipping it")
        return None


def _numeric_row(report: EpochReport) -> dict[str, float]:
    return {key: float(value) for key, value in report.row().items()
            if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool)}


def _tracking_uri_set_in_code() -> bool:
    """Whether the user called ``mlflow.set_tracking_uri`` in this process (MLflow has no public question for it)."""
    try:
        from mlflow.tracking._tracking_service.utils import is_tracking_uri_set
    except ImportError:
        return False
    return bool(is_tracking_uri_set())


class MlflowLogger(BuiltinLogger):
    """Logs the run to MLflow (see the module docstring for where)."""

    # The run this logger started and has not ended: a run that failed before on_train_end left it open.
    _open_run_id: str | None = None
    # The store an earlier run in this process chose (not the user: a later run may choose another).
    _uri_set_by_zoo: str | None = None

    def __init__(self) -> None:
        self.mlflow: Any = None
        self.owns_run = False

    def on_train_start(self, run_dir: Path, config: dict[str, Any]) -> None:
        mlflow = _import_or_warn("mlflow")
        if mlflow is None:
            return
        self.mlflow = mlflow
        chosen_by_user = "MLFLOW_TRACKING_URI" in os.environ or (
            _tracking_uri_set_in_code() and mlflow.get_tracking_uri() != MlflowLogger._uri_set_by_zoo)
        if not chosen_by_user:
            project = run_dir.resolve().parent.parent
            MlflowLogger._uri_set_by_zoo = f"sqlite:///{project / 'mlflow.db'}"
            mlflow.set_tracking_uri(MlflowLogger._uri_set_by_zoo)
        self._end_abandoned_run()
        active = mlflow.active_run()
        self.owns_run = active is None
        if self.owns_run:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "zoo")
            experiment = mlflow.get_experiment_by_name(name)
            if experiment is None:
                # Without an artifact location MLflow would put artifacts in ./mlruns of whatever folder the user is in.
                artifacts = (run_dir.resolve().parent.parent / "mlruns").as_uri()
                experiment_id = mlflow.create_experiment(name, artifact_location=artifacts)
            else:
                experiment_id = experiment.experiment_id
            active = mlflow.start_run(experiment_id=experiment_id, run_name=os.environ.get("MLFLOW_RUN", run_dir.name))
            MlflowLogger._open_run_id = active.info.run_id
        mlflow.log_params({key: str(value)[:_PARAM_LENGTH] for key, value in config.items()})
        mlflow.set_tag("zoo.run_dir", str(run_dir.resolve()))

    def _end_abandoned_run(self) -> None:
        active = self.mlflow.active_run()
        if active is not None and active.info.run_id == MlflowLogger._open_run_id:
            self.mlflow.end_run(status="FAILED")
        MlflowLogger._open_run_id = None

    def on_epoch_end(self, report: EpochReport) -> None:
        if self.mlflow is None:
            return
        # MLflow keys allow letters, digits and _-. :/ only.
        metrics = {re.sub(r"[^\w\-. :/]", "_", key): value for key, value in _numeric_row(report).items()}
        self.mlflow.log_metrics(metrics, step=report.epoch)

    def on_train_end(self, result: TrainResult) -> None:
        if self.mlflow is None:
            return
        for path in run_artifacts(result.run_dir):
            self.mlflow.log_artifact(str(path), artifact_path="weights" if path.suffix == ".pt" else None)
        if self.owns_run:
            self.mlflow.end_run()
            MlflowLogger._open_run_id = None


class WandbLogger(BuiltinLogger):
    """Logs the run to Weights & Biases (see the module docstring for where)."""

    def __init__(self) -> None:
        self.run: Any = None
        self.owns_run = False

    def on_train_start(self, run_dir: Path, config: dict[str, Any]) -> None:
        wandb = _import_or_warn("wandb")
        if wandb is None:
            return
        self.owns_run = wandb.run is None
        if self.owns_run:
            # finish_previous: a run that failed before on_train_end is closed instead of swallowing this one.
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "zoo"), name=run_dir.name, dir=str(run_dir),
                                  config={key: value if isinstance(value, (int, float, str, bool, type(None))) else str(value)
                                          for key, value in config.items()},
                                  job_type="training", reinit="finish_previous")
        else:
            self.run = wandb.run
            self.run.config.update({"zoo": {key: str(value) for key, value in config.items()}}, allow_val_change=True)

    def on_epoch_end(self, report: EpochReport) -> None:
        if self.run is not None:
            self.run.log(_numeric_row(report), step=report.epoch)

    def on_train_end(self, result: TrainResult) -> None:
        if self.run is None:
            return
        import wandb

        files = run_artifacts(result.run_dir)
        images = {path.stem: wandb.Image(str(path)) for path in files if path.suffix.lower() in {".png", ".jpg"}}
        if images:
            self.run.log(images)  # the step after the last epoch's: W&B drops a log at a step it has committed
        best = [path for path in files if path.suffix == ".pt"]
        if best:
            artifact = wandb.Artifact(f"{result.run_dir.name}-best", type="model")
            artifact.add_file(str(best[0]))
            self.run.log_artifact(artifact)
        if self.owns_run:
            self.run.finish()
            # The wandb service process would otherwise outlive the run in this process.
            wandb.teardown()
        self.run = None
