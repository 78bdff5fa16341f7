"""Training goes on past an image that cannot be decoded: it is skipped, warned about and counted.

Indexing a dataset reads each image's header; a file whose header is fine but whose pixels are
damaged (a truncated or corrupted JPEG) only fails when it is loaded, possibly in the middle of a
long run on several devices. ``SkipDamagedImages`` wraps a training dataset: a sample whose image
does not decode is replaced by the next loadable one, with a ``DatasetWarning`` naming the file,
and the substitution is recorded in the sample. ``CountDamaged`` wraps the task's collate so the
trainer can count the skipped images per epoch (loader workers cannot share a counter).
"""

from __future__ import annotations

from typing import Any, Callable

from torch.utils.data import Dataset

from zoo_core.data.errors import DatasetError, DatasetWarning, ImageDecodeError
from zoo_core.errors import warn

__all__ = ["SkipDamagedImages", "CountDamaged", "DAMAGED_KEY"]

DAMAGED_KEY = "damaged"  # the batch key listing the files skipped while it was assembled
_ATTEMPTS = 10


class SkipDamagedImages(Dataset):
    """``dataset``, with samples whose image does not decode replaced by the next loadable one."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.warned: set[str] = set()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:  # the wrapped dataset's methods (close_mosaic...)
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, index: int) -> Any:
        damaged: list[str] = []
        for attempt in range(min(_ATTEMPTS, len(self.dataset))):
            try:
                sample = self.dataset[(index + attempt) % len(self.dataset)]
            except ImageDecodeError as error:
                damaged.append(str(error).split(": cannot decode", 1)[0])
                if damaged[-1] not in self.warned:
                    self.warned.add(damaged[-1])
                    warn(f"{error}; the image is skipped this epoch and another sample trains in its place", DatasetWarning)
                continue
            if damaged and isinstance(sample, dict):
                sample = {**sample, DAMAGED_KEY: damaged}
            return sample
        raise DatasetError(
            f"{len(damaged)} images in a row could not be decoded ({', '.join(damaged[:3])}...); the dataset looks "
            "damaged: check the files or re-create them"
        )


class CountDamaged:
    """A task's collate that also returns ``batch["damaged"]``: the files skipped for this batch.

    A class rather than a closure so loader workers started with the spawn method can pickle it.
    """

    def __init__(self, collate: Callable[[list[Any]], dict[str, Any]]) -> None:
        self.collate = collate

    def __call__(self, samples: list[Any]) -> dict[str, Any]:
        damaged = [path for sample in samples if isinstance(sample, dict) for path in sample.pop(DAMAGED_KEY, [])]
        batch = self.collate(samples)
        batch[DAMAGED_KEY] = damaged
        return batch
