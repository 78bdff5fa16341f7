"""Checkpoint writing off the training thread (E16, docs/architecture.md: atomic, never half a file).

The training thread takes a snapshot (every tensor copied to the CPU, so training may go on
changing the originals); a background thread serialises it and writes it: temp file, fsync,
``os.replace``, then hard links for ``best.pt``/``epochN.pt``. Serialisation and disk time
(hundreds of MB for large models) overlap the next epoch.

When training ends, ``write_lean_best`` rewrites ``best.pt`` as the file people deploy: the
(EMA) weights in half precision and the run's facts, without the optimizer state or the second
copy of the weights that only a resume needs (``last.pt`` keeps them). docs/multi-gpu.md
("Checkpoints") has the sizes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from zoo_core.weights import DIGEST_KEY, LEAN_KEY, atomic_link_or_copy, atomic_torch_save, read_checkpoint, weights_digest

__all__ = ["CheckpointWriter", "snapshot", "LEAN_KEPT", "half_precision", "lean_checkpoint", "write_lean_best"]

#: What a lean ``best.pt`` keeps of a training checkpoint besides its weights: the facts about the run that
#: are small (which epoch, its metrics, the arguments), as Ultralytics keeps ``train_args`` and ``train_metrics``.
LEAN_KEPT = ("meta", "epoch", "best_epoch", "best_fitness", "best_metrics", "config", "run_dir")
_HALF_MAX = float(torch.finfo(torch.float16).max)


def snapshot(value: Any, _copies: dict[int, torch.Tensor] | None = None) -> Any:
    """A copy of ``value`` whose tensors are detached CPU copies (containers copied, scalars shared).

    A tensor reached twice is copied once, so torch.save still stores it once.
    """
    copies = {} if _copies is None else _copies
    if isinstance(value, torch.Tensor):
        if id(value) not in copies:
            copies[id(value)] = value.detach().to("cpu", copy=True)
        return copies[id(value)]
    if isinstance(value, dict):
        return {key: snapshot(item, copies) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(item, copies) for item in value)
    return value


class CheckpointWriter:
    """One background write at a time; ``wait()`` re-raises a failed write on the training thread."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, checkpoint: dict[str, Any], last: Path, also: list[Path]) -> None:
        """Write ``checkpoint`` (a ``snapshot``) to ``last`` atomically, then link each path of ``also`` to it."""
        self.wait()

        def write() -> None:
            try:
                if isinstance(checkpoint.get("meta"), dict) and isinstance(checkpoint.get("model"), dict):
                    # A checksum of the deployable weights, checked whenever the file is loaded.
                    checkpoint["meta"] = {**checkpoint["meta"], DIGEST_KEY: weights_digest(checkpoint["model"])}
                atomic_torch_save(checkpoint, last)
                for path in also:
                    atomic_link_or_copy(last, path)
            except BaseException as error:  # surfaced by wait()
                self._error = error

        self._thread = threading.Thread(target=write, name="zoo-checkpoint-writer", daemon=False)
        self._thread.start()

    def wait(self, *, raise_error: bool = True) -> None:
        """Block until the pending write is on disk; raise its error if it failed (unless ``raise_error`` is False)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            if raise_error:
                raise error


def half_precision(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` with its float32/float64 tensors in float16, where every finite value fits.

    A tensor with a finite value beyond float16's range (65504: a large running variance, a
    position table) keeps its dtype, since float16 would turn it into an infinity; integer
    tensors (``num_batches_tracked``) are kept as they are.
    """
    lean = {}
    for key, tensor in state_dict.items():
        if tensor.dtype in (torch.float32, torch.float64) and tensor.numel():
            finite = tensor[tensor.isfinite()]
            if not finite.numel() or float(finite.abs().max()) <= _HALF_MAX:
                tensor = tensor.to(torch.float16)
        lean[key] = tensor
    return lean


def lean_checkpoint(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The deployable part of training ``checkpoint``: its ``model`` weights in half precision and ``LEAN_KEPT``.

    The ``meta`` digest is recomputed over the half-precision tensors, so loading checks them as before.
    """
    model = half_precision(dict(checkpoint["model"]))
    lean: dict[str, Any] = {key: checkpoint[key] for key in LEAN_KEPT if key in checkpoint}
    lean["model"] = model
    lean[LEAN_KEY] = True
    if isinstance(lean.get("meta"), dict):
        lean["meta"] = {**lean["meta"], DIGEST_KEY: weights_digest(model)}
    return lean


def write_lean_best(path: Path) -> Path:
    """Replace the training checkpoint at ``path`` (a run's ``best.pt``) by its ``lean_checkpoint``, atomically.

    ``best.pt`` may be a hard link to ``last.pt``; the atomic replace gives ``best.pt`` a new
    file, so ``last.pt`` stays whole and resumable.
    """
    _, _, checkpoint = read_checkpoint(path)  # the digest is checked: a damaged file is not made lean
    if checkpoint.get(LEAN_KEY):
        return path
    return atomic_torch_save(lean_checkpoint(checkpoint), path)
