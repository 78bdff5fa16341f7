"""E8: the engine's CPU SyncBatchNorm equals BatchNorm over the global batch (two real gloo ranks).

Both of its transports: gloo's all-reduce, and the host exchange (direct loopback sockets) that
``convert_sync_batchnorm`` opens when the ranks share a machine, which is what the trainer uses.
"""

from __future__ import annotations

import os
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from zoo_core.engine.distributed import find_free_port
from zoo_core.engine.host_exchange import close_host_exchanges, host_exchange_for
from zoo_core.engine.sync_batchnorm import CpuSyncBatchNorm, convert_sync_batchnorm, has_batchnorm

pytestmark = pytest.mark.timeout(180)
GLOBAL_BATCH = 8


LAYOUTS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}
TRANSPORTS = ("gloo", "host")  # gloo first: once the host exchange is open, the group's layers use it


def make_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.BatchNorm2d(5), nn.ReLU(), nn.Conv2d(5, 4, 1), nn.BatchNorm2d(4),
                          nn.Conv2d(4, 3, 1), nn.BatchNorm2d(3, affine=False))
    with torch.no_grad():  # non-trivial affine parameters
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.5, 0.5)
    return model


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(GLOBAL_BATCH, 3, 6, 6, generator=generator) * 2 + 0.5
    weights = torch.randn(GLOBAL_BATCH, 3, 6, 6, generator=generator)
    return inputs, weights


def step(model: nn.Module, inputs: torch.Tensor, weights: torch.Tensor) -> dict:
    """Forward, a loss normalised by the GLOBAL batch (so rank losses sum to the global loss), backward."""
    inputs = inputs.clone().requires_grad_(True)
    outputs = model(inputs)
    loss = (outputs * weights).sum() / GLOBAL_BATCH
    loss.backward()
    return {
        "outputs": outputs.detach(),
        "input_grad": inputs.grad.detach(),
        "param_grads": {name: p.grad.detach().clone() for name, p in model.named_parameters()},
        "buffers": {name: b.detach().clone() for name, b in model.named_buffers()},
    }


def rank_main(rank: int, port: int, result_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for transport in TRANSPORTS:
            for layout in LAYOUTS:  # channels-last: how the families that declare it train on a CPU
                model = convert_sync_batchnorm(make_model(), torch.device("cpu"), host_exchange=transport == "host")
                assert (host_exchange_for(None) is not None) == (transport == "host")
                model = model.to(memory_format=LAYOUTS[layout])
                assert isinstance(model[1], CpuSyncBatchNorm)
                inputs, weights = make_data()
                local = slice(rank * 4, rank * 4 + 4)
                result = step(model, inputs[local].contiguous(memory_format=LAYOUTS[layout]), weights[local])
                for grad in result["param_grads"].values():  # what DDP's reduction does, as a sum
                    dist.all_reduce(grad)
                with open(os.path.join(result_dir, f"{transport}-{layout}-rank{rank}.pkl"), "wb") as stream:
                    pickle.dump(result, stream)
    finally:
        close_host_exchanges()
        dist.destroy_process_group()


def test_cpu_sync_batchnorm_equals_batchnorm_over_the_global_batch(tmp_path):
    reference = step(make_model(), *make_data())
    context = mp.start_processes(rank_main, args=(find_free_port(), str(tmp_path)), nprocs=2, join=False, start_method="spawn")
    try:
        while not context.join(timeout=120):
            pass
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    runs = [(rank, pickle.loads((tmp_path / f"{transport}-{layout}-rank{rank}.pkl").read_bytes()))
            for transport in TRANSPORTS for layout in LAYOUTS for rank in (0, 1)]
    for rank, result in runs:
        local = slice(rank * 4, rank * 4 + 4)
        torch.testing.assert_close(result["outputs"], reference["outputs"][local], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(result["input_grad"], reference["input_grad"][local], rtol=1e-5, atol=1e-6)
        for name, grad in reference["param_grads"].items():
            torch.testing.assert_close(result["param_grads"][name], grad, rtol=1e-4, atol=1e-5, msg=name)
        for name, buffer in reference["buffers"].items():
            torch.testing.assert_close(result["buffers"][name], buffer, rtol=1e-5, atol=1e-6, msg=name)


def test_without_a_process_group_it_is_plain_batchnorm_and_keeps_the_state_dict_keys():
    plain = make_model()
    converted = convert_sync_batchnorm(make_model(), torch.device("cpu"))
    assert has_batchnorm(plain) and isinstance(converted[4], CpuSyncBatchNorm)
    assert list(plain.state_dict()) == list(converted.state_dict())
    inputs, _ = make_data()
    torch.testing.assert_close(plain(inputs), converted(inputs))
    converted.eval()
    plain.eval()
    torch.testing.assert_close(plain(inputs), converted(inputs))


def test_cuda_devices_get_torchs_sync_batchnorm():
    converted = convert_sync_batchnorm(make_model(), torch.device("cuda", 0))
    assert isinstance(converted[1], nn.SyncBatchNorm)
