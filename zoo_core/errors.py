"""Exception and warning classes raised by zoo, and ``warn``, the one way zoo emits a warning.

Every error says what was wrong and what to do about it. The classes also inherit from the
closest built-in exception so callers that catch ``ValueError`` or ``LookupError`` keep working.

Warnings point at the user's call: ``warn`` gives ``warnings`` the stack level of the first frame
outside zoo, its plugins, torch and the standard library (the line of a script or notebook that
called ``train()``). Where there is none (a training worker, whose stack ends in
``torch/multiprocessing`` or the forkserver; the ``zoo`` command) a ``ZooWarning`` is printed as
``zoo: Category: message`` with no file, line or source line: ``warnings`` would otherwise echo a
line of zoo's own source, or of torch's, that says nothing to the user.
"""

from __future__ import annotations

import os
import reprlib
import sys
import sysconfig
import warnings

__all__ = [
    "excerpt",
    "warn",
    "ZooWarning",
    "TrainingWarning",
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
    "WeightsNotPublishedError",
    "WeightsDownloadError",
    "WeightsOfflineError",
    "IncompleteDownloadError",
    "UnexpectedContentError",
    "HubAccessError",
    "HubReferenceError",
    "ChecksumMismatchError",
    "CorruptWeightsError",
    "UnsafeWeightsError",
    "WeightsMismatchError",
    "WeightsWriteError",
    "ArgumentError",
    "TrackerConfigError",
    "TrainConfigError",
    "DeviceSpecError",
    "BatchSizeError",
    "SpawnGuardError",
    "UnpicklableArgumentError",
    "SpawnNotSupportedError",
    "WorkerFailedError",
    "PeerFailedError",
    "HostExchangeError",
    "MasterPortInUseError",
    "TrainingDivergedError",
    "ResumeError",
    "RunDirectoryError",
    "RunDirectoryInUseError",
    "ExportError",
]

# How messages quote a value the user gave: never more than a few levels, items and characters. A
# plain ``{value!r}`` of a YAML "billion laughs" (aliases of aliases, a few hundred bytes on disk)
# expands to gigabytes; reprlib stops at each limit and writes "..." instead.
_QUOTE = reprlib.Repr()
_QUOTE.maxlevel = 3
_QUOTE.maxdict = _QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxset = _QUOTE.maxfrozenset = _QUOTE.maxdeque = 4
_QUOTE.maxstring = _QUOTE.maxother = 60
_QUOTE.maxlong = 40
EXCERPT_CHARACTERS = 100


def excerpt(value: object, limit: int = EXCERPT_CHARACTERS) -> str:
    """``repr(value)`` bounded in depth, items and characters (at most ``limit``), for error messages.

    The cost is bounded too: however large or deeply shared ``value`` is, only the first few items
    of the first few levels are looked at.
    """
    try:
        text = _QUOTE.repr(value)
    except Exception:  # noqa: BLE001 - a value whose __repr__ raises is still named by its type
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


class WeightsNotPublishedError(WeightsNotFoundError):
    """A model whose weights nobody publishes (the registry declares none, or the server answers 404).

    The message names the alternatives: train the registry name from scratch, or pass a local file.
    """


class WeightsDownloadError(WeightsError, OSError):
    """Downloading registry weights failed (offline, server down, HTTP error)."""


class WeightsOfflineError(WeightsDownloadError):
    """Published weights that are not in the cache while the network is off (``HF_HUB_OFFLINE=1``) or unreachable.

    The message names the file, its URL, the cache folder and where to put the file by hand.
    """


class IncompleteDownloadError(WeightsDownloadError):
    """A download that ended before the whole file arrived (a cut connection that did not resume); nothing is kept."""


class UnexpectedContentError(WeightsDownloadError):
    """The server sent something other than the weights file: an HTML page (a proxy, a login wall) or a non-Hub answer."""


class HubAccessError(WeightsDownloadError):
    """The Hugging Face Hub refused access to a repository (gated or private): a token (``HF_TOKEN``) is needed."""


class HubReferenceError(WeightsError, ValueError):
    """An ``hf://owner/repo[@revision][/file]`` reference that is malformed or names no single weights file."""


class ChecksumMismatchError(WeightsError):
    """A downloaded file whose sha256 differs from the registry's pin or from the digest its server declares."""


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


class TrackerConfigError(ZooError, ValueError):
    """A tracker YAML or tracker argument zoo cannot use (unknown key, value out of range, missing file)."""


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


class PeerFailedError(ZooError, RuntimeError):
    """This rank stopped because another rank failed first (the launcher blames the rank that failed, not this one)."""


class HostExchangeError(ZooError, RuntimeError):
    """CPU SyncBatchNorm's exchange between the ranks of one machine failed: a peer exited, stalled or diverged."""


