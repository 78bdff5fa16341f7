"""Published weights: from a size's registry declaration (or an ``hf://`` reference) to a checked file in the cache.

Where each size's published file lives is registry.yaml's business (``SizeDeclaration.weights``,
a ``WeightsSource``); this module only fetches it, once per machine:

- **Cache.** A Hub file goes to huggingface_hub's cache under ``ZOO_HOME/weights/hub`` (its
  resume, ``HF_TOKEN``, ``HF_ENDPOINT`` and blob locks); a file elsewhere (YOLO-NAS on Deci's CDN)
  to ``ZOO_HOME/weights/<file>``. A file put at ``ZOO_HOME/weights/<file>`` by hand is used first,
  so an offline machine needs no Hub cache layout. A cached file is used without any request.
- **Integrity.** A downloaded Hub file is checked against the registry's sha256 where it pins one,
  else against the digest the Hub declares for it (the ``X-Linked-Etag`` of the resolve route: the
  LFS object's sha256, or a small file's git blob id), which huggingface_hub 2.4 names the blob by
  but does not verify. A mismatch, a cut download or an HTML page leaves nothing in the cache and
  raises a named ``WeightsError`` with the URL. The facade's strict load is the last check.
- **Offline** (``HF_HUB_OFFLINE=1``, or the server unreachable) and not cached: one
  ``WeightsOfflineError`` naming the file, its URL, the cache and where to put the file by hand.
- **Once per machine.** Processes that want the same file take one lock under ``ZOO_HOME/locks``:
  the first downloads while the others wait (every torchrun rank runs the user's script, so every
  rank asks); they then load the same file. When the download fails, the first process writes its
  error next to the lock and the waiting ones raise the same error instead of trying again.

docs/weights.md ("Published weights") is the user's guide.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from tqdm import tqdm

from zoo_core import __version__, errors
from zoo_core.errors import (
    ChecksumMismatchError,
    HubAccessError,
    HubReferenceError,
    IncompleteDownloadError,
    UnexpectedContentError,
    WeightsDownloadError,
    WeightsError,
    WeightsNotPublishedError,
    WeightsOfflineError,
)
from zoo_core.naming import canonical_name
from zoo_core.paths import zoo_home
from zoo_core.registry import HUB_ENDPOINT, FamilyDeclaration, WeightsSource
from zoo_core.weights import download_weights, sha256_of

__all__ = [
    "HUB_PREFIX",
    "HubReference",
    "parse_hub_reference",
    "hub_endpoint",
    "offline_mode",
    "weights_dir",
    "hub_cache_dir",
    "locks_dir",
    "cached_copy",
    "fetch",
    "source_of_reference",
    "not_published",
    "DownloadProgress",
]

HUB_PREFIX = "hf://"
_HUB_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_CANDIDATE_SUFFIXES = (".pt", ".safetensors")  # what an hf:// reference without a file may pick (LibreYOLO's rule)
_TRANSIENT_STATUS = (500, 502, 503, 504)  # huggingface_hub retries these on its HEAD, not on the GET
_GET_ATTEMPTS = 3


# --------------------------------------------------------------------------- the environment, read at call time
def hub_endpoint() -> str:
    """The Hub to download from: ``HF_ENDPOINT`` (a mirror, a test server), else ``https://huggingface.co``.

    Read at every call: huggingface_hub reads it once, when it is first imported.
    """
    return (os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/")


def offline_mode() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) switches the network off, read at every call."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def weights_dir() -> Path:
    """The ``weights_dir`` setting (default ``ZOO_HOME/weights``, zoo_core/settings.py): files that are not on the
    Hub, and files put there by hand (used first)."""
    from zoo_core.settings import weights_dir as configured_weights_dir

    return configured_weights_dir()


def hub_cache_dir() -> Path:
    """``ZOO_HOME/weights/hub``: huggingface_hub's ``cache_dir`` for the Hub files zoo downloads."""
    return weights_dir() / "hub"


