"""Soak: 30 consecutive two-rank trainings from one process; resources must return to their baseline.

Each launch trains ``tinynet-s`` (the test family, tests/doubles.py) on two CPU ranks for one
optimizer step, from this process, as a notebook or a test suite does. Printed: the counts before
the first launch, after it (the baseline: the first launch starts the workers' forkserver and
multiprocessing's resource tracker, which stay for the process's life by design), after the last,
every launch whose counts differ from the baseline, and the RSS growth over the last 20 launches
against the bound in tests/soak.py (``RSS_GROWTH_BOUND_MB``). Exit status 1 if anything leaked.

    .venv/bin/python benchmarks/soak.py [--launches 30] [--json report.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.soak, run from anywhere
os.environ.setdefault("ZOO_DISABLE_PLUGIN_AUTOLOAD", "1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=30)
    parser.add_argument("--json", type=Path, help="also write every launch's counts here")
    arguments = parser.parse_args()
    from tests.soak import RSS_GROWTH_BOUND_MB, soak

    with tempfile.TemporaryDirectory(prefix="soak-") as workspace:
        report = soak(arguments.launches, Path(workspace))
    row = "{:<22} {:>5} {:>8} {:>9} {:>13} {:>9}"
    print(row.format("", "fds", "threads", "children", "temp folders", "RSS MB"))
    for label, counts in (("before launch 1", report.before), ("after launch 1", report.baseline),
                          (f"after launch {len(report.after)}", report.after[-1])):
        print(row.format(label, counts.fds, counts.threads, counts.children, counts.temp_folders, f"{counts.rss_mb:.1f}"))
    leaks = report.leaks
    growth = report.rss_growth_mb(20)
    print(f"\nlaunches: {len(report.after)}; seconds per launch: median {statistics.median(report.seconds):.2f}, "
          f"first {report.seconds[0]:.2f}")
    print(f"launches whose counts differ from the baseline: {len(leaks)}")
    for index, counts in leaks:
        print(f"  launch {index}: {counts}")
    print(f"RSS growth over the last 20 launches: {growth:+.1f} MB (bound {RSS_GROWTH_BOUND_MB:.0f} MB)")
    if arguments.json:
        arguments.json.write_text(json.dumps(report.as_dict(), indent=2))
    return 0 if not leaks and growth < RSS_GROWTH_BOUND_MB else 1


if __name__ == "__main__":
    sys.exit(main())
