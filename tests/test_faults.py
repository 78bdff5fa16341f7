"""Faults and bad inputs a user meets: each gets a specific error naming the file, key or value and
the fix, or is handled as documented; nothing the user owns is lost (one regression test per case)."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from zoo_core import LibreYOLO
from zoo_core.cli import main
from zoo_core.data.errors import DatasetError
from zoo_core.engine.launcher import WORKDIR_PREFIX, private_workdir
from zoo_core.errors import (
    ArgumentError,
    BatchSizeError,
    CorruptWeightsError,
    ModelNameError,
    ResumeError,
    TrainingDivergedError,
    WeightsWriteError,
)
from zoo_core.testing import isolated_plugin_manager
from zoo_core.weights import atomic_torch_save, atomic_write

from .support import script_environment, use_test_families, write_class_folders

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
