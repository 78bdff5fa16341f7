"""GPU check (not part of CI): the CUDA paths CPU tests cannot reach, verified on a real device.

1. single-device CUDA training with AMP (autocast bfloat16 on compute capability 8.0+, else float16 with a
   GradScaler, whose state the checkpoint then holds), loss finite;
2. the autobatch probe on CUDA returns a plausible batch (and the global-batch arithmetic);
3. NCCL is the backend chosen for CUDA ranks, and a one-rank NCCL process group all-reduces;
4. sync_bn conversion on CUDA gives torch's SyncBatchNorm, and two spawned CUDA ranks (when two
   GPUs exist) train with it under NCCL.

Prints one line per verified item and exits non-zero on the first failure.

    python benchmarks/gpu_check.py
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from zoo_core import LibreYOLO, get_plugin_manager
from zoo_core.engine.autobatch import global_batch_from_probe, probe_batch_size
from zoo_core.engine.distributed import choose_backend, find_free_port
from zoo_core.engine.precision import training_precision
from zoo_core.engine.sync_batchnorm import convert_sync_batchnorm


def verified(message: str) -> None:
    print(f"OK   {message}", flush=True)


def write_dataset(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split, count in (("train", 32), ("val", 8)):
        for index in range(2):
            folder = root / split / f"class{index}"
            folder.mkdir(parents=True, exist_ok=True)
            for item in range(count):
                Image.fromarray((rng.random((64, 64, 3)) * 255).astype(np.uint8)).save(folder / f"{item}.png")
    return root


def main() -> int:
    if not torch.cuda.is_available():
        print("FAIL no CUDA device visible; run this on a GPU machine")
        return 1
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
    workdir = tempfile.mkdtemp(prefix="zoo-gpu-check-")
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    os.chdir(workdir)
    data = write_dataset(Path("data"))

    # 1. single-device CUDA training with AMP
    model = LibreYOLO("resnet18")
    result = model.train(data=str(data), device=0, epochs=2, batch=16, imgsz=64, workers=2, amp=True, verbose=False)
    checkpoint = torch.load(result.last, map_location="cpu", weights_only=True)
    precision = training_precision(torch.device("cuda", 0), amp=True)
    assert (checkpoint["scaler"] is not None) == precision.scales_loss, (precision, checkpoint["scaler"])
    losses = [row["train/loss"] for row in result.history]
    assert all(np.isfinite(losses)), losses
    verified(f"single-device CUDA training with AMP ({precision.dtype}, loss scaling {precision.scales_loss}): losses {', '.join(f'{x:.3f}' for x in losses)}, top1 {result.metrics['top1']:.3f}")

    # 2. autobatch probe on CUDA
    recipe = get_plugin_manager().training_recipe("resnet", "18")
    per_device = probe_batch_size(LibreYOLO("resnet18").model, recipe, 224, torch.device("cuda", 0), 1000)
    assert 16 <= per_device <= 1024, per_device
    verified(f"autobatch on cuda:0 at 224px: {per_device} images per device; global on 2 devices with nbs=64: "
             f"{global_batch_from_probe(per_device, 2, 64)}")
    result = LibreYOLO("resnet18").train(data=str(data), device=0, epochs=1, batch=-1, imgsz=64, verbose=False, val=False)
    verified(f"train(batch=-1) on cuda:0 chose batch {result.batch}, accumulate {result.accumulate}")

    # 3. NCCL backend selection and a one-rank NCCL group
    backend = choose_backend(torch.device("cuda", 0))
    assert backend == "nccl", backend
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(find_free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    tensor = torch.ones(4, device="cuda")
    dist.all_reduce(tensor)
    dist.destroy_process_group()
    assert tensor.sum().item() == 4
    verified("backend for CUDA ranks is NCCL; a NCCL process group all-reduces on cuda:0")

    # 4. torch's SyncBatchNorm on CUDA
    converted = convert_sync_batchnorm(LibreYOLO("resnet18").model, torch.device("cuda", 0))
    kinds = {type(module).__name__ for module in converted.modules() if "BatchNorm" in type(module).__name__}
    assert kinds == {"SyncBatchNorm"}, kinds
    verified("sync_bn conversion on CUDA uses torch.nn.SyncBatchNorm")
    if torch.cuda.device_count() >= 2:
        result = LibreYOLO("resnet18").train(data=str(data), device=[0, 1], epochs=1, batch=16, imgsz=64, sync_bn=True, verbose=False)
        verified(f"spawned 2 CUDA ranks (NCCL, SyncBatchNorm): top1 {result.metrics['top1']:.3f}, run {result.run_dir}")
    else:
        print("SKIP two CUDA ranks: only one GPU visible")
    return 0


if __name__ == "__main__":
    sys.exit(main())
