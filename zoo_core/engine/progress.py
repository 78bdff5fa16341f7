"""What rank 0 shows while it trains and validates.

On a terminal, a tqdm bar per epoch whose postfix is the running mean of the loss and of each of
its components, the learning rate and the images per second; a second bar while validating.
Piped into a file (no terminal), the bars would be one endless carriage-return line, so plain
lines with the same numbers replace them, at most one every ``interval`` seconds. The numbers are
read from the device at most a few times a second (each read waits for the device).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable, Iterator, Mapping

__all__ = ["EpochProgress", "validation_progress"]


def _on_terminal() -> bool:
    return sys.stderr.isatty()


def _bar(loader: Any, **options: Any) -> Any:
    """A tqdm bar without tqdm's monitor thread.

    The monitor is a thread started with the first bar, just before the loader forks its
    workers; a thread starting while a process forks can leave the child blocked on the
    interpreter's thread lock (CPython 3.11), which hung a two-node run. Bars here are refreshed
    by every step, so the monitor has nothing to do.
    """
    from tqdm import tqdm

    class QuietBar(tqdm):  # type: ignore[misc, type-arg]
        monitor_interval = 0

    return QuietBar(loader, **options)


class EpochProgress:
    """Iterate over a training loader while reporting the running means (a bar, or plain lines)."""

    def __init__(self, loader: Any, *, description: str, enabled: bool, batch_size: int, interval: float = 30.0,
                 refresh: float = 0.5) -> None:
        self.enabled = enabled
        self.terminal = _on_terminal()
        self.description = description
        self.batch_size = batch_size
        self.interval = interval
        self.refresh = refresh
        self.total = len(loader)
        self.loader = loader
        self.bar = _bar(loader, total=self.total, desc=description, leave=False, dynamic_ncols=True) \
            if enabled and self.terminal else None
        self.started = time.monotonic()
        self.shown_at = 0.0
        self.printed_at = self.started

    def __iter__(self) -> Iterator[Any]:
        return iter(self.bar if self.bar is not None else self.loader)

    def update(self, step: int, sums: Mapping[str, Any], steps: int, learning_rate: float) -> None:
        """Show the running means after ``steps`` steps (``sums``: summed loss items, tensors or floats)."""
        if not self.enabled:
            return
        now = time.monotonic()
        last_step = step + 1 == self.total
        if not last_step and now - self.shown_at < (self.refresh if self.terminal else self.interval):
            return
        self.shown_at = now
        means = {name: float(value) / max(steps, 1) for name, value in sums.items()}
        speed = steps * self.batch_size / max(now - self.started, 1e-9)
        numbers = {**{name: f"{value:.4f}" for name, value in means.items()}, "lr": f"{learning_rate:.3g}",
                   "img/s": f"{speed:.1f}"}
        if self.bar is not None:
            self.bar.set_postfix(numbers, refresh=True)
        elif not last_step:  # the epoch line follows the last step anyway
            shown = "  ".join(f"{name} {value}" for name, value in numbers.items())
            print(f"{self.description} step {step + 1}/{self.total}  {shown}", flush=True)

    def close(self) -> None:
        """Remove the bar (the trainer prints one line per epoch)."""
        if self.bar is not None:
            self.bar.close()


def validation_progress(loader: Iterable[Any], *, enabled: bool) -> Iterable[Any]:
    """``loader``, with a bar while it is consumed when on a terminal."""
    if not (enabled and _on_terminal()):
        return loader
    return _bar(loader, total=len(loader), desc="validating", leave=False, dynamic_ncols=True)  # type: ignore[arg-type]
