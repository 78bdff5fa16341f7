"""Every size of every family against LibreYOLO 1.6, the output oracle: a table of parameters and differences.

For each size: LibreYOLO builds the model at random initialisation and saves its checkpoint;
zoo loads it and must reproduce LibreYOLO's eval outputs; zoo writes a LibreYOLO checkpoint that
LibreYOLO loads with zoo's outputs (tests/oracle_cases.py says what is compared per family).
The suite does this for the smallest size of each family (tests/test_libreyolo_oracle.py).

    python benchmarks/libreyolo_oracle.py                 # every family, every size
    python benchmarks/libreyolo_oracle.py yolo9 nafnet    # some families

Large sizes need memory (convnextv2-h: about 8 GB) and minutes on a CPU.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.oracle_cases, run from anywhere

from tests.oracle_cases import TOLERANCE, compare_on_random_weights, libreyolo_has_size  # noqa: E402
from zoo_core.registry import load_registry  # noqa: E402


def main(families: list[str]) -> int:
    registry = load_registry()
    chosen = families or list(registry)
    print(f"{'family':15s} {'size':7s} {'zoo params':>13s} {'LibreYOLO':>13s} {'load diff':>10s} {'write diff':>10s} {'s':>6s}")
    failures = 0
    for family in chosen:
        for size in registry[family].sizes:
            if not libreyolo_has_size(family, size):
                print(f"{family:15s} {size:7s} {'':13s} {'(none)':>13s}  LibreYOLO 1.6 has no such size: nothing to compare", flush=True)
                continue
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as directory:
                row = compare_on_random_weights(family, size, Path(directory))
            ok = (row["zoo_params"] == row["libreyolo_params"] and row["loaded_difference"] <= TOLERANCE
                  and row["written_difference"] <= TOLERANCE)
            failures += not ok
            print(f"{family:15s} {size:7s} {row['zoo_params']:13,d} {row['libreyolo_params']:13,d} "
                  f"{row['loaded_difference']:10.2e} {row['written_difference']:10.2e} {time.perf_counter() - started:6.1f}"
                  f"{'' if ok else '  <- MISMATCH'}", flush=True)
    print(f"{'all within' if not failures else f'{failures} size(s) beyond'} {TOLERANCE:g}")
    return 1 if failures else 0


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(main(sys.argv[1:]))
