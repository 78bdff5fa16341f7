"""How loader workers are started: forked, once the threads of the previous loader have ended.

Forking is what makes loader workers cheap (spawned ones re-import torch and the user's script
every epoch), but a fork taken while another thread is being created or torn down can leave the
child blocked for ever on the interpreter's thread-state lock (CPython 3.11: the child waits in
``PyOS_AfterFork_Child``). A finished loader leaves exactly such threads behind: the feeder
thread of each worker queue exits on its own, a moment after the loader closed the queue, and the
next loader (validation after training, the next epoch) forks straight away. This was seen as a
two-node torchrun run that hung at its first validation. The fork context here waits (briefly)
for those threads before each worker starts.
"""

from __future__ import annotations

import multiprocessing.context
import sys
import threading
import time

__all__ = ["loader_start_method", "settle_exiting_threads"]

# Threads a closed multiprocessing queue leaves running for a moment.
_EXITING_THREAD_NAMES = ("QueueFeederThread",)


def settle_exiting_threads(timeout: float = 1.0) -> None:
    """Join the feeder threads of closed queues (at most ``timeout`` seconds in all)."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.name not in _EXITING_THREAD_NAMES:
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        thread.join(remaining)


class _SettledForkProcess(multiprocessing.context.ForkProcess):
    """A forked process that starts once the exiting threads have ended."""

    @staticmethod
    def _Popen(process_obj):  # type: ignore[no-untyped-def, override]  # noqa: N802 - multiprocessing's name
        settle_exiting_threads()
        return multiprocessing.context.ForkProcess._Popen(process_obj)


class _SettledForkContext(multiprocessing.context.ForkContext):
    Process = _SettledForkProcess  # type: ignore[assignment]


def loader_start_method(workers: int) -> multiprocessing.context.BaseContext | None:
    """The ``multiprocessing_context`` of a DataLoader with ``workers`` workers.

    Fork (settled, see the module docstring) on Linux, as torchrun ranks do by default: a process
    started with the spawn method (our DDP ranks) would otherwise pass "spawn" on to its loader
    workers, which re-import torch and the user's script every epoch. Elsewhere: the platform's own.
    """
    if workers > 0 and sys.platform.startswith("linux"):
        return _SettledForkContext()
    return None