class MasterPortInUseError(ZooError, OSError):
    """The rendezvous port given by the user is taken by another process."""


class TrainingDivergedError(ZooError, FloatingPointError):
    """The training loss became NaN or infinite."""


class ResumeError(ZooError, ValueError):
    """``resume=`` points at nothing resumable (the message says what was found)."""


class RunDirectoryError(ZooError, OSError):
    """A run folder that cannot be created or written (a read-only ``project``); the message names the folder."""


class RunDirectoryInUseError(RunDirectoryError):
    """Another live training run holds the run folder (same ``project``/``name`` with ``exist_ok=True``, or a
    ``resume`` of a run that is still training); the message names the folder and that process."""


class ExportError(ZooError, RuntimeError):
    """A model that cannot be written as an ONNX or TorchScript graph (the message names the model and the operator)."""


class ZooWarning(UserWarning):
    """Base class of the warnings zoo emits (through ``warn``); a ``UserWarning``, so filters on that keep working."""


class TrainingWarning(ZooWarning):
    """A training setting that works but is likely not what was meant (a small per-rank batch without SyncBatchNorm)."""


# Where zoo and the standard library live: a frame in any of these is not the user's call; nor is the
# console-script folder, which holds the ``zoo`` command's launcher. Torch and zoo's plugins (top-level
# packages named zoo_*) are recognised by module name in _is_internal.
_ZOO_ROOT = os.path.dirname(os.path.abspath(__file__))
_INTERNAL_PREFIXES = tuple(
    os.path.join(os.path.abspath(path), "") for path in {
        _ZOO_ROOT,
        sysconfig.get_paths().get("stdlib", ""),
        sysconfig.get_paths().get("platstdlib", ""),
        sysconfig.get_paths().get("scripts", ""),
    } if path
)
_PLUGIN_PREFIX = "zoo_"
_USER_FRAME_NOT_FOUND = 0


def _is_internal(filename: str, module: str) -> bool:
    """Whether a frame of ``filename`` (module ``module``) is zoo's, a zoo plugin's, torch's or Python's own."""
    if filename.startswith("<"):
        # "<frozen importlib._bootstrap>" is Python's, and "<string>" too: the forkserver's `python -c` that
        # starts every training worker. "<stdin>" and an old IPython's "<ipython-input-...>" are the user's.
        return not filename.startswith(("<stdin>", "<ipython-input"))
    if os.path.abspath(filename).startswith(_INTERNAL_PREFIXES):
        return True
    # By module name, not path: a user's own folder may well be called zoo_experiments or torch_stuff.
    package = module.partition(".")[0]
    return package == "torch" or (package.startswith(_PLUGIN_PREFIX) and module != "__main__")


def _user_stacklevel() -> int:
    """The ``stacklevel`` (as seen from ``warn``'s caller) of the first frame outside zoo, or 0 when there is none."""
    frame = sys._getframe(2)  # warn()'s caller: level 1
    level = 1
    while frame is not None:
        if not _is_internal(frame.f_code.co_filename, str(frame.f_globals.get("__name__", ""))):
            return level
        frame, level = frame.f_back, level + 1
    return _USER_FRAME_NOT_FOUND


def warn(message: str, category: type[Warning] = ZooWarning) -> None:
    """Emit ``message`` as a ``category`` warning at the user's call, or without a location where there is none."""
    level = _user_stacklevel()
    if level != _USER_FRAME_NOT_FOUND:
        warnings.warn(message, category, stacklevel=level + 1)
        return
    # No user frame: no file and line to point at. Line 0 of "zoo" has no source to echo; the formatter
    # below prints it as "zoo: Category: message". The module name keys warnings' once-per-location filter.
    warnings.warn_explicit(message, category, filename="zoo", lineno=0, module="zoo",
                           registry=_NO_LOCATION_REGISTRY)


_NO_LOCATION_REGISTRY: dict = {}
_plain_formatwarning = warnings.formatwarning


def _format_zoo_warning(message, category, filename, lineno, line=None):  # noqa: ANN001 - warnings' own signature
    """``zoo: Category: message`` for a location-less zoo warning; every other warning as ``warnings`` formats it."""
    if filename == "zoo" and lineno == 0 and isinstance(category, type) and issubclass(category, ZooWarning):
        return f"zoo: {category.__name__}: {message}\n"
    return _plain_formatwarning(message, category, filename, lineno, line)


# Installed once, when zoo is imported; it changes nothing for warnings that are not zoo's location-less ones.
if getattr(warnings.formatwarning, "__name__", "") != "_format_zoo_warning":
    warnings.formatwarning = _format_zoo_warning
