"""Soak: many consecutive two-rank trainings from one process, as a notebook or a test suite makes them.

``soak(launches, workspace)`` trains ``tinynet-s`` on two CPU ranks (one optimizer step each) that
many times from this process and measures, before the first launch and after each one: open file
descriptors, OS threads, child processes, zoo's temp folders and the resident set size. The first
launch starts the workers' forkserver (and multiprocessing's resource tracker), which stay for the
rest of the process by design (docs/architecture.md: a second launch forks at once), so the
baseline is taken after it; every later launch must return each count exactly to that baseline.
``benchmarks/soak.py`` runs 30 launches and prints the figures; ``tests/test_soak.py`` runs a few.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .doubles import use_test_families
from .support import write_class_folders

__all__ = ["Counts", "SoakReport", "counts_now", "soak", "RSS_GROWTH_BOUND_MB"]

# The bound on RSS growth over the last 20 of 30 launches (docs/faults.md). Measured: +0.0 MB (30 launches,
# 701.6 -> 701.7 MB from the first to the last); the bound leaves room for allocator noise, and a leak of
# one model, one dataset or one process group per launch would cross it within a few launches.
RSS_GROWTH_BOUND_MB = 16.0


@dataclass(frozen=True)
class Counts:
    """What this process holds at one moment."""

    fds: int
    threads: int
    children: int
    temp_folders: int
    rss_mb: float

    def same_resources(self, other: "Counts") -> bool:
        """Whether every count but the RSS is equal."""
        return (self.fds, self.threads, self.children, self.temp_folders) == (
            other.fds, other.threads, other.children, other.temp_folders)


def _children(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields.get("PPid", "").strip() == str(pid) and not fields.get("State", "").startswith(("Z", "X")):
            children.append(int(entry.name))
    return children


def _status_field(name: str) -> str:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    return "0"


def counts_now() -> Counts:
    """This process's open descriptors, OS threads, live children, zoo temp folders and RSS (Linux /proc)."""
    gc.collect()
    temp = [path for path in Path(tempfile.gettempdir()).iterdir()
            if path.name.startswith(("zoo-spawn-", "zoo-weights-")) and str(os.getpid()) in path.name]
    return Counts(
        fds=len(os.listdir("/proc/self/fd")),
        threads=int(_status_field("Threads")),
        children=len(_children(os.getpid())),
        temp_folders=len(temp),
        rss_mb=int(_status_field("VmRSS").split()[0]) / 1024,
    )


@dataclass
class SoakReport:
    """The counts before the first launch, after it (the baseline) and after every later launch."""

    before: Counts
    after: list[Counts] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    @property
    def baseline(self) -> Counts:
        return self.after[0]

    @property
    def leaks(self) -> list[tuple[int, Counts]]:
        """``(launch number, counts)`` of every launch after the first whose counts differ from the baseline."""
        return [(index, counts) for index, counts in enumerate(self.after[1:], start=2)
                if not counts.same_resources(self.baseline)]

    def rss_growth_mb(self, last: int = 20) -> float:
        """RSS after the last launch minus RSS before the last ``last`` launches."""
        window = self.after[-(last + 1):] if len(self.after) > last else self.after
        return window[-1].rss_mb - window[0].rss_mb

    def as_dict(self) -> dict:
        return {"before": asdict(self.before), "after": [asdict(counts) for counts in self.after],
                "seconds": self.seconds}


def soak(launches: int, workspace: Path, *, settle_seconds: float = 1.0) -> SoakReport:
    """Train ``launches`` times on two CPU ranks from this process; the counts around each launch.

    ``settle_seconds`` bounds the wait for threads that end on their own just after a launch
    (multiprocessing's queue feeders, the checkpoint writer's join) before counting.
    """
    from zoo_core import LibreYOLO

    use_test_families()
    data = write_class_folders(workspace / "data", per_class=4, val_per_class=2, size=16)
    # sync_bn: the ranks' BatchNorm statistics travel over the engine's host exchange (sockets, threads):
    # more of what a launch sets up and must tear down.
    settings = dict(data=str(data), device="cpu,cpu", epochs=1, batch=8, imgsz=16, workers=0, nbs=8, val=True,
                    plots=False, verbose=False, sync_bn=True, project=str(workspace / "runs"))
    report = SoakReport(before=counts_now())
    for launch in range(launches):
        started = time.monotonic()
        LibreYOLO("tinynet-s").train(**settings, name=f"soak{launch}")
        report.seconds.append(time.monotonic() - started)
        deadline = time.monotonic() + settle_seconds
        counts = counts_now()
        while report.after and not counts.same_resources(report.after[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
            counts = counts_now()
        report.after.append(counts)
    return report
