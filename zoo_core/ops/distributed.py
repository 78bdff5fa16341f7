"""Collective helpers that losses call inside a training step.

A loss normalised by a batch statistic (the number of positives, of ground-truth boxes, the sum
of their IoUs) differs between ranks under DDP: each rank sees its own shard. The published
detectors (mmdetection's ``reduce_mean``, DETR's ``num_boxes`` all-reduce) average that
statistic over the ranks first, so every rank divides by the same number and the averaged
gradient equals the gradient of the whole global batch. ``mean_over_ranks`` is that average.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["mean_over_ranks"]


def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """``value`` averaged over the ranks of the default process group, detached from the graph.

    Without a process group (or with a single rank) it is ``value.detach()``. Every rank must call
    it at the same point of its step (it is a collective: an all-reduce of ``value``'s size). The
    result carries no gradient either way: it is meant for loss normalisers, which published code
    treats as constants.
    """
    value = value.detach()
    if dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
        if world_size > 1:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value = value / world_size
    return value
