"""Channels-last against channels-first memory on a CPU, per family: training-step time and output agreement.

For the smallest size of each family (or those named): the eval outputs of one random image in
both layouts (largest difference relative to the output's scale) and the time of a training
step (forward with the family's real loss, backward) at batch 4, 320 px, 2 threads, alternating
the layouts. Each family runs in its own process, so one that crashes in channels-last
(YOLO-NAS under torch 2.14) is reported instead of ending the run. A family is declared
``channels_last: true`` in registry.yaml where the ratio is clearly below 1 and the outputs agree.

    python benchmarks/channels_last.py                # every family
    python benchmarks/channels_last.py yolo9 rtdetr   # some families
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.oracle_cases, run from anywhere


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        value = list(value.values())
    return [tensor for item in value for tensor in _tensors(item)] if isinstance(value, (list, tuple)) else []


def measure(family: str, repeats: int) -> dict[str, Any]:
    """Output difference and step-time ratio of one family, in this process."""
    import torch

    from tests.oracle_cases import ORACLE_CASES, example_targets
    from zoo_core import LibreYOLO
    from zoo_core.registry import load_registry

    torch.set_num_threads(2)
    declaration = load_registry()[family]
    size = next(iter(declaration.sizes))
    case = ORACLE_CASES[family]
    trainable = case.libreyolo_train_step is not None or declaration.task == "detect"
    torch.manual_seed(0)
    zoo = LibreYOLO(f"{family}-{size}", num_classes=case.num_classes) if case.num_classes else LibreYOLO(f"{family}-{size}")
    model = zoo.model.eval()
    side = max(case.minimum_side, 320) if trainable else case.image_size
    images = torch.rand(4, 3, side, side)
    with torch.no_grad():
        expected = _tensors(model(images))
        model.to(memory_format=torch.channels_last)
        actual = _tensors(model(images.contiguous(memory_format=torch.channels_last)))
    difference = max(float((first - second).abs().max() / (first.abs().max() + 1e-12)) for first, second in zip(expected, actual))
    row: dict[str, Any] = {"family": family, "size": size, "difference": difference, "ratio": None, "step_ms": None}
    if not trainable:  # the oracle cases hold no training batch of this task
        return row
    recipe = zoo._manager.training_recipe(family, size)
    batch = case.zoo_batch(images, example_targets(side))
    model.train()
    samples: dict[Any, list[float]] = {torch.contiguous_format: [], torch.channels_last: []}

    def step(layout: Any) -> float:
        started = time.perf_counter()
        model.zero_grad(set_to_none=True)
        recipe.forward_train(model, {**batch, "images": batch["images"].contiguous(memory_format=layout)})[0].backward()
        return time.perf_counter() - started

    for layout in samples:
        model.to(memory_format=layout)
        step(layout)  # warm-up in this layout
    for _ in range(repeats):
        for layout in samples:
            model.to(memory_format=layout)
            samples[layout].append(step(layout))
    channels_first = statistics.median(samples[torch.contiguous_format])
    row.update(ratio=statistics.median(samples[torch.channels_last]) / channels_first, step_ms=channels_first * 1000)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help="families (default: every family)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one family in this process
    arguments = parser.parse_args()
    if arguments.one:
        print("ROW " + json.dumps(measure(arguments.one, arguments.repeats)))
        return 0
    from zoo_core.registry import load_registry

    registry = load_registry()
    print(f"{'family':15s} {'declared':>8s} {'output diff':>12s} {'step ms':>8s} {'NHWC/NCHW':>10s}")
    for family in arguments.families or list(registry):
        declared = "yes" if registry[family].channels_last else "no"
        finished = subprocess.run([sys.executable, __file__, "--one", family, "--repeats", str(arguments.repeats)],
                                  capture_output=True, text=True, check=False)
        rows = [line[4:] for line in finished.stdout.splitlines() if line.startswith("ROW ")]
        if finished.returncode != 0 or not rows:
            print(f"{family:15s} {declared:>8s}  failed in channels-last (exit {finished.returncode}): "
                  f"{(finished.stderr.strip().splitlines() or [''])[-1][:80]}", flush=True)
            continue
        row = json.loads(rows[0])
        step = "-" if row["step_ms"] is None else f"{row['step_ms']:.0f}"
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(f"{family:15s} {declared:>8s} {row['difference']:12.1e} {step:>8s} {ratio:>10s}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
