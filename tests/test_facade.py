"""The LibreYOLO facade: name resolution, fresh builds, saving and loading weights, bad files."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
from pathlib import Path

import pytest
import torch

from zoo_core import hookimpl
from zoo_core.errors import (
    ChecksumMismatchError,
    CorruptWeightsError,
    ModelNameError,
    UnsafeWeightsError,
    WeightsDownloadError,
    WeightsMismatchError,
    WeightsNotFoundError,
)
from zoo_core.facade import LibreYOLO
from zoo_core.naming import resolve_model_name
from zoo_core.plugin_manager import get_plugin_manager, register_plugin
from zoo_core.weights import read_safetensors


@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ("resnet18", ("resnet", "18")),
        ("resnet-18", ("resnet", "18")),
        ("ResNet_18", ("resnet", "18")),
        ("LibreResNet18.pt", ("resnet", "18")),
        ("weights/libreresnet101.safetensors", ("resnet", "101")),
        ("convnextv2-atto", ("convnextv2", "atto")),
        ("ConvNeXtV2-H", ("convnextv2", "h")),
        ("convnext-t", ("convnext", "t")),
        ("EfficientNetV2-B3", ("efficientnetv2", "b3")),
        ("mobilenetv4-conv-m", ("mobilenetv4", "m")),
    ],
)
def test_registry_names_resolve_case_insensitively(spelling, expected):
    assert resolve_model_name(spelling, get_plugin_manager().families) == expected


def test_an_unknown_name_suggests_close_ones():
    with pytest.raises(ModelNameError, match="Did you mean .*resnet-18"):
        LibreYOLO("resnet-17x")
    with pytest.raises(ModelNameError, match="no size; choose one of: resnet-18, resnet-34"):
        LibreYOLO("resnet")


def test_a_fresh_model_saves_and_reloads_with_its_metadata(tmp_path):
    torch.manual_seed(0)
    model = LibreYOLO("resnet18", names=["cat", "dog", "bird"])
    assert (model.family, model.size, model.task, model.num_classes) == ("resnet", "18", "classify", 3)
    path = model.save(tmp_path / "pets.safetensors")
    tensors, meta = read_safetensors(path)
    assert meta.family == "resnet" and meta.names == {0: "cat", 1: "dog", 2: "bird"}
    assert meta.input_size == 224 and meta.zoo_version

    again = LibreYOLO(path)
    assert again.names == model.names and again.num_classes == 3
    for key, tensor in model.model.state_dict().items():
        assert torch.equal(tensor, again.model.state_dict()[key]), key
    assert again.info()["weights"] == str(path)


def test_save_refuses_formats_it_cannot_write_to_that_suffix(tmp_path):
    model = LibreYOLO("resnet18", num_classes=2)
    with pytest.raises(ValueError, match=r"\.safetensors"):
        model.save(tmp_path / "model.onnx")
    with pytest.raises(ValueError, match=r"format='libreyolo' to a \.pt path"):
        model.save(tmp_path / "model.pt", format="zoo")


def test_a_plain_state_dict_pt_named_after_its_model_loads(tmp_path):
    source = LibreYOLO("resnet18")
    path = tmp_path / "LibreResNet18.pt"
    torch.save(source.model.state_dict(), path)
    loaded = LibreYOLO(path)
    assert loaded.family == "resnet" and loaded.num_classes == 1000
    assert torch.equal(loaded.model.fc.weight, source.model.fc.weight)


def test_a_zoo_checkpoint_pt_loads_its_metadata(tmp_path):
    source = LibreYOLO("resnet18", names=["a", "b"])
    path = tmp_path / "best.pt"
    torch.save({"model": source.model.state_dict(), "meta": source.meta.to_dict(), "epoch": 3}, path)
    loaded = LibreYOLO(path)
    assert loaded.names == {0: "a", 1: "b"}
    assert torch.equal(loaded.model.fc.bias, source.model.fc.bias)


def test_weights_of_another_size_are_a_named_mismatch(tmp_path):
    path = tmp_path / "resnet34.pt"
    torch.save(LibreYOLO("resnet18", num_classes=2).model.state_dict(), path)
    with pytest.raises(WeightsMismatchError, match=r"named for resnet-34, but its tensors fit no layout .*missing"):
        LibreYOLO(path)


def test_weights_with_lying_metadata_are_a_named_mismatch(tmp_path):
    source = LibreYOLO("resnet18", num_classes=2)
    meta = source.meta.to_dict() | {"family": "convnext", "size": "t"}
    path = tmp_path / "lying.pt"
    torch.save({"model": source.model.state_dict(), "meta": meta}, path)
    with pytest.raises(WeightsMismatchError, match="does not fit convnext-t"):
        LibreYOLO(path)


def test_truncated_files_are_corrupt_not_a_crash(tmp_path):
    model = LibreYOLO("resnet18", num_classes=2)
    good = model.save(tmp_path / "good.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CorruptWeightsError, match="truncated"):
        LibreYOLO(truncated)
    pt = tmp_path / "resnet18.pt"
    torch.save(model.model.state_dict(), pt)
    pt.write_bytes(pt.read_bytes()[:1000])
    with pytest.raises(CorruptWeightsError, match="truncated"):
        LibreYOLO(pt)


def test_a_pickled_module_is_refused_unsafe(tmp_path):
    path = tmp_path / "resnet18.pt"
    torch.save(LibreYOLO("resnet18", num_classes=2).model, path)  # a whole nn.Module: arbitrary pickle
    with pytest.raises(UnsafeWeightsError, match="weights_only=True"):
        LibreYOLO(path)


def test_a_pt_that_is_not_a_state_dict_is_corrupt(tmp_path):
    path = tmp_path / "resnet18.pt"
    torch.save({"model": {"conv1.weight": "not a tensor"}}, path)
    with pytest.raises(CorruptWeightsError, match="not a state dict"):
        LibreYOLO(path)
    torch.save([1, 2, 3], path)
    with pytest.raises(CorruptWeightsError, match="holds a list"):
        LibreYOLO(path)


def test_a_missing_file_without_a_registry_url_says_how_to_build_fresh(tmp_path):
    with pytest.raises(WeightsNotFoundError, match=r"LibreYOLO\('yolo7-tiny'\)"):
        LibreYOLO(tmp_path / "LibreYOLO7tiny.pt")  # yolo7-tiny: nobody publishes weights of it
    with pytest.raises(WeightsNotFoundError, match="does not exist"):
        LibreYOLO(tmp_path / "holiday-photos.pt")


# --------------------------------------------------------------------------- downloads
class _Serve(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture
def zoo_home(tmp_path, monkeypatch):
    """A cache of this test's own, so downloads never leak between tests."""
    home = tmp_path / "zoo_home"
    monkeypatch.setenv("ZOO_HOME", str(home))
    return home


