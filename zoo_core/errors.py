"""Exception classes raised by zoo.

Every error says what was wrong and what to do about it. The classes also inherit from the
closest built-in exception so callers that catch ``ValueError`` or ``LookupError`` keep working.
"""

from __future__ import annotations

__all__ = [
    "ZooError",
    "RegistryError",
    "PluginError",
    "UnknownFamilyError",
    "UnknownTaskError",
    "DuplicateFamilyError",
    "PluginImportError",
    "PluginHookError",
    "InvalidDeclarationError",
    "ModelNameError",
    "WeightsError",
    "WeightsNotFoundError",
    "WeightsDownloadError",
    "ChecksumMismatchError",
    "CorruptWeightsError",
    "UnsafeWeightsError",
    "WeightsMismatchError",
    "WeightsWriteError",
    "ArgumentError",
    "TrainConfigError",
    "DeviceSpecError",
    "BatchSizeError",
    "SpawnGuardError",
    "UnpicklableArgumentError",
    "SpawnNotSupportedError",
    "WorkerFailedError",
    "HostExchangeError",
    "MasterPortInUseError",
    "TrainingDivergedError",
    "ResumeError",
    "ExportError",
]


class ZooError(Exception):
    """Base class of every error zoo raises on purpose."""


class RegistryError(ZooError, ValueError):
    """registry.yaml (or a plugin's declaration) does not match the schema."""


class PluginError(ZooError):
    """Base class of plugin discovery, loading and hook errors."""


class UnknownFamilyError(PluginError, LookupError):
    """A family name that no loaded plugin declares."""

    def __str__(self) -> str:  # LookupError would repr() the message otherwise
        return str(self.args[0]) if self.args else ""


class UnknownTaskError(PluginError, LookupError):
    """A task name that neither zoo nor a loaded plugin declares."""

    def __str__(self) -> str:  # LookupError would repr() the message otherwise
        return str(self.args[0]) if self.args else ""


class DuplicateFamilyError(PluginError):
    """Two plugins declare the same family name."""


class PluginImportError(PluginError, ImportError):
    """A plugin's module raised while being imported."""


class PluginHookError(PluginError):
    """A plugin implements a hook that does not exist (usually a misspelling) or with wrong arguments."""


class InvalidDeclarationError(PluginError, RegistryError):
    """A plugin's family declaration does not match the registry schema."""


class ModelNameError(ZooError, ValueError):
    """A model name that resolves to no family and size of the registry."""


class WeightsError(ZooError):
    """Base class of errors about weights files."""


class WeightsNotFoundError(WeightsError, FileNotFoundError):
    """A weights file that does not exist and cannot be downloaded."""


class WeightsDownloadError(WeightsError, OSError):
    """Downloading registry weights failed (offline, server down, HTTP error)."""


class ChecksumMismatchError(WeightsError):
    """A downloaded file whose sha256 differs from the registry's."""


class CorruptWeightsError(WeightsError):
    """A weights file that is truncated or not in the format its suffix claims."""


class UnsafeWeightsError(WeightsError):
    """A ``.pt`` file that is not a plain state dict or zoo checkpoint (weights_only refused it)."""


class WeightsMismatchError(WeightsError):
    """Weights whose tensors do not fit the model they are loaded into (another family or size)."""


class WeightsWriteError(WeightsError, OSError):
    """Writing a weights file failed (a full disk, no permission); the previous file is left as it was."""


class ArgumentError(ZooError, ValueError):
    """An argument of ``val``, ``predict`` or ``export`` with a bad value (the message names it and the accepted values)."""


class TrainConfigError(ZooError, ValueError):
    """A training argument that is unknown or has a bad value (the message names the key)."""


class DeviceSpecError(ZooError, ValueError):
    """A ``device`` argument that is not one of the accepted forms."""


class BatchSizeError(ZooError, ValueError):
    """A global batch that cannot be split evenly over the ranks (E5, docs/architecture.md)."""


class SpawnGuardError(ZooError, RuntimeError):
    """Training on several devices was started from inside a spawned worker: a missing ``__main__`` guard."""


class UnpicklableArgumentError(ZooError, TypeError):
    """An argument for the training workers that cannot be pickled, or unpickled in a worker (E4, E20)."""


class SpawnNotSupportedError(ZooError, RuntimeError):
    """A family whose plugin does not support spawning, given several devices outside torchrun (E13)."""


class WorkerFailedError(ZooError, RuntimeError):
    """A training worker raised or died; the message names the rank and carries its traceback (E14)."""

    def __init__(self, message: str, *, rank: int | None = None, worker_traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.worker_traceback = worker_traceback


class HostExchangeError(ZooError, RuntimeError):
    """CPU SyncBatchNorm's exchange between the ranks of one machine failed: a peer exited, stalled or diverged."""


class MasterPortInUseError(ZooError, OSError):
    """The rendezvous port given by the user is taken by another process."""


class TrainingDivergedError(ZooError, FloatingPointError):
    """The training loss became NaN or infinite."""


class ResumeError(ZooError, ValueError):
    """``resume=`` points at nothing resumable (the message says what was found)."""


class ExportError(ZooError, RuntimeError):
    """A model that cannot be written as an ONNX or TorchScript graph (the message names the model and the operator)."""
