"""Wall time of `zoo list --ddp-capable` against a bare `python -c "import torch"`, side by side.

Each command runs several times, alternating, in fresh processes; the medians and their ratio are
printed. Target: `zoo list --ddp-capable` at most 0.25 s and under a fifth of `import torch`.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def wall_time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(repeats: int = 7) -> None:
    zoo = shutil.which("zoo") or str(Path(sys.executable).with_name("zoo"))
    commands = {
        "zoo list --ddp-capable": [zoo, "list", "--ddp-capable"],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    }
    for command in commands.values():  # warm the file cache once
        wall_time(command)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            samples[name].append(wall_time(command))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name, value in medians.items():
        print(f"{name:28s} median {value:.3f} s over {repeats} runs")
    listing, torch_import = medians.values()
    print(f"ratio zoo list / import torch = {listing / torch_import:.3f}  (target < 0.20, and <= 0.25 s absolute)")


if __name__ == "__main__":
    main()
