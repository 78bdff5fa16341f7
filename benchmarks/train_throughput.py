"""Training images/s of ``yolo9-t`` through ``LibreYOLO.train`` against a plain step loop, in one run.

320 px, batch 8, one process, two threads, the built-in ``shapes`` detection set without
augmentation. The plain loop runs the same module (the same dataset, collate and preprocess,
``model.loss``, SGD) with nothing else: the ratio is the engine's share of a training step
(EMA, warm-up, clipping, bookkeeping).

    .venv/bin/python benchmarks/train_throughput.py [--epochs 3]
"""

from __future__ import annotations

import argparse
import os
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


def engine_images_per_second(epochs: int, images: int) -> float:
    timer = EpochTimes()
    torch.manual_seed(0)
    LibreYOLO("yolo9-t").train(
        data=DATA, device="cpu", epochs=epochs, batch=BATCH, imgsz=IMAGE_SIZE, workers=0, nbs=BATCH, augment=False,
        val=False, plots=False, verbose=False, callbacks=[timer], close_mosaic=0,
    )
    return images / statistics.median(timer.seconds[1:])


def plain_images_per_second(epochs: int) -> tuple[float, int]:
    task = get_task("detect")
    spec = task.prepare(DATA)
    dataset = task.dataset(spec, "train", IMAGE_SIZE, None)
    torch.manual_seed(0)
    model = LibreYOLO("yolo9-t", num_classes=len(spec.names)).model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, collate_fn=task.collate)
    seconds = []
    for _ in range(epochs):
        started = time.perf_counter()
        for batch in loader:
            batch = task.preprocess(batch, torch.device("cpu"))
            loss, _ = model.loss(model(batch["images"]), batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        seconds.append(time.perf_counter() - started)
    return len(dataset) / statistics.median(seconds[1:]), len(dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    arguments = parser.parse_args()
    torch.set_num_threads(2)
    os.chdir(tempfile.mkdtemp(prefix="zoo-throughput-"))
    plain, images = plain_images_per_second(arguments.epochs)
    engine = engine_images_per_second(arguments.epochs, images)
    print(f"yolo9-t, {IMAGE_SIZE}px, batch {BATCH}, one process, {torch.get_num_threads()} threads, {images} images")
    print(f"engine {engine:6.2f} img/s   plain loop {plain:6.2f} img/s   ratio {engine / plain:.3f}")


if __name__ == "__main__":
    main()
