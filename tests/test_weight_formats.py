"""Weights users already have load into zoo: upstream releases, timm and torchvision state dicts,
LibreYOLO checkpoints; bad files get errors that name the file, what it is and what to do.
(The LibreYOLO round trips of every family are tests/test_libreyolo_oracle.py.)"""

from __future__ import annotations

import pytest
import torch

from zoo_core import LibreYOLO
from zoo_core.errors import CorruptWeightsError, UnsafeWeightsError, WeightsError, WeightsMismatchError, WeightsNotFoundError
from zoo_core.key_renaming import KeyRenamer

from .oracle_cases import build_libreyolo
from .support import write_class_folders

libreyolo = pytest.importorskip("libreyolo", reason="LibreYOLO 1.6 is in the test extra: pip install -e '.[test]'")


def same_outputs(first: torch.Tensor, second: torch.Tensor) -> bool:
    return bool(torch.allclose(first, second, atol=1e-4, rtol=1e-6))


# --------------------------------------------------------------------------- the renaming rules
def test_key_renamer_goes_both_ways_and_matches_whole_segments():
    renamer = KeyRenamer([(".conv.weight$", ".0.weight$"), (".m.{j}.cv1.", ".bottlenecks.{j}.rep_conv."), ("cv1", "split")])
    for foreign, zoo in [("a.m.3.cv1.conv.weight", "a.bottlenecks.3.rep_conv.0.weight"), ("x.cv1.y", "x.split.y"),
                         ("x.cv10.y", "x.cv10.y")]:
        assert renamer.key_to_zoo(foreign) == zoo and renamer.key_from_zoo(zoo) == foreign
    with pytest.raises(ValueError, match="maps both"):
        renamer.to_zoo({"cv1": 1, "split": 2})


# --------------------------------------------------------------------------- upstream releases
def test_yolo9_loads_the_numbered_layout_of_the_mit_upstream_release(tmp_path):
    from libreyolo import LibreYOLO9
    from zoo_yolo9.convert import UPSTREAM_KEYS

    reference = build_libreyolo("yolo9", "t")
    # The numbered layout of MultimediaTechLab/YOLO, written from LibreYOLO's names by our rules...
    upstream = UPSTREAM_KEYS.from_zoo(reference.model.state_dict())
    for key in ("0.conv.weight", "3.conv.conv.weight", "4.conv2.0.bottleneck.0.conv1.conv1.conv.weight", "9.conv5.bn.weight",
                "22.heads.0.class_conv.2.weight", "22.heads.2.anchor_conv.2.bias"):
        assert key in upstream, key  # keys of the published v9-t layout
    # ...and read back to LibreYOLO's names by LibreYOLO's own, independent converter.
    assert set(LibreYOLO9.convert_upstream_state_dict(dict(upstream))) == set(reference.model.state_dict())
    upstream["22.heads.0.anc2vec.anc2vec.weight"] = torch.arange(16.0).reshape(1, 16, 1, 1, 1)  # the fixed DFL projection
    path = tmp_path / "v9-t.pt"
    torch.save(upstream, path)
    model = LibreYOLO(path, architecture="yolo9-t")
    assert (model.family, model.size, model.num_classes) == ("yolo9", "t", 3)
    images = torch.rand(1, 3, 96, 96)
    with torch.no_grad():
        ours = model.model.eval()(images)
        theirs = reference.model(images)["predictions"]
    assert same_outputs(ours["scores"], theirs[:, 4:].transpose(1, 2)) and same_outputs(ours["boxes"], theirs[:, :4].transpose(1, 2))


@pytest.mark.parametrize(("size", "expected_size", "container"), [("s", "s", "params"), ("s_sidd", "s_sidd", "params_ema")])
def test_nafnet_loads_the_official_release_dicts_and_finds_the_layout_from_the_tensors(tmp_path, size, expected_size, container):
    source = LibreYOLO(f"nafnet-{size}")
    official = source._manager.convert_weights("nafnet", size, source.model.state_dict(), "zoo", "upstream").state_dict
    path = tmp_path / "NAFNet-width32.pth"
    torch.save({container: official}, path)
    model = LibreYOLO(path, architecture="nafnet-s")  # the layout decides s or s_sidd, as LibreYOLO does
    assert model.size == expected_size
    images = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        assert same_outputs(model.model.eval()(images), source.model.eval()(images))


