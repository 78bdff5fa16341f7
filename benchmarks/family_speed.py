"""Training-step speed of each family against LibreYOLO 1.6 on the same input: forward, loss, backward.

For the smallest size of each family (or the sizes named), both implementations take the same
images (and, for detection, the same boxes), run forward with the family's real loss and
backward, at batch 2 with 2 threads. Steps alternate (zoo, LibreYOLO, zoo, ...) so drift in the
machine's load hits both alike; the medians and their ratio are printed. Target: ratio <= 1.0.

    python benchmarks/family_speed.py                  # every family with a training-step case
    python benchmarks/family_speed.py yolox rtmdet     # some families
    python benchmarks/family_speed.py yolox --side 320 --repeats 9

Each family's LibreYOLO training step is ``libreyolo_train_step`` of its case in
tests/oracle_cases.py (LibreYOLO's loss API differs per family); zoo's step is the family's
``TrainingRecipe.forward_train``, exactly what the trainer runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.oracle_cases, run from anywhere

from tests.oracle_cases import ORACLE_CASES, build_libreyolo, example_targets  # noqa: E402
from zoo_core import LibreYOLO  # noqa: E402
from zoo_core.registry import load_registry  # noqa: E402


def median_seconds(steps: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median wall time of each step, run in turn ``repeats`` times after two warm-up rounds."""
    for _ in range(2):
        for step in steps.values():
            step()
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def training_steps(family: str, size: str, side: int) -> dict[str, Callable[[], None]]:
    """The zoo and LibreYOLO training steps of one model on one shared batch."""
    case = ORACLE_CASES[family]
    assert case.libreyolo_train_step is not None
    torch.manual_seed(0)
    images = torch.rand(2, 3, side, side)
    targets = example_targets(side)
    zoo = LibreYOLO(f"{family}-{size}", num_classes=case.num_classes) if case.num_classes else LibreYOLO(f"{family}-{size}")
    recipe = zoo._manager.training_recipe(family, size)
    zoo_model = zoo.model.train()
    batch = case.zoo_batch(images, targets)
    reference = build_libreyolo(family, size)
    reference.model.train()

    def zoo_step() -> None:
        zoo_model.zero_grad(set_to_none=True)
        recipe.forward_train(zoo_model, batch)[0].backward()

    def libreyolo_step() -> None:
        reference.model.zero_grad(set_to_none=True)
        case.libreyolo_train_step(reference.model, images, targets).backward()

    return {"zoo": zoo_step, "LibreYOLO": libreyolo_step}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="families (default: every family with a training-step case)")
    parser.add_argument("--side", type=int, default=320, help="square input size in pixels (default 320)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    registry = load_registry()
    families = arguments.families or [name for name, case in ORACLE_CASES.items() if case.libreyolo_train_step and name in registry]
    print(f"{'model':18s} {'zoo s':>9s} {'LibreYOLO s':>12s} {'ratio':>7s}   (forward + loss + backward, batch 2, "
          f"{arguments.side} px, {arguments.threads} threads, median of {arguments.repeats})")
    for family in families:
        size = next(iter(registry[family].sizes))
        side = max(arguments.side, ORACLE_CASES[family].minimum_side)
        medians = median_seconds(training_steps(family, size, side), arguments.repeats)
        ratio = medians["zoo"] / medians["LibreYOLO"]
        print(f"{family + '-' + size:18s} {medians['zoo']:9.3f} {medians['LibreYOLO']:12.3f} {ratio:7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
