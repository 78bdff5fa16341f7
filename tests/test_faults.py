"""Faults and bad inputs a user meets: each gets a specific error naming the file, key or value and
the fix, or is handled as documented; nothing the user owns is lost (one regression test per case)."""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from zoo_core import LibreYOLO
from zoo_core.cli import main
from zoo_core.data.dataset_yaml import parse_names
from zoo_core.data.errors import DatasetError, DatasetWarning, ProblemReport
from zoo_core.data.images import usable_images
from zoo_core.data.yolo_format import index_detection_split, read_detection_yaml, read_labels
from zoo_core.engine.config import TrainConfig
from zoo_core.engine.launcher import WORKDIR_PREFIX, private_workdir
from zoo_core.errors import (
    ArgumentError,
    BatchSizeError,
    CorruptWeightsError,
    ModelNameError,
    ResumeError,
    RunDirectoryError,
    RunDirectoryInUseError,
    TrainConfigError,
    TrainingDivergedError,
    UnsafeWeightsError,
    WeightsWriteError,
    WorkerFailedError,
)
from zoo_core.paths import process_alive
from zoo_core.testing import isolated_plugin_manager, plugin_distribution_on_path, write_plugin_distribution
from zoo_core.weights import atomic_torch_save, atomic_write, load_torch_file

from .support import alive, script_environment, use_test_families, write_class_folders

pytestmark = pytest.mark.timeout(300)
QUIET = dict(workers=0, verbose=False, plots=False)


@pytest.fixture(autouse=True)
def _families() -> None:
    use_test_families()


# --------------------------------------------------------------------------- training that goes wrong
def test_a_diverging_run_keeps_the_last_finite_checkpoint_and_raises_the_same_error_under_spawn(tmp_path):
    data = write_class_folders(tmp_path / "data")
    model = LibreYOLO("tinynet-s", options={"nan_step": 4})  # steps 1-3 (epoch 1) finite, then NaN
    with pytest.raises(TrainingDivergedError, match=r"epoch 2.*wrote no checkpoint.*last\.pt \(epoch 1\): start a new run"):
        model.train(data=str(data), device="cpu,cpu", epochs=3, batch=8, imgsz=32, max_grad_norm=None, **QUIET)
    (last,) = Path("runs").glob("classify/*/weights/last.pt")
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["epoch"] == 0 and all(value.isfinite().all() for value in checkpoint["model"].values())
    assert torch.equal(LibreYOLO(last).model.state_dict()["head.weight"], checkpoint["model"]["head.weight"])


def test_a_damaged_image_is_skipped_and_counted_in_a_two_rank_run(tmp_path, capfd):
    data = write_class_folders(tmp_path / "data")
    victim = next((data / "train" / "c0").glob("*.png"))
    buffer = victim.with_suffix(".jpg")
    Image.open(victim).save(buffer, quality=95)
    victim.unlink()
    payload = bytearray(buffer.read_bytes())
    third = len(payload) // 3
    payload[third: 2 * third] = b"\x00" * third  # header and end marker fine, the pixels between damaged
    buffer.write_bytes(bytes(payload))
    result = LibreYOLO("tinynet-s").train(data=str(data), device="cpu,cpu", epochs=1, batch=8, imgsz=32, workers=0,
                                          plots=False)
    assert result.epochs_completed == 1
    output = capfd.readouterr()
    assert "skipped 1 damaged image" in output.out and f"{buffer}: cannot decode image" in output.err


def test_one_image_per_rank_with_batchnorm_is_refused_before_training(tmp_path):
    data = write_class_folders(tmp_path / "data")
    with pytest.raises(BatchSizeError, match=r"1 image per step.*BatchNorm.*at least 4.*sync_bn=True"):
        LibreYOLO("tinynet-s").train(data=str(data), device="cpu,cpu", epochs=1, batch=2, imgsz=32, **QUIET)
    assert not list(Path("runs").glob("classify/*/weights/*.pt"))


