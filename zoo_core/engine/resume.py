"""Resuming a run (E16): finding the checkpoint and restoring the run's arguments and model.

A training checkpoint (``weights/last.pt``) holds the model, the EMA, the optimizer state, the
epoch and iteration, the best fitness, the history and the run's arguments. Resuming continues
in the run's own directory with the same arguments; only where it runs may change.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from zoo_core.engine.config import RESUME_OVERRIDABLE, TrainConfig
from zoo_core.engine.spec import ModelSpec
from zoo_core.errors import ResumeError, ZooError
from zoo_core.settings import runs_dir
from zoo_core.weights import LEAN_KEY, ModelMeta, read_checkpoint

__all__ = [
    "find_resume_checkpoint",
    "newest_checkpoint",
    "read_training_checkpoint",
    "config_for_resume",
    "spec_for_resume",
    "elastic_run_identity",
    "find_elastic_checkpoint",
]

_TRUE = ("true", "True")


def find_resume_checkpoint(spec: ModelSpec, resume: Any, project: str | Path | None = None) -> Path | None:
    """The checkpoint ``resume=`` points at: a path, or (True) the model's own ``last.pt`` or the newest fitting run's.

    With ``resume=True`` only a run of the same family and size fits; a newer run of another
    model is named in the error rather than resumed.
    """
    project = Path(project) if project is not None else runs_dir()
    if resume in (False, None, "", "false", "False"):
        return None
    if isinstance(resume, (str, Path)) and str(resume) not in _TRUE:
        path = Path(resume)
        if path.is_dir():
            raise ResumeError(f"resume={str(resume)!r} is a directory; give the path of a run's weights/last.pt")
        if not path.is_file():
            raise ResumeError(f"resume={str(resume)!r}: no such checkpoint file; give the path of a run's weights/last.pt")
        return path
    if resume is not True and str(resume) not in _TRUE:
        raise ResumeError(f"resume={resume!r}: use True (continue the model's own or the newest run) or a path to a last.pt")
    if spec.source is not None and spec.source.suffix == ".pt":
        return spec.source
    pattern = Path(project) / spec.task / "*" / "weights" / "last.pt"
    candidates = sorted(Path(project).glob(f"{spec.task}/*/weights/last.pt"), key=lambda path: path.stat().st_mtime, reverse=True)
    if not candidates:
        raise ResumeError(
            f"resume=True found no checkpoint: the {spec.name} model was not loaded from a last.pt and "
            f"{pattern} matches nothing; pass resume='path/to/last.pt'"
        )
    others = []
    for candidate in candidates:
        meta = _meta_of(candidate)
        if meta is not None and (meta.family, meta.size) == (spec.family, spec.size):
            return candidate
        others.append(f"{candidate} ({f'{meta.family}-{meta.size}' if meta else 'unreadable'})")
    raise ResumeError(
        f"resume=True looks for the newest run of {spec.name} under {Path(project) / spec.task}, but the runs there "
        f"hold other models: {', '.join(others[:3])}. Pass resume='path/to/last.pt' of a {spec.name} run, or start "
        "a new run (resume=False)"
    )


def newest_checkpoint(project: str | Path | None = None) -> Path:
    """The newest ``weights/last.pt`` of any run under ``project`` (``zoo train resume=true`` without a model)."""
    project = Path(project) if project is not None else runs_dir()
    candidates = sorted(Path(project).glob("*/*/weights/last.pt"), key=lambda path: path.stat().st_mtime, reverse=True)
    if not candidates:
        raise ResumeError(
            f"resume=true without a model continues the newest run under {project}/, but {Path(project) / '*' / '*'}"
            "/weights/last.pt matches nothing; give the checkpoint (zoo train resume=runs/detect/train/weights/last.pt) "
            "or run from the folder that holds runs/"
        )
    return candidates[0]


def _meta_of(path: Path) -> ModelMeta | None:
    try:
        return read_checkpoint(path)[1]
    except ZooError:
        return None


def read_training_checkpoint(path: Path) -> dict[str, Any]:
    """A training checkpoint (``weights_only=True``); ``ResumeError`` if it cannot be resumed."""
    _, _, checkpoint = read_checkpoint(path)
    if checkpoint.get(LEAN_KEY):
        last = Path(path).with_name("last.pt")
        where = str(last) if last.is_file() else "the run's weights/last.pt"
        raise ResumeError(
            f"{path} is the final best.pt of a finished run, kept lean (its weights in half precision, without the "
            f"optimizer state a resume needs), so it cannot be resumed. Resume from {where}: "
            f"LibreYOLO({where!r}).train(resume=True), or fine-tune from it as a new run: LibreYOLO({str(path)!r}).train(data=...)"
        )
    missing = [key for key in ("optimizer", "epoch", "config", "train_model", "run_dir") if key not in checkpoint]
    if missing:
        raise ResumeError(f"{path} is not a resumable training checkpoint (missing {', '.join(missing)}); resume from a run's weights/last.pt")
    return checkpoint


def config_for_resume(path: Path, kwargs: dict[str, Any]) -> TrainConfig:
    """The checkpoint's arguments, with the few a resume may change (device, workers...) taken from ``kwargs``."""
    checkpoint = read_training_checkpoint(path)
    saved = dict(checkpoint["config"])
    changed = [key for key, value in kwargs.items() if key not in RESUME_OVERRIDABLE and saved.get(key, value) != value]
    if changed:
        raise ResumeError(
            f"resume continues the run with its saved arguments; {', '.join(map(repr, changed))} differ. "
            f"Only {', '.join(sorted(RESUME_OVERRIDABLE))} may change when resuming"
        )
    overrides = {key: value for key, value in kwargs.items() if key in RESUME_OVERRIDABLE}
    config = TrainConfig.build({**saved, **overrides, "resume": str(path)}, source=str(path))
    if int(checkpoint["epoch"]) + 1 >= config.epochs:
        raise ResumeError(f"{path} finished all {config.epochs} epochs; nothing to resume. Start a new run (resume=False) to train further")
    return config


