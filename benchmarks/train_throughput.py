"""Training images/s of ``yolo9-t`` through ``LibreYOLO.train`` against a plain step loop, in one run.

320 px, batch 8, one process, two threads, the built-in ``shapes`` detection set without
augmentation. The plain loop runs the same module (the same dataset, collate and preprocess,
``model.loss``, SGD at lr 0.01, channels-last memory as the engine uses for yolo9 on a CPU) with nothing else. The engine runs the same arithmetic (no
warm-up, weight decay, EMA or clipping: a slowly warming learning rate changes the weights and
hence the speed of CPU kernels, which would not be the engine's doing), so the ratio is the
engine's share of a training step; a second line shows the yolo9 recipe's defaults. Subnormal
floats are flushed to zero on both sides (see ``main``).

    .venv/bin/python benchmarks/train_throughput.py [--epochs 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import tempfile
import time

import torch
from torch.utils.data import DataLoader

from zoo_core import LibreYOLO
from zoo_core.engine.callbacks import Callback
from zoo_core.tasks import get_task

IMAGE_SIZE = 320
BATCH = 8
DATA = "shapes:train=64,val=8,size=320,seed=0"


class EpochTimes(Callback):
    """Collects each epoch's duration."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_epoch_end(self, report) -> None:
        self.seconds.append(report.seconds)


SAME_ARITHMETIC = dict(optimizer="SGD", lr0=0.01, lrf=1.0, momentum=0.937, weight_decay=0.0, warmup_epochs=0,
                       ema=False, max_grad_norm=None)


def engine_images_per_second(epochs: int, images: int, defaults: bool = False) -> float:
    timer = EpochTimes()
    torch.manual_seed(0)
    LibreYOLO("yolo9-t").train(
        data=DATA, device="cpu", epochs=epochs, batch=BATCH, imgsz=IMAGE_SIZE, workers=0, nbs=BATCH, augment=False,
        val=False, plots=False, verbose=False, callbacks=[timer], close_mosaic=0, **({} if defaults else SAME_ARITHMETIC),
    )
    return images / statistics.median(timer.seconds[1:])


def plain_images_per_second(epochs: int) -> tuple[float, int]:
    task = get_task("detect")
    spec = task.prepare(DATA)
    dataset = task.dataset(spec, "train", IMAGE_SIZE, None)
    torch.manual_seed(0)
    model = LibreYOLO("yolo9-t", num_classes=len(spec.names)).model.train()
    model.to(memory_format=torch.channels_last)  # as the engine trains yolo9 on a CPU (registry: channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, collate_fn=task.collate)
    seconds = []
    for _ in range(epochs):
        started = time.perf_counter()
        for batch in loader:
            batch = task.preprocess(batch, torch.device("cpu"))
            batch["images"] = batch["images"].contiguous(memory_format=torch.channels_last)
            loss, _ = model.loss(model(batch["images"]), batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        seconds.append(time.perf_counter() - started)
    return len(dataset) / statistics.median(seconds[1:]), len(dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    torch.set_num_threads(2)
    # Subnormal floats appear as the weights move and make CPU kernels several times slower at
    # unpredictable moments; flushing them keeps both sides measuring the same work.
    torch.set_flush_denormal(True)
    workdir = tempfile.mkdtemp(prefix="zoo-throughput-")
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    os.chdir(workdir)
    # Alternating rounds, best of each: a shared machine's noise only ever slows a round down,
    # and the first round of a process also pays for cold allocator and thread-pool state.
    plains, engines, recipes = [], [], []
    for _ in range(arguments.rounds):
        plain, images = plain_images_per_second(arguments.epochs)
        plains.append(plain)
        engines.append(engine_images_per_second(arguments.epochs, images))
        recipes.append(engine_images_per_second(arguments.epochs, images, defaults=True))
    plain, engine, recipe = max(plains), max(engines), max(recipes)
    print(f"yolo9-t, {IMAGE_SIZE}px, batch {BATCH}, one process, {torch.get_num_threads()} threads, {images} images")
    print(f"plain loop {plain:6.2f} img/s   engine {engine:6.2f} img/s   ratio {engine / plain:.3f}")
    print(f"engine with the yolo9 recipe (warm-up, weight decay, EMA, clipping) {recipe:6.2f} img/s")


if __name__ == "__main__":
    main()