def test_a_single_class_is_refused_before_training(tmp_path):
    data = write_class_folders(tmp_path / "data")
    shutil.rmtree(data / "train" / "c1")
    with pytest.raises(DatasetError, match=r"only one class folder \('c0'\).*at least two classes"):
        LibreYOLO("tinynet-s").train(data=str(data), device="cpu", epochs=1, batch=4, imgsz=32, **QUIET)


def test_detection_labels_in_a_misnamed_folder_are_an_error_not_a_silent_run(tmp_path):
    root = tmp_path / "boxes"
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "label" / split).mkdir(parents=True)  # should be "labels"
        for index in range(2):
            Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(root / "images" / split / f"{index}.png")
            (root / "label" / split / f"{index}.txt").write_text("0 0.5 0.5 0.3 0.3\n")
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                                    "names": ["box"]}))
    with pytest.raises(DatasetError, match=r"none of the 2 training images has a box.*labels/ folder.*labels/train/0\.txt"):
        LibreYOLO("yolo9-t").train(data=str(root / "data.yaml"), device="cpu", epochs=1, batch=2, imgsz=64, **QUIET)


def _boxes_with_bad_labels(root: Path) -> Path:
    """A detection dataset whose every label line names class 5 of a one-class dataset."""
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for index in range(2):
            Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(root / "images" / split / f"{index}.png")
            (root / "labels" / split / f"{index}.txt").write_text("5 0.5 0.5 0.3 0.3\n")
    (root / "data.yaml").write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val",
                                                    "names": ["box"]}))
    return root / "data.yaml"


def test_when_every_label_line_is_skipped_the_error_says_so_and_why_naming_a_file(tmp_path):
    data = _boxes_with_bad_labels(tmp_path / "boxes")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DatasetWarning)
        with pytest.raises(DatasetError) as raised:
            LibreYOLO("yolo9-t").train(data=str(data), device="cpu", epochs=1, batch=2, imgsz=64, **QUIET)
    message = str(raised.value)
    assert re.search(r"all 2 label lines were skipped \(first: \S*labels/train/0\.txt:1: class id 5 is outside names", message)
    assert "folder's name" not in message and "not empty" not in message  # the folder is right; the lines are not


def _zoo_source_lines() -> set[str]:
    """Every distinctive stripped line of zoo's own source (what warnings would echo under a warning)."""
    lines = set()
    for path in [*(Path(__file__).parents[1] / "zoo_core").rglob("*.py")]:
        lines.update(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if len(line.strip()) > 12)
    return lines


def test_a_skipped_label_line_warns_at_the_users_call_and_echoes_no_line_of_zoo(tmp_path):
    data = _boxes_with_bad_labels(tmp_path / "boxes")
    script = tmp_path / "user_script.py"
    script.write_text(
        "from zoo_core import LibreYOLO\n"
        "from zoo_core.data.errors import DatasetError\n"
        "try:\n"
        f"    LibreYOLO('yolo9-t').train(data={str(data)!r}, device='cpu', epochs=1, batch=2, imgsz=64, workers=0)\n"
        "except DatasetError:\n"
        "    pass\n"
    )
    in_script = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=script_environment(),
                               capture_output=True, text=True, timeout=120)
    # The zoo command has no user frame at all: its warnings carry no location.
    from_cli = subprocess.run([sys.executable, "-m", "zoo_core", "train", "yolo9-t", f"data={data}", "epochs=1", "imgsz=64",
                               "batch=2", "device=cpu", "workers=0"], cwd=tmp_path, env=script_environment(),
                              capture_output=True, text=True, timeout=120)
    zoo_lines = _zoo_source_lines()
    for run, location in ((in_script, f"{script}:4: DatasetWarning: "), (from_cli, "zoo: DatasetWarning: ")):
        warned = [line for line in run.stderr.splitlines() if line.endswith("class id 5 is outside names (0..0); line skipped")]
        assert warned and all(line.startswith(location) for line in warned), run.stderr
        echoed = [line for line in run.stderr.splitlines() if line.strip() in zoo_lines]
        assert not echoed, f"zoo source echoed under a warning: {echoed}"


