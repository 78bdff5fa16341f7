"""Published weights: names that resolve, LibreYOLO's URLs, downloads from a Hub on 127.0.0.1, once per machine.

Nothing here reaches the internet. The URL oracle runs LibreYOLO 1.6's own routing with its
downloader replaced by a recorder (it computes URLs without a request); every download test
serves real LibreYOLO checkpoints from ``tests/hub_server.py`` through ``HF_ENDPOINT``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import zoo_core.facade
from zoo_core.cli import main
from zoo_core.engine.distributed import find_free_port
from zoo_core.errors import (
    ChecksumMismatchError,
    IncompleteDownloadError,
    UnexpectedContentError,
    WeightsError,
    WeightsNotPublishedError,
    WeightsOfflineError,
)
from zoo_core.facade import LibreYOLO
from zoo_core.published_weights import HubReference, fetch, hub_cache_dir, parse_hub_reference, weights_dir
from zoo_core.registry import WeightsSource, load_registry

from .hub_server import HubServer
from .oracle_cases import build_libreyolo
from .support import script_environment, torchrun_command

pytest.importorskip("libreyolo", reason="LibreYOLO 1.6 is in the test extra: pip install -e '.[test]'")
pytestmark = pytest.mark.timeout(300)

YOLO9T = ("LibreYOLO/LibreYOLO9t", "LibreYOLO9t.pt")
TINY = ("someone/fomo-finetuned", "LibreFOMOs-point.pt")  # any Hub repository holding a LibreYOLO file


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Real LibreYOLO 1.6 checkpoints, made once: yolo9-t (3 classes, 8 MB) and fomo-s (62 K parameters)."""
    folder = tmp_path_factory.mktemp("checkpoints")
    made = {}
    for family, size, name in (("yolo9", "t", YOLO9T[1]), ("fomo", "s", TINY[1])):
        build_libreyolo(family, size).save(str(folder / name))
        made[name] = (folder / name).read_bytes()
    return made


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, checkpoints: dict[str, bytes]):
    """A Hub on 127.0.0.1 serving yolo9-t and a fomo-s, as ``HF_ENDPOINT``, with a cache of this test's own."""
    import huggingface_hub.constants as constants

    server = HubServer().start()
    server.add(*YOLO9T, checkpoints[YOLO9T[1]])
    server.add(*TINY, checkpoints[TINY[1]])
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "zoo_home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # huggingface_hub reads these when it is first imported; this process may have imported it offline.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 20)  # several chunks a file: a cut connection resumes mid-file
    yield server
    server.stop()


def cached_files(root: Path) -> list[str]:
    """Every file under the hub cache's blobs and snapshots, and ZOO_HOME/weights' own files."""
    hub = [str(path.relative_to(root)) for path in root.rglob("*") if path.is_file() and ("blobs" in path.parts or "snapshots" in path.parts)]
    return hub + [path.name for path in root.parent.glob("*") if path.is_file()]


# --------------------------------------------------------------------------- the URL oracle (no network)
class _Resolved(Exception):
    """Raised by the recording fetch: the facade got as far as the download."""


