"""What the engine's CPU SyncBatchNorm costs: a DDP training step with it against plain BatchNorm, two gloo ranks.

Two spawned CPU ranks (one thread each) hold the same model three times: every BatchNorm
converted by ``convert_sync_batchnorm`` as the trainer does it (statistics through the host
exchange), converted but left on gloo's all-reduce (in a group of its own), and left plain; all
wrapped in DDP. Each round runs one step of each (forward, the family's loss, backward, SGD step)
on the rank's own batch, in turn so that load drift hits all alike; rank 0 prints the median step
times and the ratios to plain BatchNorm. Target (issue: CPU SyncBatchNorm): ratio <= 1.25.

    python benchmarks/sync_batchnorm_cost.py                       # yolo9-t, 320 px, 4 images per rank (the issue's setting: batch 8)
    python benchmarks/sync_batchnorm_cost.py --model yolo9-s --imgsz 320 --batch 2 --rounds 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def detection_batch(images: int, side: int, seed: int) -> dict:
    """Random images with two boxes each (pixel xyxy targets, the detect task's layout)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    rows = []
    for index in range(images):
        for label in range(2):
            x1, y1 = (torch.rand(2, generator=generator) * side * 0.5).tolist()
            rows.append([index, label, x1, y1, x1 + side * 0.3, y1 + side * 0.4])
    return {"images": torch.rand(images, 3, side, side, generator=generator), "targets": torch.tensor(rows)}


def rank_main(rank: int, arguments: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from zoo_core import LibreYOLO
    from zoo_core.engine.sync_batchnorm import convert_sync_batchnorm

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        models = {}
        libre = LibreYOLO(arguments.model)
        layout = torch.channels_last if libre.declaration.channels_last else torch.contiguous_format  # as the trainer on a CPU
        gloo_group = dist.new_group(backend="gloo")  # a group without a host exchange
        for kind in ("plain", "sync", "sync over gloo"):
            model = LibreYOLO(arguments.model).model.train().to(memory_format=layout)
            if kind == "sync":
                model = convert_sync_batchnorm(model, torch.device("cpu"))
            elif kind == "sync over gloo":
                model = convert_sync_batchnorm(model, torch.device("cpu"), gloo_group, host_exchange=False)
            wrapped = DistributedDataParallel(model, find_unused_parameters=False)
            models[kind] = (wrapped, model, torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9))
        batch = detection_batch(arguments.batch, arguments.imgsz, seed=rank)
        batch["images"] = batch["images"].contiguous(memory_format=layout)

        def step(kind: str) -> tuple[float, float]:
            """Wall and CPU seconds of one training step (CPU time is less sensitive to a loaded machine)."""
            wrapped, model, optimizer = models[kind]
            started, started_cpu = time.perf_counter(), time.process_time()
            loss, _ = model.loss(wrapped(batch["images"]), batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return time.perf_counter() - started, time.process_time() - started_cpu

        for _ in range(2):  # warm-up
            for kind in models:
                step(kind)
        times: dict[str, list[tuple[float, float]]] = {kind: [] for kind in models}
        for _ in range(arguments.rounds):
            for kind in models:
                dist.barrier()
                times[kind].append(step(kind))
        if rank == 0:
            wall = {kind: statistics.median(sample[0] for sample in samples) for kind, samples in times.items()}
            cpu = {kind: statistics.median(sample[1] for sample in samples) for kind, samples in times.items()}
            print(f"{arguments.model} at {arguments.imgsz} px, {arguments.batch} images per rank, 2 gloo ranks, "
                  f"{arguments.rounds} rounds (medians, rank 0):", flush=True)
            for kind in models:
                print(f"  {kind:<16} {wall[kind] * 1000:6.0f} ms/step ({cpu[kind] * 1000:.0f} ms CPU); ratio to plain "
                      f"{wall[kind] / wall['plain']:.3f} wall, {cpu[kind] / cpu['plain']:.3f} CPU", flush=True)
            print("target: sync <= 1.25 wall", flush=True)
    finally:
        dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as multiprocessing

    from zoo_core.engine.distributed import find_free_port

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="yolo9-t")
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=4, help="images per rank")
    parser.add_argument("--rounds", type=int, default=7)
    arguments = parser.parse_args()
    multiprocessing.start_processes(rank_main, args=(arguments, find_free_port()), nprocs=2, join=True, start_method="spawn")


if __name__ == "__main__":
    main()
