"""Images/s of ``LibreYOLO.train`` against a minimal hand-written PyTorch loop, side by side.

Same model (resnet18), data (the same dataset objects, no augmentation), global batch, optimizer
(AdamW) and threads; no validation. Measured for one process and for two CPU ranks (gloo), on
the epochs after the first (the first pays for start-up), with ``nbs=batch`` so both step every
batch. The engine's overhead is measured doing the same arithmetic as the hand loop (EMA and
gradient clipping off); a second line shows the engine with those defaults on, which add work a
minimal loop does not do. Prints images/s and the ratio engine / hand loop (target >= 0.95; with
EMA and clipping >= 0.97), as medians of interleaved rounds: single runs move by 10-20% on a
shared two-core machine.

    .venv/bin/python benchmarks/engine_overhead.py [--images 256] [--epochs 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from zoo_core import LibreYOLO
from zoo_core.engine.callbacks import Callback
from zoo_core.engine.distributed import find_free_port
from zoo_core.tasks import get_task

BATCH = 16
IMAGE_SIZE = 64


def write_dataset(root: Path, images: int) -> Path:
    rng = np.random.default_rng(0)
    for split, count in (("train", images // 2), ("val", 4)):
        for index in range(2):
            folder = root / split / f"class{index}"
            folder.mkdir(parents=True, exist_ok=True)
            for item in range(count):
                Image.fromarray((rng.random((IMAGE_SIZE, IMAGE_SIZE, 3)) * 255).astype(np.uint8)).save(folder / f"{item}.png")
    return root


class EpochTimes(Callback):
    """Collects each epoch's duration (rank 0)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_epoch_end(self, report) -> None:
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(f"{report.seconds}\n")


def engine_images_per_second(data: Path, device: str, epochs: int, images: int, defaults: bool) -> float:
    times = Path(tempfile.mkdtemp(dir=Path.cwd())) / "times.txt"
    torch.manual_seed(0)
    same_math = {} if defaults else {"ema": False, "max_grad_norm": None}
    LibreYOLO("resnet18").train(
        data=str(data), device=device, epochs=epochs, batch=BATCH, imgsz=IMAGE_SIZE, workers=0, nbs=BATCH,
        optimizer="AdamW", lr0=1e-3, augment=False, val=False, plots=False, verbose=False,
        callbacks=[EpochTimes(str(times))], name=f"bench-{device.replace(',', '-')}", **same_math,
    )
    seconds = [float(line) for line in times.read_text().split()][1:]
    return images / statistics.median(seconds)


def hand_loop(rank: int, world_size: int, data: str, epochs: int, port: int, results: str) -> None:
    """The minimal loop: the same dataset, DDP when world_size > 1, forward/backward/step."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    torch.set_flush_denormal(True)
    if world_size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    task = get_task("classify")
    spec = task.prepare(data)
    dataset = task.dataset(spec, "train", IMAGE_SIZE, None)
    torch.manual_seed(0)
    model = LibreYOLO("resnet18", num_classes=2).model
    if world_size > 1:
        model = DistributedDataParallel(model)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH // world_size, sampler=sampler, collate_fn=task.collate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    device = torch.device("cpu")
    seconds = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        started = time.perf_counter()
        for batch in loader:
            batch = task.preprocess(batch, device)
            loss = torch.nn.functional.cross_entropy(model(batch["images"]), batch["labels"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        seconds.append(time.perf_counter() - started)
    if rank == 0:
        Path(results).write_text("\n".join(map(str, seconds[1:])))
    if world_size > 1:
        dist.destroy_process_group()


def hand_images_per_second(data: Path, world_size: int, epochs: int, images: int) -> float:
    results = Path(tempfile.mkdtemp(dir=Path.cwd())) / "hand.txt"
    if world_size == 1:
        hand_loop(0, 1, str(data), epochs, 0, str(results))
    else:
        mp.spawn(hand_loop, args=(world_size, str(data), epochs, find_free_port(), str(results)), nprocs=world_size)
    return images / statistics.median(float(line) for line in results.read_text().split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are printed")
    arguments = parser.parse_args()
    torch.set_flush_denormal(True)  # subnormal floats slow CPU kernels at random moments (see train_throughput.py)
    workdir = tempfile.mkdtemp(prefix="zoo-bench-")
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)  # runs and checkpoints: some GB over the rounds
    os.chdir(workdir)
    data = write_dataset(Path("data"), arguments.images)
    settings = (("one process", "cpu", 1), ("two CPU ranks", "cpu,cpu", 2))
    # A round runs the three loops back to back, so that drift in the machine's load hits all three alike;
    # the ratios of each round are printed, then the ratios of the medians.
    samples: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _, _ in settings}
    for round_index in range(arguments.rounds):
        for label, device, world_size in settings:
            hand = hand_images_per_second(data, world_size, arguments.epochs, arguments.images)
            same = engine_images_per_second(data, device, arguments.epochs, arguments.images, defaults=False)
            full = engine_images_per_second(data, device, arguments.epochs, arguments.images, defaults=True)
            samples[label].append((hand, same, full))
            print(f"round {round_index + 1} {label:14s} ratios {same / hand:.3f} / {full / hand:.3f}", flush=True)
    print(f"resnet18, {arguments.images} images of {IMAGE_SIZE}px, global batch {BATCH}, AdamW, CPU, "
          f"medians of {arguments.rounds} rounds")
    for label, rows in samples.items():
        hand, same, full = (statistics.median(row[index] for row in rows) for index in range(3))
        print(f"{label:14s} hand loop {hand:6.1f} img/s | engine {same:6.1f} img/s, ratio {same / hand:.3f} (target >= 0.95)"
              f" | engine with EMA + clipping {full:6.1f} img/s, ratio {full / hand:.3f} (target >= 0.97)")


if __name__ == "__main__":
    main()
