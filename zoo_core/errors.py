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