def locks_dir() -> Path:
    """``ZOO_HOME/locks``: one lock (and, after a failed download, one error record) per published file."""
    return zoo_home() / "locks"


# --------------------------------------------------------------------------- hf:// references
@dataclass(frozen=True)
class HubReference:
    """``hf://owner/repo[@revision][/file]``: a file of any Hugging Face Hub repository."""

    repo: str
    revision: str | None = None
    file: str | None = None

    def __str__(self) -> str:
        revision = f"@{self.revision}" if self.revision else ""
        file = f"/{self.file}" if self.file else ""
        return f"{HUB_PREFIX}{self.repo}{revision}{file}"


def parse_hub_reference(text: str) -> HubReference | None:
    """The reference ``text`` spells, None when it does not start with ``hf://``; ``HubReferenceError`` if malformed."""
    if not text.startswith(HUB_PREFIX):
        return None
    parts = text[len(HUB_PREFIX):].strip("/").split("/")
    form = "hf://owner/repo, hf://owner/repo@revision or hf://owner/repo[@revision]/path/to/file.pt"
    if len(parts) < 2:
        raise HubReferenceError(f"{text!r} is not a Hugging Face reference; write {form}")
    owner, name = parts[0], parts[1]
    revision = None
    if "@" in name:
        name, _, revision = name.partition("@")
        if not revision:
            raise HubReferenceError(f"{text!r}: the revision after '@' is empty; write {form}")
    if not (_HUB_SEGMENT.match(owner) and _HUB_SEGMENT.match(name)):
        raise HubReferenceError(f"{text!r}: {owner}/{name} is not a Hub repository id (letters, digits, '.', '_', '-')")
    file = "/".join(parts[2:]) or None
    if file is not None and ".." in file.split("/"):
        raise HubReferenceError(f"{text!r}: the file must be a path inside the repository")
    return HubReference(repo=f"{owner}/{name}", revision=revision, file=file)


def source_of_reference(reference: HubReference, families: Mapping[str, FamilyDeclaration]
                        ) -> tuple[WeightsSource, tuple[str, str] | None]:
    """The source an ``hf://`` reference names, with the ``(family, size)`` whose published file it is (else None).

    A registry repository keeps its declaration (licence, pinned sha256, file); any other
    repository's file is checked against the digest the Hub declares. Without a file, the
    repository's single ``.pt`` or ``.safetensors`` file is taken (one request to list it).
    """
    for family, declaration in families.items():
        for size, declared in declaration.sizes.items():
            source = declared.weights
            if (source is not None and source.repo == reference.repo and reference.revision in (None, source.revision)
                    and reference.file in (None, source.file)):
                return source, (family, size)
    file = reference.file or _single_weights_file(reference)
    return WeightsSource(repo=reference.repo, file=file, revision=reference.revision or "main"), None


def _single_weights_file(reference: HubReference) -> str:
    if offline_mode():
        raise HubReferenceError(
            f"{reference} names no file, and HF_HUB_OFFLINE is set so zoo cannot list the repository; name the file: "
            f"{reference}/<file>.pt"
        )
    import huggingface_hub

    try:
        files = list(huggingface_hub.HfApi(endpoint=hub_endpoint()).list_repo_files(reference.repo, revision=reference.revision))
    except Exception as error:  # noqa: BLE001 - every huggingface_hub and network failure becomes a named zoo error
        url = f"{hub_endpoint()}/{reference.repo}"
        raise _named_hub_error(error, label=str(reference), url=url, fresh_hint="name the file in the reference") from None
    candidates = [name for name in files if name.lower().endswith(_CANDIDATE_SUFFIXES)]
    if len(candidates) == 1:
        return candidates[0]
    pt_files = [name for name in candidates if name.lower().endswith(".pt")]
    if len(pt_files) == 1:
        return pt_files[0]
    listing = ", ".join(sorted(candidates)) if candidates else f"no .pt or .safetensors file (files: {', '.join(sorted(files)) or 'none'})"
    raise HubReferenceError(f"{reference} holds {listing}; name one: {reference}/<file>")