def test_every_libreyolo_name_resolves_to_the_url_libreyolo_computes(monkeypatch, tmp_path, capsys):
    from libreyolo.utils import download

    def no_network(*args, **kwargs):
        raise AssertionError("the URL oracle must not open a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    recorded: list[str] = []
    monkeypatch.setattr(download, "download_url_to_path", lambda url, path, verify=None: recorded.append(url))
    zoo_urls: list[str] = []

    def fetch_recorder(source: WeightsSource, *, label: str, fresh_hint: str) -> Path:
        zoo_urls.append(source.download_url())
        raise _Resolved

    monkeypatch.setattr(zoo_core.facade, "fetch", fetch_recorder)

    def libreyolo_url(name: str) -> str | None:
        recorded.clear()
        try:
            download.download_weights(str(tmp_path / "weights" / name), "unused")  # LibreYOLO's own routing
        except ValueError:  # "Could not determine download URL": LibreYOLO publishes nothing under that name
            return None
        return recorded[0]

    def zoo_url(name: str) -> str:
        zoo_urls.clear()
        with pytest.raises(_Resolved):
            LibreYOLO(name)
        return zoo_urls[0]

    families = load_registry()
    cases = [(source.file_name, [source.file_name, *source.names]) for declaration in families.values()
             for source in (size.weights for size in declaration.sizes.values()) if source is not None]
    assert len(cases) == 105  # 102 Hub files and three YOLO-NAS files on Deci's CDN
    names = spellings = agreed = 0
    for canonical, published in cases:
        expected = libreyolo_url(canonical)
        assert expected is not None, canonical
        for name in dict.fromkeys([*published, canonical.lower(), canonical.upper()]):
            assert libreyolo_url(name) == expected, name  # LibreYOLO's own spellings (any case) agree among themselves
        short = [name[len("Libre"):] for name in published if name.lower().startswith("libre")]  # zoo's YOLO9s.pt
        for spelling in dict.fromkeys([*published, canonical.lower(), canonical.upper(), *short]):
            got = zoo_url(spelling)
            assert got == expected, f"{spelling}: zoo {got} != LibreYOLO {expected}"
            names += spelling in published
            spellings += 1
            agreed += spelling in published and got == expected
    # The names LibreYOLO publishes nothing under: zoo says so, and how to go on.
    for unpublished in ("LibreFOMOs-point.pt", "LibreFOMOm-point.pt", "LibreFOMOl-point.pt"):
        assert libreyolo_url(unpublished) is None
        with pytest.raises(WeightsNotPublishedError, match=r"no weights are published for fomo-.*LibreYOLO\('fomo-.'\).*local weights file"):
            LibreYOLO(unpublished)
    with pytest.raises(WeightsNotPublishedError, match=r"LibreYOLO\('yolo7-tiny'\)"):
        LibreYOLO("LibreYOLO7tiny.pt")
    with pytest.raises(WeightsNotPublishedError, match=r"pretrained=True.*fomo-s"):
        LibreYOLO("fomo-s", pretrained=True)
    with capsys.disabled():
        print(f"\n{agreed}/{names} names resolve as LibreYOLO's ({spellings} spellings with the case variants and "
              "zoo's short forms, all to LibreYOLO's URL)")
    assert agreed == names == 144  # LibreYOLO 1.6's file names and aliases for the families, FOMO's three aside


def test_the_registry_names_a_hub_file_for_every_libreyolo_download():
    declared = {(family, size): declaration.size(size).weights for family, declaration in load_registry().items()
                for size in declaration.sizes}
    unpublished = sorted(key for key, source in declared.items() if source is None)
    # yolo9_seg: LibreYOLO hosts none; the one release (WongKinYiu's gelan-c-seg.pt) pickles its model
    # classes, so it loads as a state dict (saved with the upstream code) through the converter.
    # rtmdet_ins: LibreYOLO's -seg files exist, but where it hosts them could not be confirmed offline, so no
    # Hub file is pinned yet (a pinned file must have a checked sha256).
    assert unpublished == [("fomo", "l"), ("fomo", "m"), ("fomo", "s"), *[("rtmdet_ins", size) for size in "lmstx"],
                           ("yolo7", "tiny"), ("yolo7", "x"), *[("yolo9_seg", size) for size in ("c", "m", "s", "t")]]
    hub = [source for source in declared.values() if source is not None and source.on_hub]
    assert len(hub) == 102 and all(source.repo == f"LibreYOLO/{source.file_name[:-3]}" for source in hub)
    nas = declared[("yolonas", "s")]
    assert nas is not None and nas.sha256 and nas.licence_notice and "LibreYOLONASs.pt" in nas.names


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"repo": "a/b"}, "needs the file"),
        ({"url": "https://example.org/y.pt"}, "'sha256' is required with url"),
        ({"repo": "a/b", "file": "f.pt", "url": "https://example.org/f.pt", "sha256": "0" * 64}, "either repo"),
        ({"repo": "not a repo", "file": "f.pt"}, "owner/name"),
        ({"repo": "a/b", "file": "../f.pt"}, "relative path"),
        ({"repo": "a/b", "file": "f.pt", "names": ["notes.txt"]}, "ending in"),
    ],
)
def test_a_weights_entry_is_one_hub_file_or_one_checked_url(fields, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        WeightsSource(**fields)


def test_train_takes_pretrained_as_a_bool():
    from zoo_core.errors import TrainConfigError

    with pytest.raises(TrainConfigError, match="pretrained='yes'"):
        LibreYOLO("resnet18").train(pretrained="yes", data="shapes")


# --------------------------------------------------------------------------- downloads
def test_first_download_then_the_cache_without_a_request(hub, capfd):
    model = LibreYOLO("LibreYOLO9t.pt")
    assert (model.family, model.size, model.num_classes) == ("yolo9", "t", 3)
    assert hub_cache_dir() in model.weights_path.parents
    assert [request.method for request in hub.requests] == ["HEAD", "HEAD", "GET"]  # zoo's quick look, huggingface_hub's, the file
    err = capfd.readouterr().err
    assert "downloading LibreYOLO9t.pt from " + hub.url in err
    progress = [line for line in err.splitlines() if line.startswith("LibreYOLO9t.pt: ")]
    assert progress == [f"LibreYOLO9t.pt: {tenth}0% of 8.1 MB" for tenth in range(1, 11)]  # piped: a line per 10 %
    hub.requests.clear()
    for again in (LibreYOLO("YOLO9t.pt"), LibreYOLO("yolo9-t", pretrained=True), LibreYOLO("hf://LibreYOLO/LibreYOLO9t")):
        assert again.weights_path == model.weights_path
    assert hub.requests == []  # cached: not even a HEAD


def test_a_cut_connection_resumes_and_a_500_is_retried(hub):
    hub.faults = ["cut", "500"]
    model = LibreYOLO("LibreYOLO9t.pt")  # the first GET breaks halfway, its resume gets a 500, then zoo retries
    gets = hub.gets()
    assert len(gets) == 3 and gets[0].range is None and gets[1].range is not None and gets[1].range.startswith("bytes=")
    assert model.family == "yolo9"


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        ("wrong", ChecksumMismatchError, "the Hub declares"),
        ("short", IncompleteDownloadError, "ended early"),
        ("html", UnexpectedContentError, "sent an HTML page"),
    ],
)
def test_a_bad_download_leaves_nothing_and_names_the_url(hub, fault, error, message):
    hub.always = {fault}
    with pytest.raises(error, match=message) as caught:
        LibreYOLO("LibreYOLO9t.pt")
    assert f"{hub.url}/LibreYOLO/LibreYOLO9t/resolve/main/LibreYOLO9t.pt" in str(caught.value)
    assert cached_files(hub_cache_dir()) == []
    hub.always = set()
    assert LibreYOLO("LibreYOLO9t.pt").family == "yolo9"  # nothing bad was kept: the next call downloads afresh


