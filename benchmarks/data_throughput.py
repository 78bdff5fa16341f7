"""Images/s of the detection training loader against images/s the smallest detector trains at.

Both are measured in this one run, one after the other (so neither steals the other's cores):

- loader: the ``shapes`` detection training set through ``DetectTask`` with augmentation on
  (mosaic, affine, flip, HSV), 2 DataLoader workers, 320 px, batch 8 — batches/s × 8;
- training: ``yolo9-t`` forward + loss + backward + SGD step at batch 8, 320 px, in this process,
  on batches taken from that loader beforehand — steps/s × 8.

Target: the loader at least 3× faster than training consumes images, so data never starves it.

    python benchmarks/data_throughput.py [--imgsz 320] [--batch 8] [--workers 2] [--model yolo9-t]
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
from torch.utils.data import DataLoader

from zoo_core import LibreYOLO
from zoo_core.tasks import get_task
from zoo_core.tasks.base import AugmentSettings


def endless(loader: DataLoader):
    """Batches of ``loader``, epoch after epoch (the shapes training set is only 16 batches long)."""
    while True:
        yield from loader


def loader_images_per_second(loader: DataLoader, batches: int, batch_size: int) -> float:
    """Images/s over ``batches`` batches, after the workers have started and delivered two."""
    stream = endless(loader)
    for _ in range(2):
        next(stream)
    started = time.perf_counter()
    for _ in range(batches):
        next(stream)
    return batches * batch_size / (time.perf_counter() - started)


def training_images_per_second(libre: LibreYOLO, task, batches: list[dict], steps: int) -> float:
    """Images/s of forward + loss + backward + SGD step on ``batches`` (one warm-up step first)."""
    model = libre.model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.937)
    device = torch.device("cpu")

    def step(batch: dict) -> None:
        batch = task.preprocess(batch, device)
        loss, _ = task.loss(model, model(batch["images"]), batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    cycle = itertools.cycle(batches)
    step(next(cycle))
    started = time.perf_counter()
    for _ in range(steps):
        step(next(cycle))
    return steps * len(batches[0]["images"]) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="shapes")
    parser.add_argument("--model", default="yolo9-t")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--loader-batches", type=int, default=40)
    parser.add_argument("--train-steps", type=int, default=5)
    arguments = parser.parse_args()

    task = get_task("detect")
    spec = task.prepare(arguments.data)
    dataset = task.dataset(spec, "train", arguments.imgsz, AugmentSettings())
    loader = DataLoader(
        dataset, batch_size=arguments.batch, shuffle=True, num_workers=arguments.workers,
        collate_fn=task.collate, drop_last=True, persistent_workers=arguments.workers > 0,
    )
    loading = loader_images_per_second(loader, arguments.loader_batches, arguments.batch)
    batches = list(itertools.islice(iter(loader), 3))
    del loader  # stop the workers before timing the model

    torch.manual_seed(0)
    libre = LibreYOLO(arguments.model, names=list(spec.names.values()))
    training = training_images_per_second(libre, task, batches, arguments.train_steps)

    print(f"loader   {loading:8.1f} images/s  (detection, augmentation on incl. mosaic, {arguments.workers} workers, {arguments.imgsz} px)")
    print(f"training {training:8.1f} images/s  ({arguments.model} forward+backward+SGD, batch {arguments.batch}, one process, "
          f"{torch.get_num_threads()} threads)")
    print(f"ratio loader / training = {loading / training:.1f}  (target >= 3)")


if __name__ == "__main__":
    main()
