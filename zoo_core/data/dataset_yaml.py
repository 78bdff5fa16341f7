"""Reading dataset YAML files: the keys every format shares (``path``, splits, ``names``).

``path`` is the dataset root; when it is relative it is relative to the folder holding the YAML
file, and when it is missing the root is that folder. Split entries (``train``, ``val``,
``test``) are relative to the root. YAML is read with ``yaml.safe_load`` only, and bounded before
it is used (``load_bounded_yaml``): a file is UTF-8 (a byte-order mark and CRLF line ends are
fine; another encoding is a ``DatasetError`` naming it), at most ``MAX_YAML_BYTES``, nested at
most ``MAX_YAML_DEPTH`` levels, and its values, with every alias expanded, number at most
``MAX_YAML_NODES``: a "billion laughs" (aliases of aliases of aliases) is refused before any code
walks, prints or quotes it. Messages quote values through ``zoo_core.errors.excerpt``.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any, Mapping

from zoo_core.data.errors import DatasetError
from zoo_core.errors import ZooError, excerpt

__all__ = [
    "YAML_SUFFIXES", "MAX_YAML_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "read_dataset_yaml", "read_yaml_text",
    "load_bounded_yaml", "DatesAsText", "dataset_root", "parse_names", "split_paths", "resolve_under",
]

YAML_SUFFIXES = (".yaml", ".yml")
# Far above any real dataset YAML (COCO's, with its 80 names, is 2 kB and ~100 values), far below
# what would take seconds or gigabytes to walk.
MAX_YAML_BYTES = 4 * 1024 * 1024
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 100_000

# Byte-order marks of the encodings YAML allows besides UTF-8, longest first (UTF-32 LE starts like UTF-16 LE).
_OTHER_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32 (little-endian)"), (codecs.BOM_UTF32_BE, "UTF-32 (big-endian)"),
    (codecs.BOM_UTF16_LE, "UTF-16 (little-endian)"), (codecs.BOM_UTF16_BE, "UTF-16 (big-endian)"),
)


def read_yaml_text(path: Path) -> str:
    """The text of YAML file ``path``: UTF-8, with or without a byte-order mark.

    ``DatasetError`` names the file and what it is instead: larger than ``MAX_YAML_BYTES``, UTF-16
    or UTF-32 (told by its byte-order mark or its NUL bytes), or bytes that are not UTF-8 (typically
    Latin-1 or Windows-1252 from an old editor), with the offset and line of the first bad byte.
    """
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise DatasetError(f"{path}: {size:,} bytes is larger than a dataset YAML can be ({MAX_YAML_BYTES:,}); "
                               "list images in a .txt file and name that file in the YAML instead")
        data = path.read_bytes()
    except OSError as error:
        raise DatasetError(f"{path}: cannot read the dataset YAML ({error.strerror or error})") from None
    fix = "re-save it as UTF-8 (any editor's \"Save with encoding\"; iconv -f <encoding> -t UTF-8)"
    for mark, encoding in _OTHER_BOMS:
        if data.startswith(mark):
            raise DatasetError(f"{path}: the file is encoded as {encoding}, but dataset YAML is read as UTF-8; {fix}")
    if b"\x00" in data[:4096]:
        raise DatasetError(f"{path}: the file holds NUL bytes, so it looks UTF-16 or UTF-32 encoded, but dataset YAML "
                           f"is read as UTF-8; {fix}")
    try:
        return data.decode("utf-8-sig")  # -sig: a UTF-8 byte-order mark (Windows Notepad writes one) is dropped
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        byte = data[error.start]
        try:
            data.decode("cp1252")
            guess = "Latin-1 or Windows-1252 (cp1252) text, by the look of it"
        except UnicodeDecodeError:
            guess = "an encoding other than UTF-8"
        raise DatasetError(f"{path}: not UTF-8 text: byte 0x{byte:02X} at offset {error.start} (line {line}) is not "
                           f"valid UTF-8; the file is {guess}. Dataset YAML is read as UTF-8: {fix}") from None


def _measure_yaml(text: str, where: str, error: type[ZooError]) -> None:
    """Refuse ``text`` if its nesting is deeper than ``MAX_YAML_DEPTH`` or its values, aliases expanded,
    number more than ``MAX_YAML_NODES``, before anything is built from it.

    Reads the parser's events only (an iterative state machine: no recursion, no objects built). A
    node's size is counted once, when its anchor closes, and an alias adds the size of its anchor, so
    the count of ten aliases of ten aliases is a multiplication, not a walk. Sizes are capped at the
    limit, so the arithmetic stays on small integers.
    """
    import yaml

    limit = MAX_YAML_NODES + 1
    sizes: dict[str, int] = {}  # anchor -> size of its node, once the node is complete
    open_anchors: set[str] = set()
    stack: list[list[Any]] = []  # per open collection: [anchor or None, size so far]
    total = 0

    def add(size: int) -> None:
        nonlocal total
        if stack:
            stack[-1][1] = min(stack[-1][1] + size, limit)
        else:
            total = min(total + size, limit)
        if (stack[-1][1] if stack else total) >= limit:
            raise error(f"{where}: the YAML expands to more than {MAX_YAML_NODES:,} values (aliases of aliases, a "
                        "\"billion laughs\"); a dataset YAML needs a few dozen. Write the values out, without *aliases")

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in open_anchors:
                raise error(f"{where}: the alias *{event.anchor} refers to a node that contains it (a recursive "
                            "structure); write the values out instead")
            add(sizes.get(event.anchor, 1))
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                sizes[event.anchor] = 1
            add(1)
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(stack) >= MAX_YAML_DEPTH:
                raise error(f"{where}: the YAML is nested more than {MAX_YAML_DEPTH} levels deep; flatten it")
            if event.anchor is not None:
                open_anchors.add(event.anchor)
            stack.append([event.anchor, 1])
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, size = stack.pop()
            if anchor is not None:
                open_anchors.discard(anchor)
                sizes[anchor] = size
            add(size)


class DatesAsText:
    """A ``yaml.SafeLoader`` that reads dates and timestamps as the text they are (``loader()`` builds it once).

    For command-line words: ``name=2024-05-01`` names a run, and a ``datetime.date`` would only be refused
    later, less clearly. An explicit ``!!timestamp`` tag still builds a timestamp (or fails, named).
    """

    _loader: Any = None

    @classmethod
    def loader(cls) -> Any:
        """The loader class (built on first use: yaml is imported only when something is read)."""
        if cls._loader is None:
            import yaml

            class _Loader(yaml.SafeLoader):
                pass

            timestamp = "tag:yaml.org,2002:timestamp"
            _Loader.yaml_implicit_resolvers = {
                first: [(tag, pattern) for tag, pattern in resolvers if tag != timestamp]
                for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
            }
            cls._loader = _Loader
        return cls._loader


def _clipped(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (a parser's message quotes the input, which may be huge)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_bounded_yaml(text: str, where: str, error: type[ZooError] = DatasetError, *, loader: Any = None) -> Any:
    """``yaml.safe_load(text)`` after ``_measure_yaml`` has bounded it; every failure is an ``error`` naming ``where``.

    Beyond syntax errors, PyYAML's own constructors raise plain Python errors on some well-formed
    input (``2020-13-45`` is a timestamp with month 13: ``ValueError``; ``!!float abc``; ``!!timestamp
    x``: ``AttributeError``); they become ``error`` too. ``loader``: a ``yaml.SafeLoader`` subclass.
    """
    import yaml

    if len(text) > MAX_YAML_BYTES:
        raise error(f"{where}: {len(text):,} characters is more YAML than zoo reads ({MAX_YAML_BYTES:,})")
    try:
        _measure_yaml(text, where, error)
        return yaml.load(text, Loader=loader or yaml.SafeLoader)  # noqa: S506 - a SafeLoader (subclass) only
    except ZooError:
        raise
    except yaml.YAMLError as problem:
        raise error(f"{where}: not valid YAML ({_clipped(str(problem), 300)})") from None
    except (ValueError, TypeError, AttributeError, OverflowError, RecursionError, MemoryError) as problem:
        raise error(f"{where}: a value YAML cannot build ({type(problem).__name__}: {_clipped(str(problem), 200)}); "
                    "quote it to make it text") from None


def read_dataset_yaml(path: Path) -> dict[str, Any]:
    """The mapping in dataset YAML file ``path``; ``DatasetError`` if it is missing, unbounded or not a mapping."""
    if not path.is_file():
        raise DatasetError(f"dataset YAML {path} does not exist; check the path")
    content = load_bounded_yaml(read_yaml_text(path), str(path))
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
        raise DatasetError(f"{yaml_path}: path must be a folder name, got {type(value).__name__} {excerpt(value)}")
    root = Path(str(value)).expanduser()
    root = root if root.is_absolute() else base / root
    try:
        is_folder = root.is_dir()
    except OSError as error:  # a name too long for the file system, say
        raise DatasetError(f"{yaml_path}: path {excerpt(value)} is not a usable folder name ({error.strerror})") from None
    if not is_folder:
        raise DatasetError(f"{yaml_path}: path {excerpt(value)} resolves to {excerpt(str(root), 200)}, which is not a folder")
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
        raise DatasetError(f"{yaml_path}: {split!r} must be a path or a list of paths, got {excerpt(value)}")
    return [resolve_under(root, item) for item in values]


def parse_names(value: Any, where: str, count: Any = None) -> dict[int, str]:
    """``names`` as ``{index: name}``, from a list or a mapping whose keys are 0..n-1 (``nc`` checked if given)."""
    if isinstance(value, list):
        names = {index: str(name) for index, name in enumerate(value)}
    elif isinstance(value, dict):
        try:
            names = {int(key): str(name) for key, name in value.items()}
        except (TypeError, ValueError):
            raise DatasetError(f"{where}: names keys must be class indices 0, 1, ...; got {excerpt(list(value))}") from None
        if sorted(names) != list(range(len(names))):
            raise DatasetError(f"{where}: names keys must be 0..{len(names) - 1} without gaps; got {excerpt(sorted(names))}")
        names = dict(sorted(names.items()))
    else:
        raise DatasetError(f"{where}: 'names' is required: a list of class names or a mapping {{0: name, ...}}")
    if not names:
        raise DatasetError(f"{where}: 'names' is empty; list at least one class")
    if count is not None:
        if not isinstance(count, int) or isinstance(count, bool):
            raise DatasetError(f"{where}: nc must be the number of classes, got {excerpt(count)}; drop it or give an integer")
        if count != len(names):
            raise DatasetError(f"{where}: nc={count} but names lists {len(names)} classes; make them agree (or drop nc)")
    return names
