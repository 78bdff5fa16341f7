"""Reading, writing and downloading weights: safetensors with metadata, and ``.pt`` checkpoints.

Safety rules (docs/architecture.md, "Safety"): ``.pt`` files are read with ``torch.load(weights_only=True)`` only;
writes are atomic (temp file in the same directory, then ``os.replace``); downloads are checked
against the registry's sha256 before they are moved into the cache.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import re
import tempfile
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Mapping

from zoo_core.errors import (
    ChecksumMismatchError,
    CorruptWeightsError,
    IncompleteDownloadError,
    UnexpectedContentError,
    UnsafeWeightsError,
    WeightsDownloadError,
    WeightsNotPublishedError,
    WeightsOfflineError,
    WeightsWriteError,
)
from zoo_core.registry import normalise_image_size

if TYPE_CHECKING:
    import torch

    from zoo_core.registry import ImageSize

__all__ = [
    "ModelMeta",
    "save_safetensors",
    "read_safetensors",
    "read_checkpoint",
    "load_torch_file",
    "read_weights",
    "atomic_torch_save",
    "atomic_write",
    "atomic_link_or_copy",
    "download_weights",
    "sha256_of",
    "weights_digest",
    "verify_digest",
    "DIGEST_KEY",
    "LEAN_KEY",
]

_META_KEY = "zoo"


@dataclass
class ModelMeta:
    """What a weights file says about the model it holds."""

    family: str
    size: str
    task: str
    num_classes: int
    names: dict[int, str] = field(default_factory=dict)
    input_size: "ImageSize" = 0  # an int (square), (height, width), or 0 when unknown
    zoo_version: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # builder options, so the same graph is rebuilt
    data: str = ""  # the dataset it was trained on: `zoo val best.pt` validates there by default
    # Fields of the family's input pipeline these weights were trained with another value of (a YOLOv9
    # converted from the official release letterboxes centred): docs/registry.md, "input_pipeline".
    input_pipeline: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (also what ``.pt`` checkpoints store under ``meta``)."""
        data = asdict(self)
        data["names"] = {int(key): str(value) for key, value in self.names.items()}
        if not isinstance(self.input_size, int):
            data["input_size"] = [int(side) for side in self.input_size]  # [height, width], as JSON writes it
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str | Path) -> "ModelMeta":
        """Parse metadata read from ``source``; ``CorruptWeightsError`` if fields are missing."""
        try:
            return cls(
                family=str(data["family"]),
                size=str(data["size"]),
                task=str(data["task"]),
                num_classes=int(data["num_classes"]),
                names={int(key): str(value) for key, value in dict(data.get("names") or {}).items()},
                input_size=normalise_image_size(data.get("input_size") or 0, "input_size", minimum=0),
                zoo_version=str(data.get("zoo_version") or ""),
                options=dict(data.get("options") or {}),
                data=str(data.get("data") or ""),
                input_pipeline=dict(data.get("input_pipeline") or {}),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptWeightsError(f"{source}: the zoo metadata is incomplete or malformed ({error!r})") from None


def _atomic_target(path: Path) -> tuple[int, Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    return handle, Path(temporary)


def _unshared(state_dict: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    # safetensors refuses tensors that share storage (tied weights); give each its own copy.
    seen: set[tuple[int, int]] = set()
    result = {}
    for key, tensor in state_dict.items():
        tensor = tensor.detach().cpu().contiguous()
        identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if identity in seen and tensor.numel():
            tensor = tensor.clone()
        seen.add(identity)
        result[key] = tensor
    return result


DIGEST_KEY = "weights_sha256"  # in the metadata: the digest of the tensors, checked on load
# Marks a run's final best.pt, rewritten lean (zoo_core/engine/checkpoint.py): resume then names last.pt.
LEAN_KEY = "lean"


def weights_digest(state_dict: Mapping[str, "torch.Tensor"]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order: a flipped bit changes it."""
    import torch

    digest = hashlib.sha256()
    for key in sorted(state_dict):
        tensor = state_dict[key].detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def verify_digest(path: str | Path, state_dict: Mapping[str, "torch.Tensor"], expected: str | None) -> None:
    """``CorruptWeightsError`` naming ``path`` if its tensors do not have the digest written with them."""
    if expected and weights_digest(state_dict) != expected:
        raise CorruptWeightsError(
            f"{path}: the tensors do not match the checksum written with them, so the file was damaged or changed after "
            "it was saved (a flipped bit, a partial copy). Re-download it or use another copy"
        )


def save_safetensors(path: str | Path, state_dict: Mapping[str, "torch.Tensor"], meta: ModelMeta) -> Path:
    """Write ``state_dict`` and ``meta`` to ``path`` atomically; returns the path."""
    from safetensors.torch import save_file

    path = Path(path)
    handle, temporary = _atomic_target(path)
    os.close(handle)
    try:
        tensors = _unshared(state_dict)
        header = {**meta.to_dict(), DIGEST_KEY: weights_digest(tensors)}
        save_file(tensors, str(temporary), metadata={_META_KEY: json.dumps(header)})
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def read_safetensors(path: str | Path) -> tuple[dict[str, "torch.Tensor"], ModelMeta | None]:
    """Tensors and zoo metadata (None if the file has none) of a ``.safetensors`` file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            header = handle.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        raise CorruptWeightsError(
            f"{path} is not a readable safetensors file ({error}); it may be truncated or another "
            "format. Re-download or re-save it with LibreYOLO(...).save(path)."
        ) from None
    meta = None
    if _META_KEY in header:
        try:
            fields = json.loads(header[_META_KEY])
        except json.JSONDecodeError as error:
            raise CorruptWeightsError(f"{path}: the zoo metadata is not valid JSON ({error})") from None
        if not isinstance(fields, Mapping):
            raise CorruptWeightsError(f"{path}: the zoo metadata is not a JSON object")
        meta = ModelMeta.from_dict(fields, path)
        verify_digest(path, tensors, fields.get(DIGEST_KEY))
    return tensors, meta


def load_torch_file(path: str | Path) -> Any:
    """``torch.load(path, weights_only=True)``; every failure becomes a ``WeightsError`` naming the file.

    A pickle that would import or call anything weights_only does not allow (a class, ``os.system``,
    ``exec``) is an ``UnsafeWeightsError`` naming it; nothing is imported or run to find out. Anything
    else that is not a PyTorch file (text, random bytes, a truncated download) is a ``CorruptWeightsError``.
    """
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        text = str(error)
        # torch's weights-only unpickler names a refused global in two ways: "Unsupported global: GLOBAL
        # module.Class" (a class or function outside its allowlist) and "unsupported GLOBAL posix.system
        # whose module posix is blocked" (a module it never imports from). Failing both, the pickle's own
        # opcodes say what it would import (read by pickletools; nothing is imported or run).
        refused = re.search(r"(?:Unsupported global: |unsupported )GLOBAL ([\w.]+)", text)
        imported = [refused.group(1)] if refused else _refused_globals(path)
        if imported:
            raise UnsafeWeightsError(
                f"{path} holds pickled Python objects or code (it imports {', '.join(imported[:3])}), not a plain "
                "state dict; nothing in it was run: zoo only loads with torch.load(weights_only=True). If you trust "
                "the file, re-save its weights as a state dict: torch.save(model.state_dict(), path), or as safetensors."
            ) from None
        operand = re.search(r"Unsupported operand [^\n]*", text)
        why = operand.group(0) if operand else text.strip().splitlines()[0] if text.strip() else type(error).__name__
        raise CorruptWeightsError(
            f"{path} is not a PyTorch weights file ({why}); it may be damaged or another kind of file. Check the path, "
            "or re-download it"
        ) from None
    except Exception as error:  # noqa: BLE001 - torch.load fails in many ways on bytes that are not its format
        raise CorruptWeightsError(
            f"{path} could not be read as a PyTorch file ({type(error).__name__}: {error}); it may be truncated, "
            "damaged or another format. Re-download it, or re-save it."
        ) from None


_PICKLE_SCAN_BYTES = 64 * 1024 * 1024  # the pickle of a state dict is small (the tensors live in other archive members)
_STRING_OPCODES = frozenset({"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
                             "BINUNICODE8"})
_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_MEMO_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})


def _pickled_globals(path: str | Path) -> list[str]:
    """Every ``module.name`` the pickle of torch file ``path`` would import (GLOBAL, STACK_GLOBAL, INST opcodes).

    Read with ``pickletools.genops``, which decodes opcodes and never imports or calls anything. A torch
    zip archive's pickle is its ``data.pkl`` member; a legacy file is a sequence of pickles (read until
    the first one that does not decode). Unreadable input gives what was found before it.
    """
    import io
    import pickletools
    import zipfile

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                members = [name for name in archive.namelist() if name.endswith("data.pkl")]
                if not members:
                    return []
                with archive.open(members[0]) as member:
                    data = member.read(_PICKLE_SCAN_BYTES)
        else:
            with open(path, "rb") as stream:
                data = stream.read(_PICKLE_SCAN_BYTES)
    except Exception:  # noqa: BLE001 - a damaged archive: nothing to read, the caller reports it as damaged
        return []
    found: list[str] = []
    stream = io.BytesIO(data)
    strings: list[object] = []  # what was pushed last, for STACK_GLOBAL (module, then name)
    memo: dict[object, object] = {}
    try:
        while stream.tell() < len(data):
            for opcode, argument, _ in pickletools.genops(stream):
                name = opcode.name
                if name in ("GLOBAL", "INST"):
                    found.append(str(argument).replace(" ", "."))
                elif name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(f"{strings[-2]}.{strings[-1]}")
                elif name in _STRING_OPCODES:
                    strings.append(argument)
                elif name == "MEMOIZE" and strings:
                    memo[len(memo)] = strings[-1]
                elif name in _MEMO_PUTS and strings:
                    memo[argument] = strings[-1]
                elif name in _MEMO_GETS:
                    strings.append(memo.get(argument))
                else:
                    strings.append(None)  # another value came between: no STACK_GLOBAL pairs across it
                del strings[:-2]
    except Exception:  # noqa: BLE001 - the end of the pickles (or damage): keep what was found
        pass
    return found


def _refused_globals(path: str | Path) -> list[str]:
    """The globals of ``path``'s pickle that ``torch.load(weights_only=True)`` does not allow (``_pickled_globals``).

    torch's own names (``torch.*``) are left out: a torch file damaged in its tensor records would
    otherwise read as unsafe. A whole pickled model is still named, by torch's own refusal message.
    """
    import torch

    allowed: set[str] = set()
    try:  # torch's allowlist has no public accessor; without it, every non-torch global counts
        from torch._weights_only_unpickler import _get_allowed_globals

        allowed.update(_get_allowed_globals())
    except Exception:  # noqa: BLE001 - a torch without this private helper
        pass
    for entry in torch.serialization.get_safe_globals():
        item = entry[0] if isinstance(entry, tuple) else entry
        allowed.add(f"{getattr(item, '__module__', '')}.{getattr(item, '__qualname__', '')}")
    return [name for name in dict.fromkeys(_pickled_globals(path))
            if name not in allowed and name.split(".", 1)[0] != "torch"]


def read_checkpoint(path: str | Path) -> tuple[dict[str, "torch.Tensor"], ModelMeta | None, dict[str, Any]]:
    """Weights, metadata and the whole dict of a ``.pt``/``.pth`` file, loaded with ``weights_only=True``.

    Accepts a zoo training checkpoint (``{"model": state_dict, "meta": {...}, ...}``) or a plain
    state dict. A pickle of arbitrary objects is refused with ``UnsafeWeightsError``; anything
    else that is not a state dict is a ``CorruptWeightsError``.
    """
    import torch

    content = load_torch_file(path)
    if isinstance(content, Mapping) and isinstance(content.get("model"), Mapping):
        state_dict = dict(content["model"])
        meta_data = content.get("meta")
        meta = ModelMeta.from_dict(meta_data, path) if isinstance(meta_data, Mapping) else None
        whole = dict(content)
    elif isinstance(content, Mapping):
        state_dict, meta, whole = dict(content), None, {"model": dict(content)}
    else:
        raise CorruptWeightsError(
            f"{path} holds a {type(content).__name__}, not a state dict; save weights with "
            "torch.save(model.state_dict(), path)"
        )
    bad = [key for key, value in state_dict.items() if not isinstance(value, torch.Tensor)]
    if bad:
        raise CorruptWeightsError(
            f"{path} is not a state dict: entries {bad[:3]} are not tensors; save weights with "
            "torch.save(model.state_dict(), path)"
        )
    if isinstance(whole.get("meta"), Mapping):
        verify_digest(path, state_dict, whole["meta"].get(DIGEST_KEY))
    return state_dict, meta, whole


def read_weights(path: str | Path) -> tuple[dict[str, "torch.Tensor"], ModelMeta | None]:
    """Weights and metadata of a ``.safetensors``, ``.pt`` or ``.pth`` file, by suffix."""
    path = Path(path)
    if path.suffix.lower() == ".safetensors":
        return read_safetensors(path)
    if path.suffix.lower() in (".pt", ".pth"):
        state_dict, meta, _ = read_checkpoint(path)
        return state_dict, meta
    raise CorruptWeightsError(f"{path}: unknown weights format {path.suffix!r}; use .safetensors, .pt or .pth")


def _write_error(path: Path, error: OSError) -> WeightsWriteError:
    reason = error.strerror or str(error)
    hint = " Free space there, or train with project= on another disk." if error.errno == errno.ENOSPC else ""
    return WeightsWriteError(
        f"could not write {path} ({reason}); the previous {path.name}, if any, is unchanged.{hint}"
    )


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write`` on a temp file beside ``path``, fsync, then ``os.replace``: a kill never leaves half a file.

    A failed write (a full disk) raises ``WeightsWriteError`` naming ``path``; the temp file is
    removed and the file already at ``path`` is untouched.
    """
    path = Path(path)
    try:
        handle, temporary = _atomic_target(path)
    except OSError as error:
        raise _write_error(path, error) from error
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except OSError as error:
        raise _write_error(path, error) from error
    finally:
        temporary.unlink(missing_ok=True)
    return path


def atomic_link_or_copy(source: str | Path, path: str | Path) -> Path:
    """Make ``path`` an independent name for ``source``'s current content, atomically.

    A hard link costs nothing and stays valid when ``source`` is later replaced (``os.replace``
    gives the new file a new inode); where links are not supported, the bytes are copied.
    """
    import shutil

    source, path = Path(source), Path(path)
    handle, temporary = _atomic_target(path)
    os.close(handle)
    try:
        temporary.unlink()
        try:
            os.link(source, temporary)
        except OSError:
            shutil.copyfile(source, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """``torch.save`` ``obj`` to ``path`` atomically (see ``atomic_write``).

    ``torch.save`` streams into the temp file: no copy of the whole file is held in memory
    (a training checkpoint holds the weights three to five times over).
    """
    import torch

    def save(stream: BinaryIO) -> None:
        recording = _WriteErrorRecorder(stream)
        try:
            torch.save(obj, recording)
        except RuntimeError:
            # torch.save reports a failed write (a full disk) as a RuntimeError about zip offsets.
            if recording.error is not None:
                raise recording.error from None
            raise

    return atomic_write(path, save)


class _WriteErrorRecorder:
    """A binary stream that remembers the ``OSError`` its ``write`` raised (torch.save replaces it by its own error)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.stream.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.stream.flush()


def sha256_of(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def download_weights(url: str, sha256: str, destination: str | Path, *, fresh_hint: str, timeout: float = 60.0,
                     progress: Callable[..., Any] | None = None) -> Path:
    """Download ``url`` to ``destination`` if the file's sha256 is ``sha256``; else raise and keep nothing.

    ``fresh_hint`` is appended to errors (how to build the model without weights); ``progress``, a
    tqdm-like class, is shown while the bytes arrive. A 404 is a ``WeightsNotPublishedError``, an
    unreachable server a ``WeightsOfflineError``, a short body an ``IncompleteDownloadError``, an
    HTML page an ``UnexpectedContentError`` and another digest a ``ChecksumMismatchError``.
    """
    destination = Path(destination)
    handle, temporary = _atomic_target(destination)
    digest = hashlib.sha256()
    try:
        with os.fdopen(handle, "wb") as stream:
            try:
                response = urllib.request.urlopen(url, timeout=timeout)  # noqa: S310 - http(s) only (schema)
            except urllib.error.HTTPError as error:
                if error.code in (404, 410):
                    raise WeightsNotPublishedError(f"no weights are published at {url} (HTTP {error.code}); {fresh_hint}") from None
                raise WeightsDownloadError(f"could not download {url} (HTTP {error.code} {error.reason}); retry later, or {fresh_hint}") from None
            except (urllib.error.URLError, OSError, TimeoutError) as error:
                reason = getattr(error, "reason", error)
                raise WeightsOfflineError(
                    f"could not download {url} ({reason}). Are you offline? Place the file at "
                    f"{destination} yourself, or {fresh_hint}"
                ) from None
            with response:
                if "text/html" in (response.headers.get("Content-Type") or "").lower():
                    raise UnexpectedContentError(
                        f"{url} sent an HTML page, not a weights file (a proxy, a login wall or an error page); nothing "
                        f"was kept. Check the network, or {fresh_hint}")
                expected = int(response.headers.get("Content-Length") or 0) or None
                bar = progress(total=expected, desc=destination.name, unit="B", unit_scale=True) if progress else None
                received = 0
                try:
                    while True:
                        try:
                            chunk = response.read(1 << 20)
                        except (OSError, TimeoutError, http.client.HTTPException) as error:
                            raise IncompleteDownloadError(
                                f"the download of {url} broke after {received} bytes ({error!r}); nothing was kept. "
                                f"Retry, or {fresh_hint}") from None
                        if not chunk:
                            break
                        digest.update(chunk)
                        stream.write(chunk)
                        received += len(chunk)
                        if bar is not None:
                            bar.update(len(chunk))
                finally:
                    if bar is not None:
                        bar.close()
                if expected is not None and received != expected:
                    raise IncompleteDownloadError(
                        f"the download of {url} ended after {received} of {expected} bytes; nothing was kept. Retry, "
                        f"or {fresh_hint}")
        if digest.hexdigest() != sha256.lower():
            raise ChecksumMismatchError(
                f"the file downloaded from {url} has sha256 {digest.hexdigest()}, but the registry "
                f"expects {sha256}; it was discarded. The server may be serving another file; "
                f"retry later, or {fresh_hint}"
            )
        os.replace(temporary, destination)
    finally:
        temporary.unlink(missing_ok=True)
    return destination
