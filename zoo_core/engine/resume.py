"""Resuming a run (DESIGN.md E16): finding the checkpoint and restoring the run's arguments.

A training checkpoint (``weights/last.pt``) holds the model, the EMA, optimizer and scheduler
states, the epoch, the best fitness, the history and the run's arguments. Resuming continues in
the run's own directory with the same arguments; only where it runs may change.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo_core.engine.config import RESUME_OVERRIDABLE, TrainConfig
from zoo_core.errors import ResumeError

if TYPE_CHECKING:
    from zoo_core.facade import LibreYOLO

__all__ = ["find_resume_checkpoint", "read_training_checkpoint", "config_for_resume"]


def find_resume_checkpoint(libre: "LibreYOLO", resume: Any, project: str | Path = "runs") -> Path | None:
    """The checkpoint ``resume=`` points at: a path, or (True) the model's own ``last.pt`` or the newest run's."""
    if resume in (False, None, "", "false", "False"):
        return None
    if isinstance(resume, (str, Path)) and str(resume) not in ("true", "True"):
        path = Path(resume)
        if not path.is_file():
            raise ResumeError(f"resume={str(resume)!r}: no such checkpoint file; give the path of a run's weights/last.pt")
        return path
    if resume is not True and str(resume) not in ("true", "True"):
        raise ResumeError(f"resume={resume!r}: use True (continue the model's own or the newest run) or a path to a last.pt")
    if libre.weights_path is not None and libre.weights_path.suffix == ".pt":
        return libre.weights_path
    candidates = sorted(Path(project).glob(f"{libre.task}/*/weights/last.pt"), key=lambda path: path.stat().st_mtime)
    if not candidates:
        raise ResumeError(
            f"resume=True found no checkpoint: {libre!r} was not loaded from a last.pt and "
            f"{Path(project) / libre.task}/*/weights/last.pt matches nothing; pass resume='path/to/last.pt'"
        )
    return candidates[-1]


def read_training_checkpoint(path: Path) -> dict[str, Any]:
    """A training checkpoint (``weights_only=True``); ``ResumeError`` if it cannot be resumed."""
    from zoo_core.weights import read_checkpoint

    _, _, checkpoint = read_checkpoint(path)
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
