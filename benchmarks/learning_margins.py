"""Every learning test over several seeds and both thread counts: each threshold against the worst score.

A learning test (a family overfitting a fixed sample, marked ``learning``; tests/learning.py) is only
as good as its margin: floating-point sums differ between processors and thread counts, so a run
that clears its threshold narrowly on one machine fails on another. This script runs every
learning test (``make test`` and ``make test-all``: the slow ones too) at each seed on one and on
two torch threads, each configuration as one pytest session, and prints per score the threshold,
the worst and the median score, and whether the threshold is at most ``MARGIN`` (0.8) of the worst:

    python benchmarks/learning_margins.py                      # seeds 0 1 2 × threads 1 2, every learning test
    python benchmarks/learning_margins.py -k yolox --seeds 0 1 2 3
    python benchmarks/learning_margins.py --report margins.jsonl --table-only   # print a finished report again

One-thread configurations run on two pytest workers at once (one thread each); two-thread
configurations run alone, so the figures do not depend on the machine being idle: only the
processor and the thread count change the sums. About 40 minutes on a two-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.learning import MARGIN  # noqa: E402


def run_configuration(seed: int, threads: int, report: Path, selection: list[str], workers: int) -> int:
    """One pytest session of every selected learning test at ``seed`` on ``threads`` threads; its exit code."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "learning",
               f"--learning-seed={seed}", f"--learning-threads={threads}", f"--learning-report={report}",
               "-n", str(workers), *selection]
    print(f"seed {seed}, {threads} thread(s): {' '.join(command[3:])}", flush=True)
    completed = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = completed.stdout.strip().splitlines()[-1:] or [""]
    print(f"  -> {tail[0]}", flush=True)
    return completed.returncode


def table(lines: list[dict]) -> tuple[str, bool]:
    """The margins table of a report's lines, and whether every score and check holds with margin."""
    by_score: dict[tuple[str, str], list[tuple[float, int, int]]] = defaultdict(list)
    minimum: dict[tuple[str, str], float] = {}
    checks: dict[str, list[bool]] = defaultdict(list)
    for line in lines:
        test = line["test"].split("::")[-1]
        for name, value in line["scores"].items():
            by_score[(test, name)].append((value, line["seed"], line["threads"]))
            minimum[(test, name)] = line["minimum"][name]
        for name, held in line["checks"].items():
            checks[f"{test} {name}"].append(held)
    rows = [f"{'test':<72} {'score':<14} {'runs':>4} {'threshold':>9} {'worst':>8} {'median':>8} {'thr/worst':>9}  "]
    all_hold = True
    for (test, name), values in sorted(by_score.items()):
        worst, seed, threads = min(values)
        threshold = minimum[(test, name)]
        ratio = threshold / worst if worst > 0 else float("inf")
        holds = ratio <= MARGIN
        all_hold &= holds
        rows.append(f"{test:<72} {name:<14} {len(values):>4} {threshold:>9.4g} {worst:>8.4g} "
                    f"{statistics.median(v for v, _, _ in values):>8.4g} {ratio:>9.2f}  "
                    f"{'ok' if holds else f'NO MARGIN (worst at seed {seed}, {threads} thread(s))'}")
    for name, held in sorted(checks.items()):
        all_hold &= all(held)
        rows.append(f"{name:<87} {len(held):>4} {'':>9} {sum(held):>5}/{len(held):<2} held"
                    f"{'' if all(held) else '  FAILED in some runs'}")
    return "\n".join(rows), all_hold


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k expression: only these learning tests")
    parser.add_argument("--report", type=Path, default=None, help="JSON-lines file to keep (default: a temporary one)")
    parser.add_argument("--table-only", action="store_true", help="print the table of an existing --report")
    arguments = parser.parse_args()

    selection = ["-k", arguments.keyword] if arguments.keyword else []
    with tempfile.TemporaryDirectory(prefix="zoo-learning-") as scratch:
        report = arguments.report or Path(scratch) / "report.jsonl"
        if not arguments.table_only:
            for threads in arguments.threads:
                for seed in arguments.seeds:
                    # one thread per worker on two workers; a two-thread run alone
                    run_configuration(seed, threads, report, selection, workers=2 if threads == 1 else 0)
        lines = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
        text, all_hold = table(lines)
    print(f"\nLearning tests: thresholds against the worst of seeds {arguments.seeds} × threads {arguments.threads} "
          f"(margin: threshold <= {MARGIN} × worst); {os.cpu_count()} cores")
    print(text)
    print("every learning test holds with margin" if all_hold else "some learning tests lack margin")
    return 0 if all_hold else 1


if __name__ == "__main__":
    raise SystemExit(main())
