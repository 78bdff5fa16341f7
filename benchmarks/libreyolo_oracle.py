"""Every size of every family against LibreYOLO 1.6, the output oracle: a table of parameters and differences.

For each size: LibreYOLO builds the model at random initialisation and saves its checkpoint;
zoo loads it and must reproduce LibreYOLO's eval outputs; zoo writes a LibreYOLO checkpoint that
LibreYOLO loads with zoo's outputs (tests/oracle_cases.py says what is compared per family).
The suite does this for the smallest size of each family (tests/test_libreyolo_oracle.py).

With ``--predictions``: the whole ``predict()`` pipeline instead of the network alone
(tests/prediction_oracle.py): LibreYOLO's perturbed checkpoint, two photo-like PNGs, LibreYOLO's and zoo's
``predict`` with the same arguments, and per size the task's figure (matched share of LibreYOLO's top-30
boxes or points (and of equal pixels of the matched instances' masks), share of equal mask pixels, top-5 equal, restored levels within 1), the worst score /
probability / level difference and whether it passes (tests/test_libreyolo_predictions.py: smallest sizes).

    python benchmarks/libreyolo_oracle.py                 # every family, every size
    python benchmarks/libreyolo_oracle.py yolo9 nafnet    # some families
    python benchmarks/libreyolo_oracle.py --predictions [families...]
    python benchmarks/libreyolo_oracle.py --predictions -v yolo9    # and every image's figures

Large sizes need memory (convnextv2-h: about 8 GB) and minutes on a CPU.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.oracle_cases, run from anywhere

from tests.oracle_cases import TOLERANCE, compare_on_random_weights, libreyolo_has_size  # noqa: E402
from zoo_core.registry import load_registry  # noqa: E402


def comparable_sizes(families: list[str]) -> Iterator[tuple[str, str, str]]:
    """``(family, size, task)`` of every size of ``families`` (default: all) that LibreYOLO 1.6 builds too; a line
    is printed for each size it lacks."""
    registry = load_registry()
    for family in families or list(registry):
        for size in registry[family].sizes:
            if libreyolo_has_size(family, size):
                yield family, size, registry[family].task
            else:
                print(f"{family:15s} {size:7s} {registry[family].task:9s} LibreYOLO 1.6 has no such size: nothing to compare",
                      flush=True)


def predictions(families: list[str], verbose: bool = False) -> int:
    """``compare_predictions`` for every size of ``families`` (default: all): one row per size."""
    from tests.prediction_oracle import compare_predictions

    print(f"{'family':15s} {'size':7s} {'task':9s} {'figure':>26s} {'worst diff':>10s} {'passes':>6s} {'s':>6s}")
    failures = 0
    for family, size, task in comparable_sizes(families):
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as directory:
            try:
                row = compare_predictions(family, size, Path(directory))
            except Exception as error:  # a size that cannot be compared is a row, not the end of the table
                failures += 1
                print(f"{family:15s} {size:7s} {task:9s} ERROR {type(error).__name__}: "
                      f"{str(error).splitlines()[0][:160] if str(error) else ''}", flush=True)
                continue
        failures += not row.passes
        if row.task in ("detect", "points"):
            counted = sum(image.considered for image in row.images)
            figure = f"{sum(image.matched for image in row.images)}/{counted} matched {row.fraction:6.1%}"
        elif row.task == "segment":
            counted = sum(image.considered for image in row.images)
            figure = f"{sum(image.matched for image in row.images)}/{counted} {row.fraction:5.1%} px {row.mask_fraction:6.3%}"
        elif row.task == "classify":
            figure = f"top-5 {'equal' if row.same_top5 else 'DIFFERENT'}"
        elif row.task == "semantic":
            figure = f"pixels equal {row.fraction:8.4%}"
        else:
            figure = f"levels within 1 {min(image.fraction for image in row.images):7.3%}"
        print(f"{family:15s} {size:7s} {row.task:9s} {figure:>26s} {row.worst:10.3g} {'yes' if row.passes else 'NO':>6s} "
              f"{time.perf_counter() - started:6.1f}", flush=True)
        if verbose or not row.passes:
            print("\n".join("    " + line for line in row.describe().splitlines()[1:]), flush=True)
    print("every size predicts as LibreYOLO" if not failures else f"{failures} size(s) predict differently from LibreYOLO")
    return 1 if failures else 0


def main(families: list[str]) -> int:
    print(f"{'family':15s} {'size':7s} {'zoo params':>13s} {'LibreYOLO':>13s} {'load diff':>10s} {'write diff':>10s} {'s':>6s}")
    failures = 0
    for family, size, _ in comparable_sizes(families):
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
    arguments = sys.argv[1:]
    if "--predictions" in arguments:
        verbose = "-v" in arguments
        sys.exit(predictions([name for name in arguments if name not in ("--predictions", "-v")], verbose))
    sys.exit(main(arguments))
