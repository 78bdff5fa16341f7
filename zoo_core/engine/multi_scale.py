"""Multi-scale training: every batch at an input size drawn at random, as YOLO and the DETR line train.

A recipe says which sizes a run draws from (``TrainingRecipe.multi_scale_sizes``); the two
published rules live here so that families share them:

- ``ranged_sizes``: every multiple of the stride between two fractions of the training size
  (Ultralytics' ``multi_scale``: 0.5× to 1.5×);
- ``sizes_around``: the DETR line's rule (RT-DETR's collate, D-FINE's ``generate_scales``):
  multiples of 32 from 0.75× to 1.25× of the base size, with the base size itself repeated so
  that it is drawn more often (``base_size_repeat``).

The trainer draws one size per batch on each rank (Python's ``random``, seeded per rank and
epoch, E10) and the task resizes the preprocessed batch (``Task.resize_batch``). Ranks may train
one step at different sizes: DDP synchronises gradients, not shapes.
"""

from __future__ import annotations

import math

from zoo_core.registry import ImageSize, image_size_hw

__all__ = ["ranged_sizes", "sizes_around", "scaled_size"]


def ranged_sizes(image_size: int, multiple: int, low: float = 0.5, high: float = 1.5) -> tuple[int, ...]:
    """Every multiple of ``multiple`` from ``low × image_size`` to ``high × image_size`` (at least one multiple)."""
    first = max(multiple, math.ceil(image_size * low / multiple) * multiple)
    last = max(first, math.floor(image_size * high / multiple) * multiple)
    return tuple(range(first, last + 1, multiple))


def sizes_around(base_size: int, base_repeat: int, step: int = 32) -> tuple[int, ...]:
    """The DETR line's sizes: ``step`` multiples from 0.75× to 1.25× of ``base_size``, ``base_size`` itself
    ``base_repeat`` times among them (D-FINE's ``base_size_repeat``; RT-DETR's list at 640 is this with 3)."""
    if base_repeat < 1:
        raise ValueError(f"base_repeat must be at least 1, got {base_repeat}")
    smallest = max(step, int(base_size * 0.75 / step) * step)
    largest = max(step, int(base_size * 1.25 / step) * step)
    below = [size for size in range(smallest, base_size, step)]
    above = [size for size in range(largest, base_size, -step)]
    return tuple(below + [base_size] * base_repeat + above[::-1])


def scaled_size(image_size: ImageSize, side: int, multiple: int) -> tuple[int, int]:
    """``image_size`` (height, width) scaled so that its longer side is ``side``, each side a multiple of ``multiple``."""
    height, width = image_size_hw(image_size)
    factor = side / max(height, width)
    return tuple(max(multiple, round(length * factor / multiple) * multiple) for length in (height, width))  # type: ignore[return-value]

