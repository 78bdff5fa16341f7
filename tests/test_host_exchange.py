"""The host exchange (CPU SyncBatchNorm's transport): sums like gloo, and fails loudly instead of hanging.

One spawned run of two gloo ranks plays every scenario in turn and writes what each rank saw;
the tests read those records. Scenarios that break the connection come last.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zoo_core.engine import host_exchange
from zoo_core.engine.distributed import DistributedContext, find_free_port
from zoo_core.errors import HostExchangeError

pytestmark = pytest.mark.timeout(180)


def contribution(rank: int, size: int) -> torch.Tensor:
    """Rank-specific float64 values of very different magnitudes (so that the order of the sum shows in the bits)."""
    generator = torch.Generator().manual_seed(100 + rank)
    return torch.randn(size, generator=generator, dtype=torch.float64) * 10.0 ** torch.randint(-8, 8, (size,), generator=generator)


def play(rank: int, port: int, result_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    record: dict = {}
    try:
        # Ranks that report different machines keep gloo: nobody gets an exchange.
        real_identity = host_exchange._machine_identity
        host_exchange._machine_identity = lambda: f"machine-{rank}"
        record["separate_machines"] = host_exchange.open_host_exchange() is None
        host_exchange._machine_identity = real_identity

        exchange = host_exchange.open_host_exchange(timeout_seconds=60)
        record["same_machine"] = exchange is not None and host_exchange.host_exchange_for(None) is exchange
        # The sum, bit for bit what gloo gives, for a vector and a payload far beyond the sockets' buffers.
        for size in (129, 2_000_000):
            mine = contribution(rank, size)
            by_gloo = mine.clone()
            dist.all_reduce(by_gloo)
            summed = exchange.all_reduce_sum_(mine.clone())
            record[f"equal_to_gloo_{size}"] = torch.equal(summed, by_gloo)
        # Rank 1 runs a different layer (more channels): rank 0 names the mismatch, rank 1 then sees rank 0 go.
        try:
            exchange.all_reduce_sum_(torch.ones(3 + rank, dtype=torch.float64))
        except HostExchangeError as error:
            record["mismatch"] = str(error)
        if rank == 0:
            exchange.close()  # as a rank that failed and exited
        else:
            try:
                exchange.all_reduce_sum_(torch.ones(3, dtype=torch.float64))
            except HostExchangeError as error:
                record["peer_gone"] = str(error)
        # The engine's context closes the exchanges with the process group.
        context = DistributedContext(rank, rank, 2, torch.device("cpu"), "gloo", owns_group=True)
        context.close()
        record["closed_with_the_group"] = host_exchange.host_exchange_for(None) is None and not exchange.peers
    finally:
        with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as stream:
            json.dump(record, stream)
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[dict]:
    result_dir = tmp_path_factory.mktemp("host_exchange")
    context = mp.start_processes(play, args=(find_free_port(), str(result_dir)), nprocs=2, join=False, start_method="spawn")
    try:
        while not context.join(timeout=150):
            pass
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [json.loads((result_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_ranks_on_separate_machines_keep_gloo(records):
    assert [record["separate_machines"] for record in records] == [True, True]


def test_ranks_on_one_machine_connect(records):
    assert [record["same_machine"] for record in records] == [True, True]


@pytest.mark.parametrize("size", [129, 2_000_000])
def test_the_sum_is_gloos_bit_for_bit_on_every_rank(records, size):
    assert [record[f"equal_to_gloo_{size}"] for record in records] == [True, True]


def test_a_rank_that_ran_another_layer_is_named(records):
    assert "rank 1 summed 32 bytes where rank 0 summed 24" in records[0]["mismatch"]
    assert "different layers" in records[0]["mismatch"]


def test_a_peer_that_exits_is_an_error_not_a_hang(records):
    assert "rank 0 closed its connection to rank 1" in records[1]["peer_gone"]


def test_closing_the_process_group_closes_the_exchange(records):
    assert [record["closed_with_the_group"] for record in records] == [True, True]


def test_it_sums_contiguous_cpu_tensors_only():
    exchange = host_exchange.HostExchange(rank=0, peers={}, timeout_seconds=1)
    with pytest.raises(ValueError, match=r"contiguous CPU tensors.*\.contiguous\(\)"):
        exchange.all_reduce_sum_(torch.ones(4, 4).t())
    assert torch.equal(exchange.all_reduce_sum_(torch.arange(3.0)), torch.arange(3.0))  # one rank: itself