def test_resume_true_only_continues_a_run_of_the_same_model(tmp_path):
    data = write_class_folders(tmp_path / "data")
    LibreYOLO("tinynet-s").train(data=str(data), device="cpu", epochs=2, batch=8, imgsz=32, **QUIET)
    with pytest.raises(ResumeError, match=r"newest run of nospawnnet-s.*hold other models.*tinynet-s"):
        LibreYOLO("nospawnnet-s").train(data=str(data), resume=True, **QUIET)


def test_ctrl_c_right_after_an_epoch_still_leaves_that_epochs_checkpoint(tmp_path):
    data = write_class_folders(tmp_path / "data")
    script = tmp_path / "long_run.py"
    script.write_text(
        "import sys\n"
        "from zoo_core import LibreYOLO, register_plugin\n"
        "from tests import doubles\n"
        "register_plugin(doubles, 'engine-test-families')\n"
        "if __name__ == '__main__':\n"
        "    LibreYOLO('tinynet-s', options={'width': 1024}).train(data=sys.argv[1], device='cpu,cpu', epochs=50, batch=8,\n"
        "        imgsz=32, workers=0, plots=False, ema=False)\n"
    )
    process = subprocess.Popen([sys.executable, str(script), str(data)], cwd=tmp_path, env=script_environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in process.stdout:  # the epoch line is printed right after the checkpoint write is submitted
            if line.startswith("epoch 1/50  loss"):
                os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
                break
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    (last,) = (tmp_path / "runs").glob("classify/*/weights/last.pt")
    assert torch.load(last, weights_only=True)["epoch"] == 0  # epoch 1 is on disk, whole
    assert not [path for path in last.parent.iterdir() if path.name.startswith(".")], "a half-written temp file was left"


# --------------------------------------------------------------------------- weights files
def test_forged_builder_options_in_a_weights_file_name_the_file(tmp_path):
    path = LibreYOLO("tinynet-s").save(tmp_path / "model.safetensors")
    from safetensors.torch import load_file, save_file

    import json

    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        header = json.loads(handle.metadata()["zoo"])
    header["options"] = {"width": "very wide"}
    header.pop("weights_sha256")
    save_file(load_file(str(path)), str(path), metadata={"zoo": json.dumps(header)})
    with pytest.raises(CorruptWeightsError, match=rf"{path}.*describes a model zoo cannot build"):
        LibreYOLO(path)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_a_flipped_bit_in_a_zoo_file_is_a_named_error(tmp_path, suffix):
    model = LibreYOLO("tinynet-s")
    with torch.no_grad():
        model.model.head.weight.fill_(1.2345)
    if suffix == ".safetensors":
        path = model.save(tmp_path / f"model{suffix}")
    else:
        from zoo_core.engine.checkpoint import CheckpointWriter

        path = tmp_path / f"best{suffix}"
        writer = CheckpointWriter()
        writer.submit({"model": model.model.state_dict(), "meta": model.meta.to_dict()}, path, [])
        writer.wait()
    assert torch.equal(LibreYOLO(path).model.head.weight, model.model.head.weight)  # intact: loads
    payload = bytearray(path.read_bytes())
    offset = payload.find(np.float32(1.2345).tobytes())
    payload[offset] ^= 0x01  # one bit of one weight
    path.write_bytes(bytes(payload))
    with pytest.raises(CorruptWeightsError, match=rf"{path}: the tensors do not match the checksum"):
        LibreYOLO(path)


def test_a_full_disk_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    target = tmp_path / "last.pt"
    atomic_write(target, lambda stream: stream.write(b"the previous checkpoint"))

    def no_space(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("zoo_core.weights.os.fsync", no_space)
    with pytest.raises(WeightsWriteError, match=rf"could not write {target} \(No space left on device\).*unchanged.*Free space"):
        atomic_write(target, lambda stream: stream.write(b"the new checkpoint"))
    assert target.read_bytes() == b"the previous checkpoint"
    assert [path.name for path in tmp_path.iterdir()] == ["last.pt"]


def test_a_disk_that_fills_during_a_checkpoint_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    target = tmp_path / "last.pt"
    atomic_torch_save({"epoch": 1}, target)
    real_fdopen = os.fdopen

    class FillsUp:
        """A file that takes 1 kB, then reports a full disk."""

        def __init__(self, stream):
            self.stream, self.written = stream, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 1024:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.stream.write(data)

        def __getattr__(self, name):
            return getattr(self.stream, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.stream.close()

    monkeypatch.setattr("zoo_core.weights.os.fdopen", lambda *args, **kwargs: FillsUp(real_fdopen(*args, **kwargs)))
    with pytest.raises(WeightsWriteError, match=rf"could not write {target} \(No space left on device\).*unchanged"):
        atomic_torch_save({"epoch": 2, "weights": torch.zeros(10_000)}, target)
    assert torch.load(target, weights_only=True) == {"epoch": 1}
    assert [path.name for path in tmp_path.iterdir()] == ["last.pt"]


# --------------------------------------------------------------------------- arguments and the command line
def test_predict_with_imgsz_zero_is_an_error_not_a_silent_default(tmp_path):
    image = tmp_path / "image.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(image)
    with pytest.raises(ArgumentError, match="imgsz needs sides of at least 16 pixels, got 0"):
        LibreYOLO("tinynet-s").predict(image, imgsz=0)


def test_the_cli_reports_any_error_in_one_line(tmp_path, capsys):
    (tmp_path / "text.pt").write_text("not weights")
    assert main(["val", "tinynet-s", "--data", "shapes", "--batch", "0"]) == 2
    assert main(["val", str(tmp_path / "text.pt"), "--data", "shapes"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("zoo: error: ") for line in errors)
    assert "batch must be a positive number of images, got 0" in errors[0] and "text.pt" in errors[1]


def test_a_blocked_plugin_s_model_says_it_is_blocked(monkeypatch):
    monkeypatch.setenv("ZOO_BLOCK_PLUGINS", "yolo9")
    with isolated_plugin_manager():
        with pytest.raises(ModelNameError, match=r"'yolo9-t' is yolo9-t, whose plugin 'yolo9' is blocked.*ZOO_BLOCK_PLUGINS"):
            LibreYOLO("yolo9-t")
        # zoo_yolo9 serves yolo9_seg too: the block keeps the whole package out, not only the family it names.
        with pytest.raises(ModelNameError, match=r"'yolo9-t-seg' is yolo9_seg-t, whose plugin 'yolo9' is blocked"):
            LibreYOLO("yolo9-t-seg")


# --------------------------------------------------------------------------- processes
def test_spawn_directories_of_dead_parents_are_swept_and_live_ones_kept():
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    stale = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{dead_pid}-"))
    (stale / "initial.safetensors").write_bytes(b"x" * 1024)
    live = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getppid()}-"))  # a running process's
    try:
        with private_workdir() as workdir:
            assert workdir.is_dir() and str(os.getpid()) in workdir.name
        assert not stale.exists() and live.exists() and not workdir.exists()
    finally:
        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)


# =========================================================================== round two (docs/faults.md)
# --------------------------------------------------------------------------- hostile and odd inputs
def billion_laughs(key: str, levels: int = 9) -> str:
    """A dataset YAML whose ``key`` is an alias of aliases: 9**9 "lol"s once expanded (a few hundred bytes on disk)."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]" for level in range(1, levels)]
    lines += [f"{key}: *l{levels - 1}", "val: images", "names: [box]"]
    if key != "train":
        lines.append("train: images")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", ["train", "path", "nc"])
def test_a_billion_laughs_dataset_yaml_is_refused_at_once_with_a_short_message(tmp_path, key):
    (tmp_path / "images").mkdir()
    path = tmp_path / "data.yaml"
    path.write_text(billion_laughs(key))
    started = time.monotonic()
    with pytest.raises(DatasetError, match=r"data\.yaml: the YAML expands to more than 100,000 values.*billion laughs") as caught:
        read_detection_yaml(path)
    assert time.monotonic() - started < 5 and len(str(caught.value)) < 400


def test_messages_quote_a_bounded_excerpt_of_any_value():
    bomb: list = ["lol"] * 9
    for _ in range(8):
        bomb = [bomb] * 9  # shared, as YAML aliases build it: 9**9 strings if written out
    started = time.monotonic()
    with pytest.raises(DatasetError, match=r"nc must be the number of classes, got \[\[\[\[") as caught:
        parse_names(["box"], "data.yaml", bomb)
    with pytest.raises(TrainConfigError, match=r"'epochs'=\[\[\[\[.*is invalid") as config_error:
        TrainConfig.build({"data": "shapes", "epochs": bomb})
    assert time.monotonic() - started < 2
    assert len(str(caught.value)) < 300 and len(str(config_error.value)) < 300


def _write_box_dataset(root: Path, names: list[str]) -> Path:
    images, labels = root / "images" / "train", root / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    for index, name in enumerate(names):
        Image.fromarray(np.full((32, 32, 3), 40 * index, np.uint8)).save(images / name)
    return images


def test_two_images_that_share_a_stem_are_an_error_naming_both_never_one_labelled_as_the_other(tmp_path):
    images = _write_box_dataset(tmp_path, ["a.jpg", "a.png", "b.png"])
    label = tmp_path / "labels" / "train" / "a.txt"
    label.write_text("0 0.5 0.5 0.2 0.2\n")
    with pytest.raises(DatasetError, match=rf"{re.escape(str(images / 'a.jpg'))} and {re.escape(str(images / 'a.png'))} would "
                                           rf"share one label file, {re.escape(str(label))}.*Rename one image"):
        index_detection_split([images], {0: "box"})
    label.unlink()  # without a.txt both are background images: nothing is mislabelled, so both are kept
    assert [record.image.name for record in index_detection_split([images], {0: "box"})] == ["a.jpg", "a.png", "b.png"]


def test_label_files_and_dataset_yaml_with_a_byte_order_mark_and_crlf_lines_lose_nothing(tmp_path):
    label = tmp_path / "a.txt"
    label.write_bytes(codecs.BOM_UTF8 + b"0 0.5 0.5 0.2 0.2\r\n1 0.3 0.3 0.1 0.1\r\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DatasetWarning)  # not one line is reported
        rows = read_labels(label, 2, ProblemReport("bom"))
    assert rows is not None and rows[:, 0].tolist() == [0.0, 1.0]
    (tmp_path / "images").mkdir()
    path = tmp_path / "data.yaml"
    path.write_bytes(codecs.BOM_UTF8 + b"path: .\r\ntrain: images\r\nval: images\r\nnames: [car, bus]\r\n")
    declared = read_detection_yaml(path)
    assert declared.names == {0: "car", 1: "bus"} and declared.splits["train"] == [tmp_path / "images"]


@pytest.mark.parametrize(("encoding", "named"), [
    ("latin-1", r"not UTF-8 text: byte 0xE9 at offset 45 \(line 4\).*Latin-1 or Windows-1252"),
    ("utf-16", r"encoded as UTF-16 \(little-endian\)"),
])
def test_a_dataset_yaml_in_another_encoding_names_the_file_and_the_encoding(tmp_path, capsys, encoding, named):
    (tmp_path / "images").mkdir()
    path = tmp_path / "data.yaml"
    path.write_bytes("path: .\ntrain: images\nval: images\nnames: [café]\n".encode(encoding))
    with pytest.raises(DatasetError, match=rf"{re.escape(str(path))}: .*{named}.*re-save it as UTF-8"):
        read_detection_yaml(path)
    assert main(["val", "yolo9-t", "--data", str(path), "--device", "cpu"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"zoo: error: {path}: ")


@pytest.mark.parametrize("value", ["2020-13-45", "2001-12-14 25:61:61", "!!float abc", "!!timestamp x", "[" * 3000])
def test_a_key_value_word_yaml_cannot_build_is_one_error_naming_the_key(capsys, value):
    assert main(["train", "tinynet-s", "--data", "shapes", f"lr0={value}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("zoo: error: ") and "lr0" in line and "Traceback" not in line and len(line) < 400


# --------------------------------------------------------------------------- weights files and plugins
class _Reduces:
    """A pickle payload: unpickling it calls ``function(argument)`` (what a malicious .pt does)."""

    def __init__(self, function, argument: str) -> None:
        self.function, self.argument = function, argument

    def __reduce__(self):
        return self.function, (self.argument,)


@pytest.mark.parametrize("call", ["os.system", "exec"])
def test_a_pickle_that_would_call_anything_is_unsafe_and_never_runs(tmp_path, call):
    marker = tmp_path / "ran"
    function, argument = (os.system, f"touch {marker}") if call == "os.system" else (exec, f"open({str(marker)!r}, 'w')")
    path = tmp_path / "model.pt"
    torch.save({"model": _Reduces(function, argument)}, path)
    imported = r"(posix|nt)\.system" if call == "os.system" else "exec"
    with pytest.raises(UnsafeWeightsError, match=rf"{re.escape(str(path))} holds pickled Python objects or code \(it imports "
                                                 rf"{imported}\).*nothing in it was run"):
        LibreYOLO(path)
    assert not marker.exists()


def test_a_refused_pickle_is_unsafe_by_its_own_opcodes_whatever_torch_says(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    torch.save({"model": _Reduces(os.system, "true")}, path)
    import pickle

    def refuses(*args, **kwargs):  # a torch whose refusal message zoo has never seen
        raise pickle.UnpicklingError("Weights only load failed for a reason worded anew")

    monkeypatch.setattr("torch.load", refuses)
    with pytest.raises(UnsafeWeightsError, match=r"it imports (posix|nt)\.system"):
        load_torch_file(path)
    torch.save({"w": torch.ones(2)}, tmp_path / "plain.pt")
    with pytest.raises(CorruptWeightsError, match="may be damaged"):  # only torch names: damage, not a payload
        load_torch_file(tmp_path / "plain.pt")


EVIL_PLUGIN = '''
import os
open(os.environ["ZOO_TEST_EVIL_MARKER"], "w").close()  # what a plugin's import could do
'''


def test_blocking_a_plugin_ignores_case_and_zoo_plugins_says_what_each_block_stopped(tmp_path, monkeypatch, capsys):
    root = write_plugin_distribution(tmp_path / "site", distribution="zoo-evil", version="6.6.6",
                                     entry_points={"evil": "zoo_evil"}, modules={"zoo_evil": EVIL_PLUGIN})
    marker = tmp_path / "imported"
    monkeypatch.setenv("ZOO_TEST_EVIL_MARKER", str(marker))
    monkeypatch.setenv("ZOO_BLOCK_PLUGINS", "EVIL,Nothing")
    with plugin_distribution_on_path(root):
        with isolated_plugin_manager(autoload=True) as manager:
            assert not marker.exists() and "zoo_evil" not in sys.modules
            assert manager.blocks("Evil") and manager.blocked_plugins()["nothing"] == []
            assert main(["plugins"]) == 0
        output = capsys.readouterr().out
        assert "blocks asked for: ZOO_BLOCK_PLUGINS=EVIL, ZOO_BLOCK_PLUGINS=Nothing" in output
        assert "blocked: evil: not imported: plugin 'evil' (distribution zoo-evil 6.6.6)" in output
        assert "blocked: nothing: no installed plugin or family has this name, so it blocked nothing" in output
        monkeypatch.delenv("ZOO_BLOCK_PLUGINS")
        with isolated_plugin_manager(autoload=True):
            assert marker.exists()  # the control: unblocked, the same plugin is imported


def test_an_image_above_the_pixel_limit_is_skipped_with_a_named_warning(tmp_path, monkeypatch):
    big, small = tmp_path / "scan.png", tmp_path / "small.png"
    Image.new("1", (10_000, 10_000)).save(big)  # 100 megapixels in a 12 kB file
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(small)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = usable_images([big, small], ProblemReport("limit"))
    assert [path for path, _ in usable] == [small]
    messages = [str(warning.message) for warning in caught if issubclass(warning.category, DatasetWarning)]
    assert messages == [f"{big}: 10000×10000 = 100,000,000 pixels is above zoo's limit of 64,000,000 "
                        "(ZOO_MAX_IMAGE_PIXELS); downscale the image, or raise the limit; skipped"]
    assert not [warning for warning in caught if issubclass(warning.category, Image.DecompressionBombWarning)]
    monkeypatch.setenv("ZOO_MAX_IMAGE_PIXELS", "1000")  # below 32×32
    with pytest.warns(DatasetWarning, match=r"32×32 = 1,024 pixels is above zoo's limit of 1,000"):
        assert usable_images([small], ProblemReport("lower")) == []
    monkeypatch.setenv("ZOO_MAX_IMAGE_PIXELS", "0")  # no zoo limit
    assert [path for path, _ in usable_images([big], ProblemReport("none"))] == [big]
    monkeypatch.setenv("ZOO_MAX_IMAGE_PIXELS", "lots")
    with pytest.raises(DatasetError, match=r"ZOO_MAX_IMAGE_PIXELS='lots' is not a number of pixels"):
        usable_images([small], ProblemReport("bad"))


# --------------------------------------------------------------------------- run folders
def test_a_second_run_into_a_claimed_folder_is_refused_naming_the_folder_and_the_other_process(tmp_path):
    data = write_class_folders(tmp_path / "data")
    run_dir = Path("runs/classify/shared")
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom zoo_core.run_dirs import claim_run_dir\n"
         "claim = claim_run_dir(sys.argv[1])\nprint('claimed', flush=True)\ntime.sleep(600)\n", str(run_dir.resolve())],
        env=script_environment(), stdout=subprocess.PIPE, text=True)
    settings = dict(data=str(data), device="cpu", epochs=1, batch=8, imgsz=32, name="shared", exist_ok=True, **QUIET)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        with pytest.raises(RunDirectoryInUseError, match=rf"the run folder {re.escape(str(run_dir))} is in use by another "
                                                         rf"training run \(process {holder.pid} on host .*another name="):
            LibreYOLO("tinynet-s").train(**settings)
        assert run_dir.is_dir() and not (run_dir / "results.csv").exists()  # nothing of the other run's was touched
    finally:
        holder.kill()
        holder.wait()
    # the kernel dropped the killed holder's lock with its process: the folder is free again
    assert LibreYOLO("tinynet-s").train(**settings).run_dir == run_dir


@contextlib.contextmanager
def read_only_folder(path: Path) -> Iterator[None]:
    """``path`` read-only for the block: its permissions, or (as root, whom permissions do not stop) a read-only tmpfs."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"as root a read-only folder needs a read-only mount, refused here: {mounted.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], capture_output=True)


@pytest.mark.parametrize("device", ["cpu", "cpu,cpu"])
def test_an_unwritable_project_is_an_error_naming_the_folder_from_rank_0(tmp_path, device):
    data = write_class_folders(tmp_path / "data")
    project = tmp_path / "read-only"
    project.mkdir()
    with read_only_folder(project):
        with pytest.raises(RunDirectoryError, match=rf"cannot create or write the run folder "
                                                    rf"{re.escape(str(project / 'classify' / 'train'))} \(.+\); choose a "
                                                    rf"writable project= \(it is {re.escape(str(project))}\)") as caught:
            LibreYOLO("tinynet-s").train(data=str(data), device=device, epochs=1, batch=8, imgsz=32, project=str(project),
                                         **QUIET)
    if device == "cpu,cpu":  # the worker's error, re-raised as itself, blames rank 0 (whose error it is)
        cause = caught.value.__cause__
        assert isinstance(cause, WorkerFailedError) and cause.rank == 0, cause
        assert str(cause).startswith("training worker rank 0 failed: zoo_core.errors.RunDirectoryError")


# --------------------------------------------------------------------------- processes and temp folders
CRASHES_INSIDE_TRAIN = """
import os, signal
from zoo_core import LibreYOLO, register_plugin
from tests import doubles
register_plugin(doubles, "engine-test-families")
holding = LibreYOLO("tinynet-s")._spec_with_weights()  # what train() holds while it trains (kept referenced:
spec = holding.__enter__()                              # a collected generator would run its clean-up)
print(os.getpid(), spec.weights.parent, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_parents_weights_folder_is_swept_by_the_next_run(tmp_path):
    crashed = subprocess.run([sys.executable, "-c", CRASHES_INSIDE_TRAIN], env=script_environment(), capture_output=True,
                             text=True, timeout=120)
    pid, folder = crashed.stdout.split()
    folder = Path(folder)
    assert crashed.returncode == -signal.SIGKILL and folder.name.startswith(f"zoo-weights-{pid}-") and folder.is_dir()
    live = Path(tempfile.mkdtemp(prefix=f"zoo-weights-{os.getppid()}-"))  # a running process's: kept
    try:
        LibreYOLO("tinynet-s").train(data=str(write_class_folders(tmp_path / "data")), device="cpu", epochs=1, batch=8,
                                     imgsz=32, **QUIET)
        assert not folder.exists() and live.is_dir()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)


def test_a_zombie_pid_counts_as_dead(tmp_path):
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while "State:\tZ" not in Path(f"/proc/{zombie.pid}/status").read_text():  # exited, not reaped (no wait() yet)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        assert not process_alive(zombie.pid) and process_alive(os.getpid())
    finally:
        zombie.wait()


LONG_RUN = """
from zoo_core import LibreYOLO, register_plugin
from zoo_core.engine.callbacks import Callback
from tests import doubles
register_plugin(doubles, "engine-test-families")

class Started(Callback):
    def on_train_start(self, run_dir, config):
        open("training-started", "w").close()

if __name__ == "__main__":
    LibreYOLO("tinynet-s").train(data="data", device="cpu,cpu", epochs=10_000, batch=8, imgsz=32, workers=0, nbs=8,
                                 verbose=False, plots=False, callbacks=[Started()])
"""
NEVER_REAPS = """
import subprocess, sys, time
caller = subprocess.Popen([sys.executable, "long_run.py"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(caller.pid, flush=True)
time.sleep(600)  # never wait()s: a killed caller stays a zombie
"""


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit():
                status = (entry / "status").read_text()
                parents[int(entry.name)] = int(status.split("PPid:")[1].split()[0])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def test_workers_stop_within_seconds_of_a_parent_killed_and_left_a_zombie(tmp_path):
    write_class_folders(tmp_path / "data")
    (tmp_path / "long_run.py").write_text(LONG_RUN)
    (tmp_path / "never_reaps.py").write_text(NEVER_REAPS)
    holder = subprocess.Popen([sys.executable, "never_reaps.py"], cwd=tmp_path, env=script_environment(),
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    processes: list[int] = []
    try:
        caller = int(holder.stdout.readline())
        deadline = time.monotonic() + 150
        while not (tmp_path / "training-started").exists():
            assert time.monotonic() < deadline and holder.poll() is None, "training never started"
            time.sleep(0.2)
        processes = _descendants(caller)  # the forkserver, the resource tracker and the two workers
        assert len(processes) >= 3, processes
        os.kill(caller, signal.SIGTERM)
        killed_at = time.monotonic()
        while any(alive(pid) for pid in processes) and time.monotonic() - killed_at < 10:
            time.sleep(0.1)
        survivors = [pid for pid in processes if alive(pid)]
        assert "State:\tZ" in Path(f"/proc/{caller}/status").read_text()  # the parent is still an unreaped zombie
        assert not survivors, f"{survivors} outlived their zombie parent by {time.monotonic() - killed_at:.0f} s"
        assert time.monotonic() - killed_at < 5, "the workers took more than 5 s to notice"
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        for pid in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
