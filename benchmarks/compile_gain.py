"""What ``compile=True`` (torch.compile of the training forward) buys on this machine, through ``LibreYOLO.train``.

Two runs of the same training, eager then compiled, in fresh processes: yolo9-t on the built-in
``shapes`` scenes (a quarter of them), 320 px, batch 8, augmentation on, no validation. Printed:
the compiled run's extra time before its second epoch (compilation), steady images/s of both
(epochs after the first) and their ratio.

    python benchmarks/compile_gain.py [--model yolo9-t] [--epochs 4] [--threads 2]

On a CPU, inductor compiles the forward and backward graphs with the C++ compiler for a few
minutes: worth it for long runs only if the ratio is well above 1, which is why ``compile`` is
off by default.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

IMAGES_PER_EPOCH = 32  # a quarter of the 128 built-in training scenes, four batches of 8

def train_once(model_name: str, compile_model: bool, epochs: int, threads: int) -> dict[str, Any]:
    import torch

    from zoo_core import LibreYOLO
    from zoo_core.engine.callbacks import Callback

    torch.set_num_threads(threads)

    class Clock(Callback):
        def __init__(self) -> None:
            self.start = 0.0
            self.epoch_ends: list[float] = []

        def on_train_start(self, run_dir: Path, config: dict[str, Any]) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, report: Any) -> None:
            self.epoch_ends.append(time.perf_counter())

    clock = Clock()
    with tempfile.TemporaryDirectory() as project:
        LibreYOLO(model_name).train(
            data="shapes", epochs=epochs, imgsz=320, batch=8, fraction=0.25, workers=0, val=False, plots=False,
            verbose=False, device="cpu", compile=compile_model, callbacks=[clock], project=project,
        )
    ends = clock.epoch_ends
    return {
        "first_epoch_s": ends[0] - clock.start,
        "steady_images_per_s": IMAGES_PER_EPOCH * (len(ends) - 1) / (ends[-1] - ends[0]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="yolo9-t")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", choices=("eager", "compiled"), help=argparse.SUPPRESS)  # internal: one run here
    arguments = parser.parse_args()
    if arguments.one:
        print(json.dumps(train_once(arguments.model, arguments.one == "compiled", arguments.epochs, arguments.threads)))
        return 0
    figures = {}
    for mode in ("eager", "compiled"):
        command = [sys.executable, __file__, "--one", mode, "--model", arguments.model, "--epochs", str(arguments.epochs),
                   "--threads", str(arguments.threads)]
        finished = subprocess.run(command, capture_output=True, text=True, check=False)
        if finished.returncode != 0:
            print(f"{mode} run failed:\n{finished.stderr[-3000:]}")
            return 1
        figures[mode] = json.loads(finished.stdout.strip().splitlines()[-1])
    eager, compiled = figures["eager"], figures["compiled"]
    print(f"{arguments.model}, 320 px, batch 8, {arguments.threads} threads, {arguments.epochs} epochs of 32 images")
    print(f"eager     steady {eager['steady_images_per_s']:6.2f} images/s   first epoch {eager['first_epoch_s']:6.1f} s")
    print(f"compiled  steady {compiled['steady_images_per_s']:6.2f} images/s   first epoch {compiled['first_epoch_s']:6.1f} s")
    print(f"compilation costs about {compiled['first_epoch_s'] - eager['first_epoch_s']:.0f} s; "
          f"steady ratio compiled / eager = {compiled['steady_images_per_s'] / eager['steady_images_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
