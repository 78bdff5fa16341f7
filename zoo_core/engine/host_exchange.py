"""Sums of small CPU tensors over the ranks of one machine, through direct loopback sockets.

CPU SyncBatchNorm (``sync_batchnorm.py``) makes two all-reduces of a few hundred numbers per
layer and step: hundreds a step on a YOLO. Gloo's all-reduce of such a vector between two CPU
ranks on one machine waits for its I/O thread to be woken on both sides, so those collectives,
not the arithmetic, made CPU SyncBatchNorm cost a multiple of plain BatchNorm. A socket per pair
of ranks, written and read by the rank itself and polled briefly before it blocks, moves the same
bytes about fifty times sooner (docs/performance.md).

``open_host_exchange`` connects the ranks of a process group when they all run on this machine
(a collective: every rank calls it at the same point) and returns ``None`` otherwise, when the
caller keeps gloo. Every rank adds the contributions in rank order, so all ranks get the same
bits, as they do from gloo. A peer that exits or disagrees about the size of a sum is an error
(``HostExchangeError``), never a hang; a peer that stops answering is one after the process
group's timeout.
"""

from __future__ import annotations

import os
import secrets
import select
import socket
import struct
import time
from typing import TYPE_CHECKING, Any

from zoo_core.errors import HostExchangeError

if TYPE_CHECKING:
    import torch

__all__ = ["HostExchange", "open_host_exchange", "host_exchange_for", "close_host_exchanges"]

LOOPBACK = "127.0.0.1"
# How long a rank polls for its peers' bytes before it sleeps in select(): the ranks of a SyncBatchNorm
# layer arrive within about a millisecond of each other, and waking from a sleep costs tens of microseconds
# to a millisecond on a virtual machine. While polling the rank yields to any other runnable thread (DDP's
# gradient all-reduce, data-loading workers), so the wait costs them nothing.
SPIN_SECONDS = 0.002
_HEADER = struct.Struct("<q")  # the byte length of a contribution, so that mismatched calls fail loudly
_HELLO = struct.Struct("<16si")  # the group's token and the connecting rank


class HostExchange:
    """Connected sockets to every other rank of a group on this machine, and the sum over them."""

    def __init__(self, rank: int, peers: dict[int, socket.socket], timeout_seconds: float) -> None:
        self.rank = rank
        self.peers = peers
        self.timeout_seconds = timeout_seconds

    def all_reduce_sum_(self, tensor: "torch.Tensor") -> "torch.Tensor":
        """Replace the contiguous CPU ``tensor`` by its element-wise sum over the ranks, in rank order; return it."""
        import torch

        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"the host exchange sums contiguous CPU tensors, got one on {tensor.device} "
                             f"(contiguous: {tensor.is_contiguous()}); call .cpu().contiguous() first")
        payload = tensor.detach().numpy().tobytes()
        outgoing = {peer: memoryview(_HEADER.pack(len(payload)) + payload) for peer in self.peers}
        incoming = {peer: bytearray(_HEADER.size + len(payload)) for peer in self.peers}
        self._transfer(outgoing, incoming)
        contributions: dict[int, torch.Tensor] = {self.rank: tensor.detach().clone()}
        for peer, data in incoming.items():
            (length,) = _HEADER.unpack_from(data)
            if length != len(payload):
                raise HostExchangeError(
                    f"rank {peer} summed {length} bytes where rank {self.rank} summed {len(payload)}: the ranks ran "
                    "different layers (every rank must run the same model on the same code path in training mode)")
            contributions[peer] = torch.frombuffer(data, dtype=tensor.dtype, offset=_HEADER.size).view_as(tensor)
        ordered = [contributions[rank] for rank in sorted(contributions)]
        total = ordered[0].clone()
        for contribution in ordered[1:]:
            total += contribution
        return tensor.copy_(total)

    def _transfer(self, outgoing: dict[int, memoryview], incoming: dict[int, bytearray]) -> None:
        """Send every peer its bytes and fill every peer's buffer, sending and receiving together (no deadlock)."""
        sent = dict.fromkeys(outgoing, 0)
        received = dict.fromkeys(incoming, 0)
        spin_until = time.perf_counter() + SPIN_SECONDS
        deadline = time.monotonic() + self.timeout_seconds
        while True:
            progressed = False
            for peer, data in outgoing.items():
                if sent[peer] < len(data):
                    try:
                        sent[peer] += self.peers[peer].send(data[sent[peer]:])
                        progressed = True
                    except BlockingIOError:
                        pass
                    except OSError as error:
                        raise self._lost(peer, error) from error
            for peer, buffer in incoming.items():
                if received[peer] < len(buffer):
                    try:
                        count = self.peers[peer].recv_into(memoryview(buffer)[received[peer]:])
                    except BlockingIOError:
                        continue
                    except OSError as error:
                        raise self._lost(peer, error) from error
                    if count == 0:
                        raise self._lost(peer, None)
                    received[peer] += count
                    progressed = True
            waiting_to_send = [self.peers[p] for p, data in outgoing.items() if sent[p] < len(data)]
            waiting_to_receive = [self.peers[p] for p, buffer in incoming.items() if received[p] < len(buffer)]
            if not waiting_to_send and not waiting_to_receive:
                return
            if progressed:
                continue
            if time.perf_counter() < spin_until:
                _yield_processor()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HostExchangeError(
                    f"rank {self.rank} waited {self.timeout_seconds:.0f} s (the process-group timeout, ddp_timeout) for "
                    "its peers' SyncBatchNorm statistics: another rank is stuck; its own error or traceback says why")
            select.select(waiting_to_receive, waiting_to_send, [], remaining)

    def _lost(self, peer: int, error: OSError | None) -> HostExchangeError:
        reason = f" ({error})" if error is not None else ""
        return HostExchangeError(
            f"rank {peer} closed its connection to rank {self.rank} in the middle of training{reason}: it exited or "
            "failed; its own error says why")

    def close(self) -> None:
        """Close every connection (idempotent)."""
        for connection in self.peers.values():
            connection.close()
        self.peers = {}