@pytest.fixture
def online(monkeypatch):
    """Downloads allowed (conftest switches them off with HF_HUB_OFFLINE): these tests serve from 127.0.0.1."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.fixture
def http_server(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    handler = lambda *a, **k: _Serve(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def declare_downloadable(url: str, sha256: str) -> None:
    class Downloadable:
        @hookimpl
        def zoo_families(self):
            return [{
                "name": "dlnet", "display": "DLNet", "task": "classify",
                "builder": "zoo_core.timm_families:build_timm_classifier",
                "published_num_classes": 1000, "name_patterns": ["libredlnet{size}"],
                "sizes": {"18": {"input_size": 224, "params": 11689512, "params_source": "resnet18",
                                 "config": {"timm_name": "resnet18"},
                                 "weights": {"url": url, "sha256": sha256}}},
            }]

    register_plugin(Downloadable(), "dlnet")


def published_file(root: Path) -> tuple[Path, str]:
    source = LibreYOLO("resnet18", num_classes=1000)
    source.family = "dlnet"  # metadata of the published file names its own family
    path = source.save(root / "LibreDLNet18.safetensors")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_missing_registry_file_is_downloaded_and_verified(http_server, zoo_home, tmp_path, online):
    root, base = http_server
    served, digest = published_file(root)
    declare_downloadable(f"{base}/{served.name}", digest)
    model = LibreYOLO(tmp_path / "LibreDLNet18.safetensors")
    cached = zoo_home / "weights" / "LibreDLNet18.safetensors"
    assert model.weights_path == cached and cached.read_bytes() == served.read_bytes()
    assert model.family == "dlnet"
    assert not list(cached.parent.glob(".*.tmp"))


def test_a_wrong_checksum_is_rejected_and_nothing_is_kept(http_server, zoo_home, tmp_path, online):
    root, base = http_server
    served, _ = published_file(root)
    declare_downloadable(f"{base}/{served.name}", "0" * 64)
    with pytest.raises(ChecksumMismatchError, match="expects 0000"):
        LibreYOLO(tmp_path / "LibreDLNet19.safetensors".replace("19", "18"))
    assert not list((zoo_home / "weights").glob("*DLNet*"))
    assert not list((zoo_home / "weights").glob(".*"))


def test_a_server_that_is_down_gives_the_fresh_build_hint(zoo_home, tmp_path, online):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    declare_downloadable(f"http://127.0.0.1:{port}/LibreDLNet18.safetensors", "1" * 64)
    with pytest.raises(WeightsDownloadError, match=r"offline.*LibreYOLO\('dlnet-18'\)"):
        LibreYOLO(tmp_path / "LibreDLNet18.safetensors")
    assert not list((zoo_home / "weights").glob("*"))


def test_predict_and_val_run_a_fused_copy_that_follows_the_weights():
    """yolo9-t: the inference model has no BatchNorm and no PGI branch, gives the training graph's outputs, leaves the
    caller's model as it was, is made once, and is made again when the weights change (in place or replaced)."""
    torch.manual_seed(0)
    model = LibreYOLO("yolo9-t", options={"pgi": True})
    model.model.train()
    fused = model.inference_model("cpu")
    assert not any(isinstance(module, torch.nn.BatchNorm2d) for module in fused.modules())
    assert fused.auxiliary_branch is None and model.model.auxiliary_branch is not None and model.model.training
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        expected = model.model.eval()(images)
        for name, tensor in fused(images).items():
            torch.testing.assert_close(tensor, expected[name], atol=1e-4, rtol=1e-4, msg=name)
    assert model.inference_model("cpu") is fused  # cached
    with torch.no_grad():
        next(model.model.parameters()).add_(1.0)  # what an optimizer step does
    refreshed = model.inference_model("cpu")
    assert refreshed is not fused
    first = next(iter(expected))
    with torch.no_grad():
        assert not torch.allclose(refreshed(images)[first], fused(images)[first])  # the new weights are in it
    model.model.load_state_dict(model.model.state_dict())  # copies in place: the versions move on
    assert model.inference_model("cpu") is not refreshed
