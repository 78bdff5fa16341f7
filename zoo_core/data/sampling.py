"""Sharding a dataset for distributed inference (validation, prediction) without padding.

``torch.utils.data.DistributedSampler`` pads the last shard by repeating samples so every rank
gets the same count — right for training, wrong for metrics, which would count the repeated
samples twice. ``InferenceShardSampler`` gives rank ``r`` exactly ``range(r, n, world_size)``: every
sample once over all ranks, shards differing in length by at most one. Metrics that synchronise
across ranks (torchmetrics) then equal the single-process numbers.
"""

from __future__ import annotations

from typing import Iterator

from torch.utils.data import Sampler

__all__ = ["InferenceShardSampler"]


class InferenceShardSampler(Sampler[int]):
    """Indices ``rank, rank + world_size, ...`` below ``num_samples``, in order, each sample once overall."""

    def __init__(self, num_samples: int, rank: int = 0, world_size: int = 1) -> None:
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size - 1}] for world_size={world_size}, got {rank}")
        self.num_samples = num_samples
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.num_samples, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.num_samples, self.world_size))