# --------------------------------------------------------------------------- errors users read
def not_published(requested: str, family: str, size: str) -> WeightsNotPublishedError:
    """The error for a model nobody publishes weights of, naming the two ways on; ``requested`` opens the message
    (``"LibreFOMOs-point.pt:"``, ``"weights file x.pt does not exist, and"``)."""
    name = canonical_name(family, size)
    return WeightsNotPublishedError(
        f"{requested} no weights are published for {name} (registry.yaml declares no download for it, as LibreYOLO "
        f"1.6 publishes none). Train it from scratch with LibreYOLO({name!r}), or pass the path of a local weights "
        "file you have"
    )


def _by_hand_path(source: WeightsSource) -> Path:
    return weights_dir() / source.file_name


def _offline_error(source: WeightsSource, label: str, reason: str, fresh_hint: str) -> WeightsOfflineError:
    url = source.download_url(hub_endpoint())
    where = f"huggingface_hub's cache {hub_cache_dir()}" if source.on_hub else str(_by_hand_path(source).parent)
    return WeightsOfflineError(
        f"{label} is not in zoo's cache ({where}) and {reason}. It is published at {url}. Download that URL where "
        f"there is a network and put the file at {_by_hand_path(source)} (zoo looks there first), or load a copy with "
        f"LibreYOLO('path/to/{source.file_name}'); or {fresh_hint}"
    )


