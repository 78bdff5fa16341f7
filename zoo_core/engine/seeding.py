"""Seeds (E10, docs/architecture.md): every rank draws its own augmentations, and every run repeats.

Each epoch re-derives the Python, NumPy and torch generators from ``(seed, rank, epoch)``, so
ranks differ from each other, identical runs repeat exactly, and a resumed run continues with
the streams an uninterrupted run would have used. DataLoader workers are seeded from the
loader's generator, itself seeded the same way.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["derive_seed", "seed_everything", "seed_worker", "loader_seed", "loader_generator", "class_head_seed"]


def derive_seed(seed: int, rank: int, epoch: int) -> int:
    """A 32-bit seed for ``(seed, rank, epoch)``; distinct tuples give unrelated streams."""
    sequence = np.random.SeedSequence([seed & 0xFFFFFFFF, rank, epoch])
    return int(sequence.generate_state(1)[0])


def seed_everything(seed: int, rank: int = 0, epoch: int = 0) -> int:
    """Seed Python, NumPy and torch for this rank and epoch; returns the derived seed."""
    derived = derive_seed(seed, rank, epoch)
    random.seed(derived)
    np.random.seed(derived)
    torch.manual_seed(derived)
    return derived


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: seed Python and NumPy from the worker's torch seed."""
    worker_seed = torch.initial_seed() % 2**32
    random.seed(worker_seed)
    np.random.seed(worker_seed)


def loader_seed(seed: int, rank: int, epoch: int) -> int:
    """The seed of a rank's DataLoader generator in ``epoch`` (distinct from the global streams)."""
    return derive_seed(seed, rank, epoch) ^ 0x5EED


def loader_generator(seed: int, rank: int, epoch: int) -> torch.Generator:
    """The generator a rank's DataLoader draws worker seeds from in ``epoch``."""
    generator = torch.Generator()
    generator.manual_seed(loader_seed(seed, rank, epoch))
    return generator


def class_head_seed(seed: int) -> int:
    """The seed of the class-dependent tensors a run draws afresh for its dataset's classes (the same on every rank)."""
    return derive_seed(seed, 0, 0) ^ 0x4EAD