def spec_for_resume(path: Path, spec: ModelSpec) -> ModelSpec:
    """The model the checkpoint at ``path`` continues; ``ResumeError`` if it is another family or size than ``spec``."""
    _, meta, _ = read_checkpoint(path)
    if meta is None:
        raise ResumeError(f"{path} carries no model metadata; resume from a run's weights/last.pt written by zoo")
    if (meta.family, meta.size) != (spec.family, spec.size):
        raise ResumeError(
            f"{path} is a checkpoint of {meta.family}-{meta.size}, not of {spec.name}; resume it with "
            f"LibreYOLO({str(path)!r}).train(resume=True), or pass the last.pt of a {spec.name} run"
        )
    return ModelSpec.from_meta(meta, source=path)


def elastic_run_identity() -> str | None:
    """Which torchrun invocation this process belongs to, the same after an elastic restart; None outside one.

    torchrun's rendezvous id (``--rdzv-id``; a fresh uuid with ``--standalone``) when it has one,
    else this node's elastic agent (host and process id), which survives the restart of its workers.
    """
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return None
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return f"rdzv:{run_id}"
    return f"agent:{socket.gethostname()}:{os.getppid()}"


def find_elastic_checkpoint(spec: ModelSpec, project: str | Path | None = None) -> Path | None:
    """After an elastic restart: the ``last.pt`` this torchrun invocation wrote before it restarted, if any.

    Only checkpoints stamped with this invocation's ``elastic_run_identity`` count, so a restart
    never resumes an older, unrelated run of the same model.
    """
    project = Path(project) if project is not None else runs_dir()
    identity = elastic_run_identity()
    if identity is None:
        return None
    import torch

    candidates = sorted(Path(project).glob(f"{spec.task}/*/weights/last.pt"), key=lambda path: path.stat().st_mtime, reverse=True)
    for candidate in candidates:
        try:
            stamp = torch.load(candidate, map_location="cpu", weights_only=True, mmap=True).get("elastic_run")
        except Exception:  # noqa: BLE001 - an unreadable file is simply not this run's
            continue
        if stamp == identity:
            return candidate
    return None
