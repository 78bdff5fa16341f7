"""SyncBatchNorm for every backend: torch's on CUDA, the engine's own on CPU/gloo (E8, docs/architecture.md).

torch's ``nn.SyncBatchNorm`` refuses CPU tensors, so CPU ranks (gloo) would otherwise train
with per-rank statistics. ``CpuSyncBatchNorm`` computes batch statistics over the global batch
with two all-reduces per layer (one forward, one backward) and is numerically BatchNorm over
the concatenated batch: outputs, running statistics and gradients. Its passes over the
activations are ATen's own CPU kernels, and when every rank runs on this machine its all-reduces
go through ``host_exchange`` (direct loopback sockets, about 50x lower latency than gloo's) rather
than gloo (``benchmarks/sync_batchnorm_cost.py`` measures both against plain BatchNorm on two ranks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from zoo_core.engine.host_exchange import host_exchange_for, open_host_exchange

__all__ = ["CpuSyncBatchNorm", "convert_sync_batchnorm", "has_batchnorm"]


class _GlobalBatchNorm(torch.autograd.Function):
    """Batch normalisation whose statistics and input gradients span every rank of ``group``.

    One all-reduce per direction, and the heavy passes in ATen's own CPU kernels: the local
    statistics (``batch_norm_update_stats``), the normalisation (inference-mode ``batch_norm`` with
    the global statistics) and the two gradient sums (``native_batch_norm_backward``); only the
    input gradient's ``a·dy + b·x + c`` is composed here, in two fused multiply-adds. The
    per-channel arithmetic between them runs in NumPy float64: a layer has a few hundred channels,
    where each torch call's dispatch (microseconds) would cost more than the arithmetic.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                eps: float, momentum: float, group: Any) -> torch.Tensor:
        channels = x.shape[1]
        local_count = x.numel() // channels
        local_mean, local_var = torch.batch_norm_update_stats(x, None, None, 0.0)
        # The ranks' counts, sums and sums of squares in float64, rebuilt from each rank's (numerically
        # stable) mean and variance: the global variance then matches one process's BatchNorm to float32
        # precision, which a float32 sum of squares would not for channels whose mean dwarfs their spread.
        mean64 = local_mean.float().numpy().astype(np.float64)
        stats = np.empty(2 * channels + 1)
        np.multiply(mean64, local_count, out=stats[:channels])
        np.multiply(local_var.float().numpy() + mean64 * mean64, local_count, out=stats[channels:-1])
        stats[-1] = local_count
        _all_reduce_sum(torch.from_numpy(stats), group)
        total = float(stats[-1])
        global_mean = stats[:channels] / total
        global_var = np.maximum(stats[channels:-1] / total - global_mean * global_mean, 0.0)
        if running_mean is not None and running_var is not None:
            running_mean.lerp_(_as_tensor(global_mean, running_mean.dtype), momentum)
            running_var.lerp_(_as_tensor(global_var * (total / max(total - 1, 1)), running_var.dtype), momentum)
        output = torch.batch_norm(x, weight, bias, _as_tensor(global_mean, x.dtype), _as_tensor(global_var, x.dtype),
                                  False, 0.0, eps, False)
        ctx.save_for_backward(x, weight)
        ctx.mean, ctx.invstd = global_mean, 1.0 / np.sqrt(global_var + eps)
        ctx.total = total
        ctx.eps = eps
        ctx.group = group
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        mean, invstd = ctx.mean, ctx.invstd
        # the activations' own layout (channels-last for some families on a CPU): mixed layouts take ATen's slow paths
        grad_output = grad_output.contiguous(memory_format=_memory_format(x))
        channels = x.shape[1]
        shape = [1, channels] + [1] * (x.dim() - 2)
        # Σ dy·x̂ and Σ dy over this rank, with x̂ from the global statistics, in one ATen pass.
        _, local_sum_dy_xhat, local_sum_dy = torch.ops.aten.native_batch_norm_backward(
            grad_output, x, weight, None, None, _as_tensor(mean, x.dtype), _as_tensor(invstd, x.dtype),
            True, ctx.eps, [False, True, True])
        # The input gradient depends on the global statistics, so its two sums are global too;
        # weight and bias gradients stay local: DDP averages them like any parameter gradient.
        sums = np.concatenate((local_sum_dy.float().numpy(), local_sum_dy_xhat.float().numpy())).astype(np.float64)
        _all_reduce_sum(torch.from_numpy(sums), ctx.group)
        mean_dy, mean_dy_xhat = sums[:channels] / ctx.total, sums[channels:] / ctx.total
        # dx = w·invstd·(dy − mean(dy) − x̂·mean(dy·x̂)) = a·dy + b·x + c, per channel a, b, c.
        a = invstd if weight is None else weight.detach().float().numpy() * invstd
        b = -a * invstd * mean_dy_xhat
        c = -a * mean_dy - b * mean
        a_t, b_t, c_t = _as_tensor(np.stack((a, b, c)), x.dtype).view(3, *shape).unbind()
        grad_input = torch.addcmul(c_t, x, b_t).addcmul_(grad_output, a_t)
        grad_weight = local_sum_dy_xhat if weight is not None else None
        grad_bias = local_sum_dy if weight is not None else None
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