# --------------------------------------------------------------------------- progress
class DownloadProgress(tqdm):
    """tqdm's bar on a terminal; piped (a log file, a CI job, torchrun's output), one line per 10 %.

    huggingface_hub constructs it with ``total``, ``initial``, ``desc``, ``unit`` and ``unit_scale``.
    ``HF_HUB_DISABLE_PROGRESS_BARS=1`` silences both forms.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        stream = kwargs.get("file") or sys.stderr
        quiet = (os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") or "").strip().upper() in ("1", "ON", "YES", "TRUE")
        self._lines = not quiet and not _is_terminal(stream)
        if quiet or self._lines:
            kwargs["disable"] = True  # tqdm draws nothing; update() below prints the lines
        kwargs.pop("name", None)  # huggingface_hub's own tqdm takes a group name; tqdm does not
        # huggingface_hub describes the bar by its URL, cut to "(…)/<repo>/resolve/<revision>/<file>": the file is the news.
        kwargs["desc"] = str(kwargs.get("desc") or "download").rsplit("/", 1)[-1]
        super().__init__(*args, **kwargs)
        self._stream = stream
        self._label = kwargs["desc"]
        self._size = kwargs.get("total")
        self._received = int(kwargs.get("initial") or 0)
        self._tenths = self._tenth()

    def _tenth(self) -> int:
        return min(10, self._received * 10 // self._size) if self._size else 0

    def update(self, n: float | None = 1) -> bool | None:
        """Advance by ``n`` bytes: the bar, or a line each time another tenth has arrived."""
        if not self._lines:
            return super().update(n)
        self._received += int(n or 0)
        tenth = self._tenth()
        megabytes = (self._size or 0) / 1e6
        while self._tenths < tenth:  # a chunk may cross several tenths: one line for each
            self._tenths += 1
            print(f"{self._label}: {self._tenths * 10}% of {megabytes:.1f} MB", file=self._stream, flush=True)
        return None


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


# --------------------------------------------------------------------------- the cache
def cached_copy(source: WeightsSource) -> Path | None:
    """The file on this machine, without any request: put by hand at ``ZOO_HOME/weights/<file>``, else in the Hub cache.

    A file whose sha256 the registry pins is only used when it has that digest.
    """
    candidates = [_by_hand_path(source)]
    if source.on_hub:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(source.repo, str(source.file), cache_dir=str(hub_cache_dir()), revision=source.revision)
        if isinstance(found, str):
            candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and (source.sha256 is None or sha256_of(candidate) == source.sha256):
            return candidate
    return None


def fetch(source: WeightsSource, *, label: str, fresh_hint: str) -> Path:
    """The local path of ``source``'s file: the cached copy, else downloaded and checked (once per machine).

    ``label`` names the file in messages (``LibreYOLO9s.pt``); ``fresh_hint`` ends the errors (how
    to go on without the file). Raises a ``WeightsError``: ``WeightsOfflineError`` offline,
    ``WeightsNotPublishedError`` for a 404, ``ChecksumMismatchError``, ``IncompleteDownloadError``,
    ``UnexpectedContentError``, ``HubAccessError`` or ``WeightsDownloadError``.
    """
    found = cached_copy(source)
    if found is not None:
        return found
    if offline_mode():
        raise _offline_error(source, label, "HF_HUB_OFFLINE is set", fresh_hint)
    return _once_per_machine(source, label, lambda: cached_copy(source), lambda: _download(source, label, fresh_hint))


def _lock_key(source: WeightsSource) -> str:
    digest = hashlib.sha256(source.describe().encode()).hexdigest()[:16]
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', source.file_name)}.{digest}"


def _once_per_machine(source: WeightsSource, label: str, cached: Callable[[], Path | None],
                      download: Callable[[], Path]) -> Path:
    """``download()`` in the first process to ask; the others wait for it, then take ``cached()`` or its error.

    The lock is released when its holder ends, however it ends (the operating system drops it).
    """
    from filelock import FileLock, Timeout

    locks_dir().mkdir(parents=True, exist_ok=True)
    key = _lock_key(source)
    lock = FileLock(str(locks_dir() / f"{key}.lock"))
    record = locks_dir() / f"{key}.failed.json"
    try:
        lock.acquire(timeout=0)
        waited = False
    except Timeout:
        rank = os.environ.get("LOCAL_RANK")
        who = f"local rank {rank}" if rank is not None else f"process {os.getpid()}"
        print(f"zoo: {who} waits while another process downloads {label} (lock {lock.lock_file})", file=sys.stderr, flush=True)
        lock.acquire()
        waited = True
    try:
        if not waited:
            record.unlink(missing_ok=True)  # an old failure: this process is the first to try again
        elif record.is_file():
            raise _recorded_error(record)  # the download this process waited for failed: the same error, no retry
        found = cached()
        if found is not None:
            return found
        try:
            return download()
        except WeightsError as error:
            _write_record(record, error)
            raise
    finally:
        lock.release()


def _write_record(record: Path, error: WeightsError) -> None:
    try:
        temporary = record.with_name(f".{record.name}.{os.getpid()}")
        temporary.write_text(json.dumps({"class": type(error).__name__, "message": str(error), "pid": os.getpid()}))
        os.replace(temporary, record)
    except OSError:  # a read-only cache: the waiting processes then try the download themselves
        pass


def _recorded_error(record: Path) -> WeightsError:
    try:
        data = json.loads(record.read_text())
        kind = getattr(errors, str(data["class"]), WeightsDownloadError)
        message = str(data["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return WeightsDownloadError(f"another process's download failed and its error record {record} is unreadable")
    if not (isinstance(kind, type) and issubclass(kind, WeightsError)):
        kind = WeightsDownloadError
    return kind(message)


# --------------------------------------------------------------------------- downloading
def _show_licence(source: WeightsSource, label: str) -> None:
    # Only the process that downloads prints it, so a machine shows it once per file, not once per rank.
    if source.licence_notice:
        rule = "-" * 72
        print(f"{rule}\n{label} ({source.licence}): {source.licence_notice}\n{rule}", file=sys.stderr, flush=True)


def _download(source: WeightsSource, label: str, fresh_hint: str) -> Path:
    url = source.download_url(hub_endpoint())
    _show_licence(source, label)
    print(f"zoo: downloading {label} from {url}", file=sys.stderr, flush=True)
    if not source.on_hub:
        assert source.sha256 is not None  # the schema requires it with url
        try:
            return download_weights(url, source.sha256, _by_hand_path(source), fresh_hint=fresh_hint, progress=DownloadProgress)
        except WeightsOfflineError:
            raise _offline_error(source, label, "the server could not be reached (offline?)", fresh_hint) from None
    return _download_from_hub(source, label, url, fresh_hint)


def _download_from_hub(source: WeightsSource, label: str, url: str, fresh_hint: str) -> Path:
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError

    # One HEAD without retries first: huggingface_hub retries a refused connection (no network, a
    # wrong HF_ENDPOINT) for some 20 s before it gives up. A definite answer (404, 401, no network)
    # is named at once; a 5xx or a timeout is left to huggingface_hub's own retries below.
    try:
        huggingface_hub.get_hf_file_metadata(url, endpoint=hub_endpoint(), retry_on_errors=False)
    except Exception as error:  # noqa: BLE001 - sorted below: named now, or left to the download's retries
        status = getattr(getattr(error, "response", None), "status_code", None)
        refused = type(error).__name__ in ("ConnectError", "OfflineModeIsEnabled")
        if refused:
            raise _offline_error(source, label, "the Hub could not be reached (offline?)", fresh_hint) from None
        if isinstance(error, HfHubHTTPError) and status not in (*_TRANSIENT_STATUS, 408, 429):
            raise _named_hub_error(error, label=label, url=url, fresh_hint=fresh_hint, source=source) from None
    for attempt in range(1, _GET_ATTEMPTS + 1):
        try:
            path = Path(huggingface_hub.hf_hub_download(
                source.repo, str(source.file), revision=source.revision, cache_dir=str(hub_cache_dir()),
                endpoint=hub_endpoint(), tqdm_class=DownloadProgress, library_name="zoo", library_version=__version__,
            ))
            break
        except HfHubHTTPError as error:
            status = getattr(getattr(error, "response", None), "status_code", None)
            if status in _TRANSIENT_STATUS and attempt < _GET_ATTEMPTS:
                print(f"zoo: {url} answered HTTP {status}; retrying ({attempt}/{_GET_ATTEMPTS - 1})", file=sys.stderr, flush=True)
                time.sleep(attempt)
                continue
            raise _named_hub_error(error, label=label, url=url, fresh_hint=fresh_hint, source=source) from None
        except Exception as error:  # noqa: BLE001 - huggingface_hub and httpx fail in many ways; each gets a named error
            raise _named_hub_error(error, label=label, url=url, fresh_hint=fresh_hint, source=source) from None
    _verify(path, source, url, fresh_hint)
    return path


def _named_hub_error(error: Exception, *, label: str, url: str, fresh_hint: str,
                     source: WeightsSource | None = None) -> WeightsError:
    """The zoo error for a huggingface_hub (or network) failure while fetching ``url``."""
    from huggingface_hub import errors as hub

    cause = error.__cause__
    if isinstance(error, hub.LocalEntryNotFoundError) and isinstance(cause, (hub.HfHubHTTPError, hub.FileMetadataError)):
        # huggingface_hub reports a failed HEAD (a 404, a 500 after its retries, a non-Hub answer) as "not in the
        # local cache"; the server's own answer is the one to name.
        return _named_hub_error(cause, label=label, url=url, fresh_hint=fresh_hint, source=source)
    status = getattr(getattr(error, "response", None), "status_code", None)
    token_hint = "set HF_TOKEN (or run `hf auth login`) with a token that can read it"
    if isinstance(error, (hub.LocalEntryNotFoundError, hub.OfflineModeIsEnabled)):
        reason = "the Hub could not be reached (offline?)" if isinstance(error, hub.LocalEntryNotFoundError) else "offline mode is on"
        if source is not None:
            return _offline_error(source, label, reason, fresh_hint)
        return WeightsOfflineError(f"{label}: {reason} ({url}); check the network or HF_ENDPOINT, or {fresh_hint}")
    if isinstance(error, hub.GatedRepoError):
        return HubAccessError(f"{url} is in a gated repository: accept its terms on its Hub page, then {token_hint}")
    if isinstance(error, hub.RepositoryNotFoundError):
        return WeightsNotPublishedError(
            f"no weights are published at {url}: the repository does not exist, or it is private (then {token_hint}); "
            f"{fresh_hint}")
    if isinstance(error, (hub.RevisionNotFoundError, hub.EntryNotFoundError)):
        return WeightsNotPublishedError(f"no weights are published at {url} (HTTP {status or 404}); {fresh_hint}")
    if isinstance(error, hub.HfHubHTTPError):
        if status in (401, 403):
            return HubAccessError(f"{url} refused access (HTTP {status}); {token_hint}")
        if status in (404, 410):
            return WeightsNotPublishedError(f"no weights are published at {url} (HTTP {status}); {fresh_hint}")
        return WeightsDownloadError(f"could not download {url} (HTTP {status}); retry later, or {fresh_hint}")
    if isinstance(error, hub.FileMetadataError):
        return UnexpectedContentError(
            f"{url} did not answer like a Hugging Face Hub (no file metadata: a proxy or a login page?). Check "
            f"HF_ENDPOINT and the network, or {fresh_hint}")
    if isinstance(error, hub.HFValidationError):
        return HubReferenceError(f"{label}: {error}")
    text = str(error)
    if isinstance(error, OSError) and "Consistency check failed" in text:
        return IncompleteDownloadError(
            f"the download of {url} ended early ({text.splitlines()[0]}); nothing was kept. Retry, or {fresh_hint}")
    if type(error).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
        return IncompleteDownloadError(
            f"the connection to {url} broke and did not resume ({type(error).__name__}: {text}); nothing was kept. "
            f"Retry, or {fresh_hint}")
    if isinstance(error, OSError):
        return WeightsDownloadError(f"could not download {url} ({type(error).__name__}: {text}); {fresh_hint}")
    return WeightsDownloadError(f"could not download {url} ({type(error).__name__}: {text}); {fresh_hint}")


def _declared_digest(path: Path, url: str) -> str | None:
    """The digest the Hub declares for the file: the name huggingface_hub gave its blob (the ETag), else a HEAD's."""
    blob = path.resolve()
    if blob.parent.name == "blobs":
        return blob.name
    from huggingface_hub import get_hf_file_metadata

    return get_hf_file_metadata(url).etag  # a cache without symlinks: ask again (one HEAD)


