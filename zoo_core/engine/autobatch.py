"""Autobatch (``batch=-1``, E7): measure what fits on one device, scale by world size.

The probe runs once: in the parent before spawning, or on rank 0 under torchrun (which then
broadcasts one long tensor). On CUDA it fits a line to the memory of forward+backward passes
at a few batch sizes and solves for ``fraction`` of the device's memory; elsewhere (CPU, MPS)
memory is not the limit, and it returns ``CPU_DEFAULT_BATCH`` images per device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo_core.errors import BatchSizeError

if TYPE_CHECKING:
    import torch

    from zoo_core.engine.recipe import TrainingRecipe

__all__ = ["CPU_DEFAULT_BATCH", "probe_batch_size", "global_batch_from_probe", "accumulation_steps", "check_divisible"]

CPU_DEFAULT_BATCH = 16
_PROBE_SIZES = (1, 2, 4, 8, 16)


def probe_batch_size(model: "torch.nn.Module", recipe: "TrainingRecipe", image_size: int, device: "torch.device",
                     num_classes: int, fraction: float = 0.6) -> int:
    """Images per device that use about ``fraction`` of ``device``'s memory in a training step (the recipe's forward)."""
    if device.type != "cuda":
        return CPU_DEFAULT_BATCH
    import torch

    model = model.to(device).train()
    total = torch.cuda.get_device_properties(device).total_memory
    measured: list[tuple[int, int]] = []
    for size in _PROBE_SIZES:
        batch = recipe.task.preprocess(recipe.task.example_batch(size, image_size, num_classes), device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            loss, _ = recipe.forward_train(model, batch)
            loss.backward()
        except torch.OutOfMemoryError:
            break
        finally:
            model.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        measured.append((size, torch.cuda.max_memory_allocated(device)))
    torch.cuda.empty_cache()
    if len(measured) < 2:
        return max(measured[0][0] if measured else 1, 1)
    # Least-squares line memory = intercept + slope * batch over the measured points.
    count = len(measured)
    mean_b = sum(b for b, _ in measured) / count
    mean_m = sum(m for _, m in measured) / count
    slope = sum((b - mean_b) * (m - mean_m) for b, m in measured) / max(sum((b - mean_b) ** 2 for b, _ in measured), 1e-9)
    intercept = mean_m - slope * mean_b
    if slope <= 0:
        return _PROBE_SIZES[-1]
    return int(max(1, min(1024, (total * fraction - intercept) / slope)))


def global_batch_from_probe(per_device: int, world_size: int, nbs: int | None) -> int:
    """The global batch for ``per_device`` images on each of ``world_size`` ranks.

    With ``nbs`` the global batch is capped at ``nbs`` and rounded down to a multiple of the
    world size (never below one image per rank): more devices then mean fewer accumulation
    steps, not a smaller batch per device.
    """
    batch = per_device * world_size
    if nbs:
        batch = min(batch, nbs)
    return max(batch // world_size, 1) * world_size


def accumulation_steps(batch: int, nbs: int | None) -> int:
    """Micro-batches per optimizer step: ``max(round(nbs / batch), 1)`` (1 without ``nbs``)."""
    return max(round(nbs / batch), 1) if nbs else 1


def check_divisible(batch: int, world_size: int) -> None:
    """``BatchSizeError`` naming the two nearest valid batches if ``batch`` does not split evenly (E5)."""
    if batch % world_size == 0:
        return
    lower = (batch // world_size) * world_size
    upper = lower + world_size
    choices = f"batch={lower} or batch={upper}" if lower > 0 else f"batch={upper}"
    raise BatchSizeError(
        f"batch={batch} is the global batch and must be divisible by world_size={world_size}: each rank "
        f"trains at batch // world_size, so this value would silently train at a different global batch "
        f"than requested. Use {choices}."
    )
