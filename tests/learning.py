"""What a learning test is run with, and what it scored: the seed, the thread count and the scores.

A learning test (marked ``learning``) trains a family on a fixed sample and asserts that it scored
above a threshold. Floating-point sums differ between processors and thread counts, so a test is
only as good as its margin over every seed and thread count it may meet. The ``learning`` fixture
(tests/conftest.py) hands each such test a ``LearningRun``:

- ``seed`` seeds everything random the test owns: the model's initial weights and the run's
  ``seed=`` (sampler, augmentation, a re-drawn class head), each through its own generator;
  ``pytest --learning-seed N`` (default 0, what the suite runs);
- ``threads``: torch's thread count for the test, ``--learning-threads N`` (default: the session's,
  one per worker under ``make test``);
- ``expect(scores, minimum)`` asserts every score against its threshold and, with
  ``--learning-report FILE``, appends them to FILE as one JSON line.

``benchmarks/learning_margins.py`` runs every learning test over several seeds and both thread
counts and prints each threshold against the worst score it met.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LearningRun", "MARGIN"]

# A threshold is at most this fraction of the worst score measured over seeds and thread counts.
MARGIN = 0.8


@dataclass(frozen=True)
class LearningRun:
    """The seed and thread count one learning test runs with, and where its scores go."""

    test: str
    seed: int
    threads: int
    report: Path | None = None

    def expect(self, scores: Mapping[str, float], minimum: Mapping[str, float], *,
               checks: Mapping[str, bool] | None = None) -> None:
        """Assert ``scores[name] >= minimum[name]`` for every name in ``minimum``, and that every one of
        ``checks`` (pass/fail facts such as "the drawing shows only true classes") holds.

        Everything is recorded first, so the report holds the scores of a run that failed too.
        """
        measured = {name: float(scores[name]) for name in minimum}
        facts = dict(checks or {})
        if self.report is not None:
            line = {"test": self.test, "seed": self.seed, "threads": self.threads, "scores": measured,
                    "minimum": dict(minimum), "checks": facts}
            with self.report.open("a", encoding="utf-8") as file:
                file.write(json.dumps(line) + "\n")
        low = {name: value for name, value in measured.items() if not value >= minimum[name]}
        failed = [name for name, held in facts.items() if not held]
        assert not low and not failed, (
            f"{self.test} at seed {self.seed} on {self.threads} thread(s): "
            + ", ".join([f"{name} {value:.4g} < {minimum[name]}" for name, value in low.items()]
                        + [f"{name} did not hold" for name in failed])
            + f" (all scores: {measured})"
        )