def _git_blob_id(path: Path) -> str:
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _looks_like_html(path: Path) -> bool:
    with open(path, "rb") as stream:
        start = stream.read(512).lstrip().lower()
    return start.startswith((b"<!doctype html", b"<html", b"<head", b"<body"))


def _purge(path: Path) -> None:
    """Remove a rejected download from huggingface_hub's cache: its snapshot link and its blob."""
    blob = path.resolve()
    for item in {path, blob}:
        try:
            item.unlink()
        except FileNotFoundError:
            pass


def _verify(path: Path, source: WeightsSource, url: str, fresh_hint: str) -> None:
    """Keep the file only if it is what its publisher declares (see the module docstring)."""
    declared = (source.sha256 or _declared_digest(path, url) or "").strip('"').lower()
    actual, who = "", ""
    if re.fullmatch(r"[0-9a-f]{64}", declared):
        actual, who = sha256_of(path), "the registry pins" if source.sha256 else "the Hub declares (X-Linked-Etag)"
    elif re.fullmatch(r"[0-9a-f]{40}", declared):  # a file kept in git, not LFS: its ETag is the git blob id
        actual, who = _git_blob_id(path), "the Hub declares (its git blob id)"
    if _looks_like_html(path):
        _purge(path)
        raise UnexpectedContentError(
            f"{url} sent an HTML page, not a weights file (a proxy, a login wall or an error page); it was removed "
            f"from the cache. Check the network and HF_ENDPOINT, or {fresh_hint}")
    if actual and actual != declared:
        _purge(path)
        raise ChecksumMismatchError(
            f"the file downloaded from {url} has digest {actual}, but {who} {declared}; it was removed from the cache "
            f"({hub_cache_dir()}). The server may be serving another or a damaged file; retry later, or {fresh_hint}")