def test_a_captive_portal_is_not_a_hub(hub):
    hub.always = {"portal"}
    with pytest.raises(UnexpectedContentError, match="did not answer like a Hugging Face Hub"):
        LibreYOLO("LibreYOLO9t.pt")
    assert cached_files(hub_cache_dir()) == []


def test_a_404_is_not_published(hub):
    with pytest.raises(WeightsNotPublishedError, match=r"no weights are published at .*LibreYOLO9s.pt.*LibreYOLO\('yolo9-s'\)"):
        LibreYOLO("LibreYOLO9s.pt")  # the server has no such repository
    hub.add("LibreYOLO/LibreYOLO9s", "other.pt", b"x")
    with pytest.raises(WeightsNotPublishedError, match=r"HTTP 404"):
        LibreYOLO("YOLO9s.pt")  # the repository is there, the file is not


def test_offline_an_empty_cache_is_one_named_error_and_a_cached_file_loads(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsOfflineError) as caught:
        LibreYOLO("LibreYOLO9t.pt")
    message = str(caught.value)
    for part in ("LibreYOLO9t.pt", "HF_HUB_OFFLINE", f"{hub.url}/LibreYOLO/LibreYOLO9t/resolve/main/LibreYOLO9t.pt",
                 str(hub_cache_dir()), str(weights_dir() / "LibreYOLO9t.pt")):
        assert part in message, part
    assert hub.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    downloaded = LibreYOLO("LibreYOLO9t.pt").weights_path
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.requests.clear()
    assert LibreYOLO("LibreYOLO9t.pt").weights_path == downloaded and hub.requests == []
    # A file put by hand where the error says is used first.
    by_hand = weights_dir() / "LibreYOLO9t.pt"
    by_hand.write_bytes(downloaded.read_bytes())
    assert LibreYOLO("YOLO9t.pt").weights_path == by_hand


def test_an_unreachable_hub_is_the_offline_error_at_once(hub, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed}")
    started = time.monotonic()
    with pytest.raises(WeightsOfflineError, match=r"could not be reached \(offline\?\).*LibreYOLO\('yolo9-t'\)"):
        LibreYOLO("LibreYOLO9t.pt")
    assert time.monotonic() - started < 10  # not huggingface_hub's 20 s of retries


