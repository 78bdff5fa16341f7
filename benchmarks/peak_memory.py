"""Peak memory of training on two spawned CPU ranks: the resident set of the largest rank, and of the parent.

Each model trains one epoch through ``LibreYOLO.train(device="cpu,cpu")`` on a built-in ``shapes``
set at its published input size (or ``--imgsz``), ``--batch`` images per rank. The ranks are the
parent's only children, so after they are joined ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` is the
peak of the larger rank. Each model runs in its own fresh process so one model's peak never
hides another's.

    python benchmarks/peak_memory.py rfdetr-n deimv2-s
    python benchmarks/peak_memory.py deimv2-s --batch 2 --imgsz 320
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(name: str, batch_per_rank: int, imgsz: int | None) -> dict[str, float]:
    """Train ``name`` for one epoch on two spawned CPU ranks in this process; peak RSS in MiB and the wall time."""
    import tempfile

    from zoo_core import LibreYOLO
    from zoo_core.data.shapes import shapes

    model = LibreYOLO(name)
    size = imgsz or model.input_size
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as project:
        model.train(data=shapes(num_train=2 * batch_per_rank, num_val=2, image_size=size if isinstance(size, int) else max(size), seed=0),
                    device="cpu,cpu", epochs=1, batch=2 * batch_per_rank, imgsz=size, workers=0, plots=False,
                    verbose=False, project=project)
    return {
        "imgsz": size if isinstance(size, int) else max(size),
        "largest_rank_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "parent_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="model names, e.g. rfdetr-n deimv2-s")
    parser.add_argument("--batch", type=int, default=2, help="images per rank (default 2)")
    parser.add_argument("--imgsz", type=int, default=None, help="input size (default: the model's published size)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one model in this process
    arguments = parser.parse_args()
    if arguments.one:
        print(json.dumps(measure(arguments.one, arguments.batch, arguments.imgsz)))
        return
    print(f"{'model':<14}{'imgsz':>6}{'batch/rank':>12}{'largest rank MiB':>18}{'parent MiB':>12}{'seconds':>9}")
    for name in arguments.models:
        command = [sys.executable, __file__, "x", "--one", name, "--batch", str(arguments.batch)]
        if arguments.imgsz:
            command += ["--imgsz", str(arguments.imgsz)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        row = json.loads(output)
        print(f"{name:<14}{row['imgsz']:>6}{arguments.batch:>12}{row['largest_rank_mib']:>18.0f}{row['parent_mib']:>12.0f}"
              f"{row['seconds']:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
