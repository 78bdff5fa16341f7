"""Seconds to the first optimizer step: spawn (``device="cpu,cpu"``) against torchrun, same model.

Both launches start from a shell command, as a user would, and stop the clock at rank 0's first
optimizer step (the ``on_optimizer_step`` callback). Reported twice: from the command's start
(what the user waits for) and from the ``train()`` call (for spawn this includes starting the
workers; for torchrun the ranks already exist). Target: spawn at most 1.1x torchrun. A third
row runs the same script calling ``zoo_core.prepare_workers(device)`` before it builds the model,
so the workers' imports overlap the script's own. The runs do not validate (``val=False``): with
validation on, the workers' forkserver also imports torchmetrics before the first step (2.5 s
here), which under torchrun every rank imports at its first validation instead.

Then the same training from the command line, ``zoo train ... --device cpu,cpu`` against
``torchrun ... -m zoo_core train ... --device cpu``, timed from the command's start to its end
(the command line has no callbacks; both runs train the same two steps). The command line
starts the workers' forkserver while it parses its arguments, before its own imports.

    .venv/bin/python benchmarks/ddp_startup.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = '''
import os, sys, time
from zoo_core import LibreYOLO
from zoo_core.engine.callbacks import Callback


class FirstStep(Callback):
    def __init__(self, path):
        self.path = path
    def on_optimizer_step(self, step):
        if step == 1:
            with open(self.path, "a") as stream:
                stream.write(f"first_step {time.time()}\\n")


if __name__ == "__main__":
    timings, device = sys.argv[1], sys.argv[2]
    if sys.argv[3:] == ["prepare"]:
        import zoo_core
        zoo_core.prepare_workers(device, validates=False)  # as train(val=False) below
    model = LibreYOLO("resnet18")
    if os.environ.get("RANK", "0") == "0":
        with open(timings, "a") as stream:
            stream.write(f"train_called {time.time()}\\n")
    model.train(data="data", device=device, epochs=1, batch=8, imgsz=32, workers=0, nbs=8, val=False,
                plots=False, verbose=False, callbacks=[FirstStep(timings)])
'''


def write_dataset(root: Path) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for index in range(2):
            folder = root / split / f"class{index}"
            folder.mkdir(parents=True, exist_ok=True)
            for item in range(8):
                Image.fromarray((rng.random((32, 32, 3)) * 255).astype(np.uint8)).save(folder / f"{item}.png")


def launch(command: list[str], workdir: Path, timings: Path) -> tuple[float, float]:
    timings.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.time()
    subprocess.run(command, cwd=workdir, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events = dict(line.split() for line in timings.read_text().splitlines())
    first_step = float(events["first_step"])
    return first_step - started, first_step - float(events["train_called"])


def run_command(command: list[str], workdir: Path) -> float:
    """Seconds from the start of ``command`` to its end."""
    started = time.time()
    subprocess.run(command, cwd=workdir, env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="zoo-startup-"))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    write_dataset(workdir / "data")
    (workdir / "train.py").write_text(SCRIPT)
    timings = workdir / "timings.txt"
    commands = {
        "spawn (device='cpu,cpu')": [sys.executable, "train.py", str(timings), "cpu,cpu"],
        "spawn, prepare_workers() first": [sys.executable, "train.py", str(timings), "cpu,cpu", "prepare"],
        "torchrun --nproc_per_node=2": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                                        "--master_port=29517", "train.py", str(timings), "cpu"],
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(arguments.repeats):  # alternate, so drift in machine load hits both alike
        for name, command in commands.items():
            samples[name].append(launch(command, workdir, timings))
    medians = {}
    for name, values in samples.items():
        from_command = statistics.median(value[0] for value in values)
        from_train = statistics.median(value[1] for value in values)
        medians[name] = from_command
        print(f"{name:30s} first step {from_command:6.2f} s after the command, {from_train:6.2f} s after train()")
    spawn, prepared, torchrun = medians.values()
    print(f"ratio spawn / torchrun (from the command) = {spawn / torchrun:.3f}  (target <= 1.1)")
    print(f"ratio spawn with prepare_workers() / torchrun (from the command) = {prepared / torchrun:.3f}")

    train = ["train", "resnet18", "--data", "data", "--epochs", "1", "--batch", "8", "--imgsz", "32", "--workers", "0",
             "nbs=8", "val=false", "plots=false", "verbose=false"]
    cli_commands = {
        "zoo train --device cpu,cpu": [sys.executable, "-m", "zoo_core", *train, "--device", "cpu,cpu"],
        "torchrun -m zoo_core train": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                                       "--master_port=29518", "-m", "zoo_core", *train, "--device", "cpu"],
    }
    seconds: dict[str, list[float]] = {name: [] for name in cli_commands}
    for _ in range(arguments.repeats):
        for name, command in cli_commands.items():
            seconds[name].append(run_command(command, workdir))
    cli_medians = {name: statistics.median(values) for name, values in seconds.items()}
    for name, value in cli_medians.items():
        print(f"{name:30s} whole command {value:6.2f} s")
    cli_spawn, cli_torchrun = cli_medians.values()
    print(f"ratio zoo train spawn / torchrun (whole command) = {cli_spawn / cli_torchrun:.3f}")


if __name__ == "__main__":
    main()
