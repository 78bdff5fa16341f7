"""The user's settings: where runs, weights and datasets go, and which loggers a run writes by default.

One YAML file, ``$ZOO_HOME/settings.yaml`` (``zoo settings`` shows its path), read at every use so a change
takes effect in the next command. A missing file means the defaults; every key is optional. Ultralytics users
know the idea from ``yolo settings``; zoo keeps fewer keys, each of which every command honours:

- ``runs_dir``: the default ``project=`` of train, val and predict, and where ``resume=true`` looks for the
  newest run (default ``runs``, relative to the working folder, as Ultralytics' ``runs_dir`` is);
- ``weights_dir``: the published weights' cache (default ``$ZOO_HOME/weights``);
- ``datasets_dir``: where the built-in ``shapes`` dataset is generated (default ``$ZOO_HOME/datasets``);
- ``loggers``: the default ``loggers=`` of a training run (default ``[csv]``).

An argument given to a command always wins over the settings. A bad file is a ``SettingsError`` naming the
file, the key and the fix (``zoo settings reset`` writes the defaults back).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zoo_core.errors import ZooError
from zoo_core.paths import zoo_home

__all__ = [
    "SettingsError", "ZooSettings", "settings_path", "load_settings", "update_settings", "reset_settings",
    "runs_dir", "weights_dir", "datasets_dir", "default_loggers", "LoggerName",
]

LoggerName = Literal["csv", "tensorboard", "mlflow", "wandb"]


class SettingsError(ZooError, ValueError):
    """A settings file that cannot be read, or a setting that cannot be set."""


class ZooSettings(BaseModel):
    """Every setting with its default (``None``: a folder under ``ZOO_HOME``)."""

    model_config = ConfigDict(extra="forbid")

    runs_dir: str = Field("runs", min_length=1, description="default project= of train, val and predict")
    weights_dir: str | None = Field(None, description="the published weights' cache (None: $ZOO_HOME/weights)")
    datasets_dir: str | None = Field(None, description="where built-in datasets are generated (None: $ZOO_HOME/datasets)")
    loggers: list[LoggerName] = Field(default_factory=lambda: ["csv"], description="default loggers= of a training run")


def settings_path() -> Path:
    """``$ZOO_HOME/settings.yaml``."""
    return zoo_home() / "settings.yaml"


def _explain(error: ValidationError, where: str) -> str:
    problems = []
    for detail in error.errors():
        key = ".".join(str(part) for part in detail["loc"]) or "(the file)"
        if detail["type"] == "extra_forbidden":
            problems.append(f"{key} is not a setting (known: {', '.join(ZooSettings.model_fields)})")
        else:
            problems.append(f"{key}: {detail['msg']}")
    return f"{where}: " + "; ".join(problems)


def _validated(values: Mapping[str, Any], where: str) -> ZooSettings:
    try:
        return ZooSettings.model_validate(dict(values))
    except ValidationError as error:
        raise SettingsError(_explain(error, where)) from None


# A settings file holds four short keys; anything this long is not one (and is not worth parsing).
MAX_SETTINGS_BYTES = 64 * 1024


def _read_yaml(text: str, where: str) -> Any:
    """The YAML in ``text``. Not zoo_core.data's bounded dataset reader: settings sit below the data layer, and
    a file this small (``MAX_SETTINGS_BYTES``) that only its owner writes needs no bound beyond its size."""
    import yaml

    if len(text) > MAX_SETTINGS_BYTES:
        raise SettingsError(f"{where}: {len(text):,} characters is not a settings file (at most {MAX_SETTINGS_BYTES:,})")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as problem:
        first_line = str(problem).strip().splitlines()[0] if str(problem).strip() else type(problem).__name__
        raise SettingsError(f"{where}: not valid YAML ({first_line})") from None
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError) as problem:
        raise SettingsError(f"{where}: a value YAML cannot build ({type(problem).__name__}: {problem})") from None


def load_settings() -> ZooSettings:
    """The settings in ``settings_path()`` (the defaults where the file or a key is absent)."""
    path = settings_path()
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return ZooSettings()
    except (OSError, UnicodeDecodeError) as error:
        raise SettingsError(f"cannot read the settings file {path} ({error}); fix or delete it, or run `zoo settings reset`") from None
    where = f"settings file {path}"
    try:
        values = _read_yaml(text, where)
        if values is None:
            return ZooSettings()
        if not isinstance(values, Mapping):
            raise SettingsError(f"{where} must hold a mapping of settings (key: value), not {type(values).__name__}")
        return _validated(values, where)
    except SettingsError as error:
        raise SettingsError(f"{error}; fix the file, or run `zoo settings reset`") from None


def _write(settings: ZooSettings) -> Path:
    """Write ``settings`` (only the keys that differ from the defaults) atomically: a reader never sees half a file."""
    import yaml

    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    changed = settings.model_dump(exclude_defaults=True)
    handle, staging = tempfile.mkstemp(prefix=".settings.", suffix=".yaml", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write("# zoo settings (`zoo settings` shows them; `zoo settings reset` restores the defaults)\n")
            if changed:
                file.write(yaml.safe_dump(changed, sort_keys=False))
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    return path


def update_settings(changes: Mapping[str, Any]) -> ZooSettings:
    """The settings with ``changes`` applied, validated and written; a bad change writes nothing."""
    current = load_settings().model_dump()
    unknown = sorted(set(changes) - set(ZooSettings.model_fields))
    if unknown:
        import difflib

        hints = [f"{key!r} (did you mean {', '.join(map(repr, close))}?)" if (close := difflib.get_close_matches(key, ZooSettings.model_fields, n=1))
                 else repr(key) for key in unknown]
        raise SettingsError(f"not a setting: {', '.join(hints)}; the settings are {', '.join(ZooSettings.model_fields)}")
    updated = _validated({**current, **changes}, "zoo settings")
    _write(updated)
    return updated


def reset_settings() -> Path:
    """Write the defaults back (an existing file is replaced)."""
    return _write(ZooSettings())


def _folder(configured: str | None, default: Path) -> Path:
    return Path(configured).expanduser() if configured else default


def runs_dir() -> Path:
    """The default ``project=`` folder (``runs_dir``)."""
    return Path(load_settings().runs_dir).expanduser()


def weights_dir() -> Path:
    """The published weights' cache (``weights_dir``, default ``$ZOO_HOME/weights``)."""
    return _folder(load_settings().weights_dir, zoo_home() / "weights")


def datasets_dir() -> Path:
    """Where built-in datasets are generated (``datasets_dir``, default ``$ZOO_HOME/datasets``)."""
    return _folder(load_settings().datasets_dir, zoo_home() / "datasets")


def default_loggers() -> list[str]:
    """The loggers a training run writes when ``loggers=`` is not given."""
    return list(load_settings().loggers)
