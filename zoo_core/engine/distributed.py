"""Process-group set-up and the few collectives the trainer needs.

One code path serves torchrun and spawned workers: both arrive here with the torchrun
variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) in the environment.
Decisions are made on rank 0 and broadcast so every rank acts on the same value (E9, E19).
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from zoo_core.errors import PeerFailedError

if TYPE_CHECKING:
    import torch

__all__ = [
    "TORCHRUN_VARIABLES",
    "DistributedContext",
    "torchrun_environment",
    "choose_backend",
    "init_distributed",
    "single_process_context",
    "find_free_port",
    "is_address_in_use_error",
]

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
LOOPBACK = "127.0.0.1"


def torchrun_environment() -> bool:
    """True inside a torchrun (or zoo-spawned) rank: RANK, LOCAL_RANK and WORLD_SIZE are set."""
    return all(name in os.environ for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))


def choose_backend(device: "torch.device") -> str:
    """NCCL when this rank is on CUDA and NCCL is built (never on Windows), otherwise gloo (E11)."""
    import torch.distributed as dist

    if device.type == "cuda" and sys.platform != "win32" and dist.is_nccl_available():
        return "nccl"
    return "gloo"


@dataclass
class DistributedContext:
    """Who this process is in the run, and the collectives it needs."""

    rank: int
    local_rank: int
    world_size: int
    device: "torch.device"
    backend: str | None = None
    owns_group: bool = False  # True when this context created the process group (and destroys it)

    @property
    def distributed(self) -> bool:
        """True when several ranks train together."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, which owns every side effect (E9)."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every rank (no-op on one process)."""
        if self.distributed:
            import torch.distributed as dist

            if self.backend == "nccl":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (pickled; for small objects such as names and specs)."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        holder = [value if self.is_main else None]
        dist.broadcast_object_list(holder, src=0, device=self.device if self.backend == "nccl" else None)
        return holder[0]

    def broadcast_int(self, value: int) -> int:
        """Rank 0's integer on every rank, sent as one long tensor."""
        if not self.distributed:
            return int(value)
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([int(value) if self.is_main else 0], dtype=torch.long, device=self.device)
        dist.broadcast(tensor, src=0)
        return int(tensor.item())

    def broadcast_buffers(self, module: "torch.nn.Module") -> None:
        """Overwrite ``module``'s buffers (BatchNorm running statistics) with rank 0's, in place.

        DDP sends rank 0's buffers at the start of each forward, so after the last training step every
        rank holds statistics updated with its own batch; validation needs the ones the checkpoint keeps.
        One broadcast per dtype keeps the cost at a couple of messages, not one per BatchNorm.
        """
        if not self.distributed:
            return
        import torch
        import torch.distributed as dist

        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for buffer in module.buffers():
            by_dtype.setdefault(buffer.dtype, []).append(buffer)
        for buffers in by_dtype.values():
            flat = torch.cat([buffer.detach().reshape(-1) for buffer in buffers])
            dist.broadcast(flat, src=0)
            offset = 0
            with torch.no_grad():
                for buffer in buffers:
                    buffer.copy_(flat[offset: offset + buffer.numel()].view_as(buffer))
                    offset += buffer.numel()

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of ``values`` over the ranks (float64)."""
        if not self.distributed:
            return list(values)
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def compute_on_main(self, compute: Callable[[], Any]) -> Any:
        """Run ``compute`` on rank 0 only and give every rank its value, or its failure (never a hang).

        Rank 0 raises its own error; the other ranks raise ``PeerFailedError`` quoting it.
        """
        if not self.distributed:
            return compute()
        outcome = None
        if self.is_main:
            try:
                outcome = ("ok", compute())
            except Exception as error:
                self.broadcast_object(("error", f"{type(error).__name__}: {error}"))
                raise
        status, payload = self.broadcast_object(outcome)
        if status == "error":
            # Its own type, so the launcher blames rank 0 (whose error this is), not the rank that reported first.
            raise PeerFailedError(f"rank 0 failed, so rank {self.rank} stops too: {payload}")
        return payload

    def close(self) -> None:
        """Destroy the process group if this context created it (and CPU SyncBatchNorm's connections with it)."""
        if self.owns_group:
            import torch.distributed as dist

            from zoo_core.engine.host_exchange import close_host_exchanges

            close_host_exchanges()
            if dist.is_initialized():
                dist.destroy_process_group()
            self.owns_group = False


def single_process_context(device: "torch.device") -> DistributedContext:
    """The context of a plain one-process run."""
    return DistributedContext(rank=0, local_rank=0, world_size=1, device=device)


def init_distributed(device: "torch.device", timeout_seconds: float) -> DistributedContext:
    """Join (or reuse) the process group described by the torchrun variables.

    ``device`` is this rank's device (cuda:LOCAL_RANK, or CPU). The backend follows E11; the
    timeout bounds every collective (default 3 hours, ``ddp_timeout``).
    """
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = choose_backend(device)
    owns_group = False
    if world_size > 1 and not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_seconds)
        rendezvous = {"init_method": "env://"}
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if restart is not None:
            # After an elastic restart torch 2.14's agent still serves the store of the group that died,
            # whose keys (the dead ranks' addresses) the new group would read: each attempt gets its own keys.
            store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
            rendezvous = {"store": dist.PrefixStore(f"zoo/attempt{restart}/", store)}
        dist.init_process_group(
            backend=backend, rank=rank, world_size=world_size, timeout=timeout,
            device_id=device if device.type == "cuda" else None, **rendezvous,
        )
        owns_group = True
    elif dist.is_initialized():
        backend = dist.get_backend()
    return DistributedContext(rank, local_rank, world_size, device, backend, owns_group)


def find_free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it; loopback only, never all interfaces)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def is_address_in_use_error(text: str) -> bool:
    """Whether an error text is a rendezvous port clash (EADDRINUSE)."""
    lowered = text.lower()
    return "eaddrinuse" in lowered or "address already in use" in lowered