def test_hf_references_load_any_repositorys_file(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    model = LibreYOLO("hf://someone/fomo-finetuned/LibreFOMOs-point.pt")
    assert (model.family, model.size) == ("fomo", "s")
    assert {request.authorization for request in hub.requests} == {"Bearer hf_test_token"}
    hub.requests.clear()
    assert LibreYOLO("hf://someone/fomo-finetuned").weights_path == model.weights_path  # one listing, then the cache
    assert [request.method for request in hub.requests] == ["GET"] and "/tree/" in hub.requests[0].path
    assert parse_hub_reference("hf://a/b@v1.0/sub/f.pt") == HubReference("a/b", "v1.0", "sub/f.pt")
    assert parse_hub_reference("LibreYOLO9s.pt") is None


def test_a_non_permissive_licence_is_shown_once_at_the_first_download(hub, capfd):
    source = WeightsSource(repo=YOLO9T[0], file=YOLO9T[1], licence="Example terms (non-commercial)",
                           licence_notice="for research only")
    first = fetch(source, label="LibreYOLO9t.pt", fresh_hint="")
    assert "LibreYOLO9t.pt (Example terms (non-commercial)): for research only" in capfd.readouterr().err
    assert fetch(source, label="LibreYOLO9t.pt", fresh_hint="") == first
    assert "for research only" not in capfd.readouterr().err


def published_rows() -> list[str]:
    """The rows of docs/weights.md's table of published weights, from the registry."""
    rows = []
    for family, declaration in load_registry().items():
        for size, declared in declaration.sizes.items():
            source = declared.weights
            if source is not None:
                names = ", ".join(f"`{name}`" for name in dict.fromkeys([source.file_name, *source.names]))
                rows.append(f"| {declaration.display} (`{family}`) | `{family}-{size}` | {names} | {source.describe()} | {source.licence} |")
    return rows


def test_the_docs_table_of_published_weights_is_the_registrys():
    text = (Path(__file__).resolve().parent.parent / "docs" / "weights.md").read_text()
    missing = [row for row in published_rows() if row not in text]
    assert not missing, "docs/weights.md's table of published weights differs from registry.yaml; its rows should be:\n" + "\n".join(missing)


def test_zoo_info_and_list_show_the_published_weights(capsys):
    assert main(["info", "yolonas"]) == 0
    output = capsys.readouterr().out
    assert "yolo_nas_s_coco.pth" in output and "Deci YOLO-NAS licence" in output
    assert main(["info", "yolo7"]) == 0
    output = capsys.readouterr().out
    assert "hf://LibreYOLO/LibreYOLO7b/LibreYOLO7b.pt" in output and "no published weights: tiny, x" in output
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "WEIGHTS" in lines[0] and " 1/3 " in next(line for line in lines if line.startswith("yolo7 "))


# --------------------------------------------------------------------------- once per machine
SCRIPT = '''
import json, os, sys
from zoo_core import LibreYOLO
from zoo_core.errors import WeightsError

if __name__ == "__main__":
    name, out = sys.argv[1], sys.argv[2]
    rank = os.environ.get("RANK") or sys.argv[3]
    try:
        model = LibreYOLO(name)
        report = {"weights": str(model.weights_path), "model": model.name}
    except WeightsError as error:  # recorded, not raised: torchrun would stop the other rank on a failure
        report = {"error": type(error).__name__, "message": str(error)}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as stream:
        json.dump(report, stream)
'''


@pytest.fixture
def workspace(tmp_path: Path, hub: HubServer) -> tuple[Path, dict[str, str]]:
    (tmp_path / "load.py").write_text(SCRIPT)
    (tmp_path / "out").mkdir()
    env = script_environment({"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "", "HF_HUB_DISABLE_TELEMETRY": "1",
                              "HF_HOME": str(tmp_path / "hf_home"), "ZOO_HOME": os.environ["ZOO_HOME"]})
    return tmp_path, env


def reports(folder: Path) -> list[dict]:
    return [json.loads((folder / "out" / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def concurrently(workspace: tuple[Path, dict[str, str]], hub: HubServer, name: str) -> list[dict]:
    """Two processes load ``name`` at once; the served GET is held until the second one waits for the first."""
    folder, env = workspace
    hub.gate = threading.Event()
    logs = [folder / f"process{index}.log" for index in (0, 1)]
    streams = [log.open("w") for log in logs]
    processes = [subprocess.Popen([sys.executable, "load.py", name, "out", str(index)], cwd=folder, env=env,
                                  stdout=stream, stderr=subprocess.STDOUT) for index, stream in enumerate(streams)]
    try:
        deadline = time.monotonic() + 120
        while not any("waits while another process downloads" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(p.poll() is None for p in processes), [log.read_text() for log in logs]
            time.sleep(0.1)
        hub.gate.set()  # the first process's GET may go on now
        for process in processes:
            process.wait(timeout=120)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for stream in streams:
            stream.close()
    assert [process.returncode for process in processes] == [0, 0], [log.read_text() for log in logs]
    return reports(folder)


def test_two_processes_at_once_download_once(workspace, hub):
    first, second = concurrently(workspace, hub, "LibreYOLO9t.pt")
    assert first == second and first["model"] == "yolo9-t"
    assert len(hub.gets(YOLO9T[1])) == 1


def test_a_failed_download_reaches_the_waiting_process_as_the_same_error(workspace, hub):
    hub.always = {"wrong"}
    first, second = concurrently(workspace, hub, "LibreYOLO9t.pt")
    assert first == second and first["error"] == "ChecksumMismatchError"
    assert len(hub.gets(YOLO9T[1])) == 1  # the waiting process did not try again


def torchrun(workspace: tuple[Path, dict[str, str]], name: str) -> list[dict]:
    folder, env = workspace
    command = [*torchrun_command("--nproc_per_node=2", f"--master_port={find_free_port()}"), "load.py", name, "out", "-"]
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    return reports(folder)


def test_torchrun_ranks_download_once_and_load_the_same_file(workspace, hub):
    rank0, rank1 = torchrun(workspace, "LibreYOLO9t.pt")
    assert rank0 == rank1 and rank0["model"] == "yolo9-t"
    assert len(hub.gets(YOLO9T[1])) == 1
    heads = len([request for request in hub.requests if request.method == "HEAD"])
    print(f"torchrun, 2 ranks: {len(hub.gets(YOLO9T[1]))} GET and {heads} HEAD of {YOLO9T[1]}")


def test_torchrun_ranks_all_raise_the_download_error_instead_of_hanging(workspace, hub):
    rank0, rank1 = torchrun(workspace, "LibreYOLO9s.pt")  # not on the server: a 404
    assert rank0 == rank1 and rank0["error"] == "WeightsNotPublishedError"


def test_train_pretrained_on_two_spawned_ranks_downloads_once_in_the_parent(hub, capfd):
    model = LibreYOLO("yolo9-t")
    result = model.train(pretrained=True, data="shapes:train=8,val=4,size=64", epochs=1, imgsz=64, batch=4, workers=0,
                         plots=False, device="cpu,cpu")
    assert result.world_size == 2 and model.num_classes == 4 and model.weights_path == result.best
    heads = len([request for request in hub.requests if request.method == "HEAD"])
    assert len(hub.gets(YOLO9T[1])) == 1 and heads == 2  # zoo's quick HEAD and huggingface_hub's, in the parent only
    out = capfd.readouterr().out
    assert "yolo9-t: 3 -> 4 classes; kept" in out and "of LibreYOLO9t.pt, re-initialised" in out
    assert "randomly initialised" not in out
    print(f"spawn, 2 ranks: {len(hub.gets(YOLO9T[1]))} GET and {heads} HEAD of {YOLO9T[1]}")


def test_a_fresh_model_says_it_is_randomly_initialised(tmp_path, capsys):
    from zoo_core.engine.rank import adapt_to_dataset
    from zoo_core.plugin_manager import get_plugin_manager
    from zoo_core.tasks.base import DataSpec

    data = DataSpec(task="classify", root=tmp_path, names={0: "a", 1: "b"}, train=None, val=None)
    fresh = LibreYOLO("resnet18", num_classes=3)
    adapt_to_dataset(fresh.spec(), data, get_plugin_manager(), seed=0, report=True)
    out = capsys.readouterr().out
    assert "resnet-18: randomly initialised (built fresh, no weights file), 2 classes" in out and "kept" not in out
    fresh.save(tmp_path / "mine.safetensors")
    loaded = LibreYOLO(tmp_path / "mine.safetensors")
    adapt_to_dataset(loaded.spec(loaded.weights_path), data, get_plugin_manager(), seed=0, report=True)
    out = capsys.readouterr().out
    assert "3 -> 2 classes; kept 120 of 122 tensors of mine.safetensors" in out and "randomly" not in out


def test_a_loaded_model_logs_its_file_and_source(hub, caplog):
    with caplog.at_level("INFO", logger="zoo.weights"):
        LibreYOLO("LibreYOLO9t.pt")
    assert any("yolo9-t: weights loaded from" in record.getMessage()
               and "published as hf://LibreYOLO/LibreYOLO9t/LibreYOLO9t.pt" in record.getMessage() for record in caplog.records)


def test_weights_errors_are_one_hierarchy():
    for error in (ChecksumMismatchError, IncompleteDownloadError, UnexpectedContentError, WeightsNotPublishedError,
                  WeightsOfflineError):
        assert issubclass(error, WeightsError)
