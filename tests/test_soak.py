"""Soak, the short version: consecutive two-rank trainings from this process leave nothing behind.

The test suite is itself "one process that launches many trainings". After the first launch
(which starts the workers' forkserver and multiprocessing's resource tracker, kept by design),
every launch must return open descriptors, OS threads, live child processes and zoo's temp
folders exactly to their counts after the first. ``benchmarks/soak.py`` runs 30 launches and
also bounds the RSS growth (docs/faults.md has its figures).
"""

from __future__ import annotations

import pytest

from .soak import soak

pytestmark = pytest.mark.timeout(300)

LAUNCHES = 4


def test_consecutive_two_rank_trainings_return_every_resource_to_its_baseline(tmp_path):
    report = soak(LAUNCHES, tmp_path)
    assert len(report.after) == LAUNCHES
    assert not report.leaks, f"baseline {report.baseline}; differing launches: {report.leaks}"
    assert report.baseline.temp_folders == 0, "a launch left its private temp folder behind"
    # The forkserver and the resource tracker (started by the first launch, or earlier in this process) are
    # all that may stay; the workers themselves are gone.
    assert report.baseline.children <= report.before.children + 2