def _yield_processor() -> None:
    """Let another runnable thread of this machine run (no-op where the OS has no sched_yield)."""
    if hasattr(os, "sched_yield"):
        os.sched_yield()


def _machine_identity() -> str:
    """Host name and boot id: equal for two processes exactly when they can reach each other over loopback."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as stream:
            boot = stream.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _connect_ranks(rank: int, addresses: list[tuple[str, int, bytes]], listener: socket.socket,
                   timeout_seconds: float) -> dict[int, socket.socket]:
    """Connect to every lower rank and accept every higher one, each checked by the group's token."""
    token = addresses[0][2]
    peers: dict[int, socket.socket] = {}
    try:
        for peer in range(rank):
            connection = socket.create_connection((LOOPBACK, addresses[peer][1]), timeout=timeout_seconds)
            peers[peer] = connection
            connection.sendall(_HELLO.pack(token, rank))
        listener.settimeout(timeout_seconds)
        for _ in range(rank + 1, len(addresses)):
            connection, _ = listener.accept()
            connection.settimeout(timeout_seconds)
            hello = b""
            while len(hello) < _HELLO.size:
                chunk = connection.recv(_HELLO.size - len(hello))
                if not chunk:
                    break
                hello += chunk
            if len(hello) != _HELLO.size or _HELLO.unpack(hello)[0] != token:
                connection.close()
                raise HostExchangeError("a connection that is not from this process group reached the exchange's port")
            peers[_HELLO.unpack(hello)[1]] = connection
    except BaseException:
        for connection in peers.values():
            connection.close()
        raise
    for connection in peers.values():
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a contribution is one small write
        connection.setblocking(False)
    return peers


_open_exchanges: list[tuple[Any, HostExchange]] = []  # (process group, its exchange); the group is held so ids stay unique


def open_host_exchange(group: Any = None, timeout_seconds: float = 1800.0) -> HostExchange | None:
    """Connect the ranks of ``group`` (default: the whole run) when all run on this machine; ``None`` otherwise.

    A collective over ``group``: every rank must call it at the same point. It agrees on the
    outcome, so either every rank has an exchange or none has (and they keep gloo).
    """
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    existing = host_exchange_for(group)
    if existing is not None:
        return existing
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((LOOPBACK, 0))
        listener.listen(world_size)
        announced: list[Any] = [None] * world_size
        dist.all_gather_object(announced, (_machine_identity(), listener.getsockname()[1], secrets.token_bytes(16)), group=group)
        if len({identity for identity, _, _ in announced}) != 1:
            return None  # ranks on several machines: gloo carries the statistics
        failure = ""
        try:
            peers = _connect_ranks(rank, announced, listener, timeout_seconds=min(timeout_seconds, 60.0))
        except (OSError, HostExchangeError) as error:
            peers, failure = {}, f"{type(error).__name__}: {error}"
    outcomes: list[Any] = [None] * world_size
    dist.all_gather_object(outcomes, failure, group=group)
    if any(outcomes):
        for connection in peers.values():
            connection.close()
        return None
    exchange = HostExchange(rank, peers, timeout_seconds)
    _open_exchanges.append((group, exchange))
    return exchange


def host_exchange_for(group: Any = None) -> HostExchange | None:
    """The open exchange of ``group`` (default: the whole run), or ``None``."""
    import torch.distributed as dist

    if group is None:
        if not dist.is_initialized():
            return None
        group = dist.group.WORLD
    for owner, exchange in _open_exchanges:
        if owner is group:
            return exchange
    return None


def close_host_exchanges() -> None:
    """Close every open exchange: called when the process group is destroyed."""
    while _open_exchanges:
        _, exchange = _open_exchanges.pop()
        exchange.close()