def test_classifiers_load_timm_and_torchvision_state_dicts(tmp_path):
    import timm
    import torchvision

    cases = [
        ("resnet18.pth", torchvision.models.resnet18(num_classes=7), "resnet", 7),  # torchvision: timm's keys
        ("convnext-t.pth", torchvision.models.convnext_tiny(num_classes=5), "convnext", 5),  # converted
        ("efficientnetv2-b0.pth", timm.create_model("tf_efficientnetv2_b0", num_classes=3), "efficientnetv2", 3),
    ]
    images = torch.rand(2, 3, 64, 64)
    for name, reference, family, classes in cases:
        torch.save(reference.state_dict(), tmp_path / name)
        model = LibreYOLO(tmp_path / name)
        assert (model.family, model.num_classes) == (family, classes), name  # classes read from the tensors
        with torch.no_grad():
            assert same_outputs(model.model.eval()(images), reference.eval()(images)), name


# --------------------------------------------------------------------------- errors
def test_a_libreyolo_file_of_a_family_zoo_lacks_names_it_and_lists_the_families(tmp_path):
    path = tmp_path / "sam.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "schema_version": "1.0", "libreyolo_version": "1.6.0", "model_family": "sam",
                "size": "b", "task": "segment", "nc": 1, "names": {0: "object"}, "imgsz": 1024}, path)
    with pytest.raises(WeightsMismatchError, match=r"LibreYOLO 1.0 checkpoint of sam-b.*no family 'sam'.*yolo9"):
        LibreYOLO(path)


def test_tensors_that_fit_no_layout_name_the_file_the_format_and_the_first_keys(tmp_path):
    path = tmp_path / "resnet18.pt"
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7), "stranger.weight": torch.zeros(3)}, path)
    with pytest.raises(WeightsMismatchError) as caught:
        LibreYOLO(path)
    message = str(caught.value)
    assert str(path) in message and "state dict without metadata" in message and "missing" in message


def test_files_that_are_not_weights_get_a_named_error(tmp_path):
    (tmp_path / "notes.pt").write_text("these are my notes, not weights\n")
    (tmp_path / "noise.pt").write_bytes(bytes(range(256)) * 40)
    (tmp_path / "folder.pt").mkdir()
    for name in ("notes.pt", "noise.pt"):
        with pytest.raises(CorruptWeightsError, match=str(tmp_path / name)):
            LibreYOLO(tmp_path / name)
    with pytest.raises(WeightsNotFoundError, match="is a directory"):
        LibreYOLO(tmp_path / "folder.pt")
    torch.save({"model": {"w": torch.zeros(1)}, "optimizer": object.__new__(torch.nn.Module)}, tmp_path / "pickled.pt")
    with pytest.raises(UnsafeWeightsError, match=r"pickled Python objects or code \(it imports torch.nn.modules.module.Module\)"):
        LibreYOLO(tmp_path / "pickled.pt")


def test_a_state_dict_named_for_nothing_says_how_to_name_its_model(tmp_path):
    torch.save(LibreYOLO("resnet18").model.state_dict(), tmp_path / "my-weights.pt")
    with pytest.raises(WeightsError, match=r"architecture='nafnet-s'"):
        LibreYOLO(tmp_path / "my-weights.pt")
    assert LibreYOLO(tmp_path / "my-weights.pt", architecture="resnet18").family == "resnet"


# --------------------------------------------------------------------------- fine-tuning converted weights
def test_fine_tuning_converted_weights_keeps_every_class_independent_tensor(tmp_path, capfd):
    reference = build_libreyolo("resnet", "18")  # a 10-class LibreYOLO classifier
    reference.save(str(tmp_path / "LibreResNet18.pt"))
    model = LibreYOLO(tmp_path / "LibreResNet18.pt")
    before = {key: value.clone() for key, value in model.model.state_dict().items()}
    data = write_class_folders(tmp_path / "data", per_class=4, val_per_class=1)  # 2 classes
    model.train(data=str(data), epochs=1, batch=4, imgsz=32, device="cpu,cpu", workers=0, optimizer="AdamW", lr0=1e-12,
                warmup_epochs=0, ema=False, plots=False, sync_bn=False)
    assert model.num_classes == 2
    after = model.model.state_dict()
    changed = {key for key, value in after.items() if value.dtype.is_floating_point and "running" not in key
               and (value.shape != before[key].shape or not torch.allclose(value, before[key], atol=1e-6))}
    assert changed == {"fc.weight", "fc.bias"}  # the class-dependent head, re-initialised for 2 classes
    assert "re-initialised the class-dependent ones: fc.weight, fc.bias" in capfd.readouterr().out