def _as_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``array`` as a CPU tensor of ``dtype``, converted by NumPy where it can (cheaper than a torch call)."""
    if dtype == torch.float32:
        return torch.from_numpy(array.astype(np.float32))
    return torch.from_numpy(array).to(dtype)


def _all_reduce_sum(tensor: torch.Tensor, group: Any) -> None:
    """Sum ``tensor`` over the ranks in place: through the host exchange where the group has one, else the backend."""
    exchange = host_exchange_for(group)
    if exchange is not None:
        exchange.all_reduce_sum_(tensor)
    else:
        dist.all_reduce(tensor, group=group)


def _memory_format(tensor: torch.Tensor) -> torch.memory_format:
    """channels-last where ``tensor`` is laid out that way (and is not also plainly contiguous), else contiguous."""
    if tensor.dim() == 4 and not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


class CpuSyncBatchNorm(_BatchNorm):
    """BatchNorm over the global batch of all ranks, for any backend (used on CPU/gloo).

    In eval mode, or when no process group is running, it is ordinary BatchNorm. Its state
    dict has BatchNorm's keys, so checkpoints load into the unconverted model.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        synchronise = self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size(self.process_group) > 1
        if not synchronise:
            return super().forward(input)
        momentum = self.momentum if self.momentum is not None else 0.1
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average, as BatchNorm does
                momentum = 1.0 / float(self.num_batches_tracked)
        running_mean = self.running_mean if self.track_running_stats else None
        running_var = self.running_var if self.track_running_stats else None
        return _GlobalBatchNorm.apply(input, self.weight, self.bias, running_mean, running_var,
                                      self.eps, momentum, self.process_group)


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` contains any BatchNorm layer."""
    return any(isinstance(module, _BatchNorm) for module in model.modules())


def _to_cpu_sync(module: nn.Module, process_group: Any) -> nn.Module:
    converted: nn.Module = module
    if isinstance(module, _BatchNorm) and not isinstance(module, CpuSyncBatchNorm):
        converted = CpuSyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                     module.track_running_stats, process_group)
        if module.affine:
            with torch.no_grad():
                converted.weight = module.weight
                converted.bias = module.bias
        if module.track_running_stats:
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
    for name, child in module.named_children():
        converted.add_module(name, _to_cpu_sync(child, process_group))
    return converted


def convert_sync_batchnorm(model: nn.Module, device: torch.device, process_group: Any = None, *,
                           host_exchange: bool = True, timeout_seconds: float = 1800.0) -> nn.Module:
    """Every BatchNorm of ``model`` synchronised over the ranks: torch's on CUDA, ours elsewhere.

    On a CPU inside a process group this is a collective (every rank calls it at the same point):
    it opens the host exchange when ``host_exchange`` is on and the ranks share this machine;
    ``timeout_seconds`` bounds each wait for a peer, as the process group's timeout bounds gloo's.
    """
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group)
    if host_exchange and dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1:
        open_host_exchange(process_group, timeout_seconds)
    return _to_cpu_sync(model, process_group)
