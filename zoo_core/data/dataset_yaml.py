"""Reading dataset YAML files: the keys every format shares (``path``, splits, ``names``).

``path`` is the dataset root; when it is relative it is relative to the folder holding the YAML
file, and when it is missing the root is that folder. Split entries (``train``, ``val``,
``test``) are relative to the root. YAML is read with ``yaml.safe_load`` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from zoo_core.data.errors import DatasetError

__all__ = ["YAML_SUFFIXES", "read_dataset_yaml", "dataset_root", "parse_names", "split_paths", "resolve_under"]

YAML_SUFFIXES = (".yaml", ".yml")


def read_dataset_yaml(path: Path) -> dict[str, Any]:
    """The mapping in dataset YAML file ``path``; ``DatasetError`` if it is missing or not a mapping."""
    import yaml

    if not path.is_file():
        raise DatasetError(f"dataset YAML {path} does not exist; check the path")
    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise DatasetError(f"{path}: not valid YAML ({error})") from None
    if not isinstance(content, dict):
        raise DatasetError(f"{path}: expected a mapping with path/train/val/names keys, got {type(content).__name__}")
    return content


def dataset_root(yaml_path: Path, content: Mapping[str, Any]) -> Path:
    """The dataset root: ``path`` (relative to the YAML's folder) or the YAML's folder."""
    base = yaml_path.resolve().parent
    value = content.get("path")
    if value in (None, ""):
        return base
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise DatasetError(f"{yaml_path}: path must be a folder name, got {type(value).__name__} {value!r}")
    root = Path(str(value)).expanduser()
    root = root if root.is_absolute() else base / root
    try:
        is_folder = root.is_dir()
    except OSError as error:  # a name too long for the file system, say
        raise DatasetError(f"{yaml_path}: path {value!r} is not a usable folder name ({error.strerror})") from None
    if not is_folder:
        raise DatasetError(f"{yaml_path}: path {value!r} resolves to {root}, which is not a folder")
    return root.resolve()


def resolve_under(root: Path, value: Any) -> Path:
    """``value`` as a path, relative to ``root`` unless absolute."""
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else root / path


def split_paths(yaml_path: Path, content: Mapping[str, Any], split: str, root: Path, required: bool = True) -> list[Path] | None:
    """The entries of split ``split``: a string or a list of strings, each resolved under ``root``."""
    value = content.get(split)
    if value in (None, "", []):
        if required:
            raise DatasetError(f"{yaml_path}: missing {split!r}; name the {split} images folder or list file (relative to the root {root})")
        return None
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(item, (str, Path)) for item in values):
        raise DatasetError(f"{yaml_path}: {split!r} must be a path or a list of paths, got {value!r}")
    return [resolve_under(root, item) for item in values]


def parse_names(value: Any, where: str, count: Any = None) -> dict[int, str]:
    """``names`` as ``{index: name}``, from a list or a mapping whose keys are 0..n-1 (``nc`` checked if given)."""
    if isinstance(value, list):
        names = {index: str(name) for index, name in enumerate(value)}
    elif isinstance(value, dict):
        try:
            names = {int(key): str(name) for key, name in value.items()}
        except (TypeError, ValueError):
            raise DatasetError(f"{where}: names keys must be class indices 0, 1, ...; got {list(value)!r}") from None
        if sorted(names) != list(range(len(names))):
            raise DatasetError(f"{where}: names keys must be 0..{len(names) - 1} without gaps; got {sorted(names)}")
        names = dict(sorted(names.items()))
    else:
        raise DatasetError(f"{where}: 'names' is required: a list of class names or a mapping {{0: name, ...}}")
    if not names:
        raise DatasetError(f"{where}: 'names' is empty; list at least one class")
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool):
            raise DatasetError(f"{where}: nc must be the number of classes, got {count!r}; drop it or give an integer")
        if count != len(names):
            raise DatasetError(f"{where}: nc={count} but names lists {len(names)} classes; make them agree (or drop nc)")
    return names
