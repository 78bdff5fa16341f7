"""``cache=ram|disk``: a training set's images decoded once instead of every epoch (Ultralytics' ``cache``).

``ram`` keeps every decoded image (uint8 ``3×H×W``, at its original size, so a cached run sees exactly the
pixels an uncached one does) in the dataset; loader workers forked afterwards share those pages. ``disk``
writes each decoded image once as a ``.npy`` file under ``$ZOO_HOME/cache/images`` (keyed by the file's path,
size and modification time, so an edited image is decoded again) and reads that back, which skips the PNG or
JPEG decoder. Nothing is written beside the user's images: Ultralytics puts its ``.npy`` files there.

A dataset takes part through ``CachedImages``: it reads its images with ``self.read_image(path)`` and lists the
files to cache in ``cached_paths()``.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from zoo_core.data.images import read_image

if TYPE_CHECKING:
    import torch

__all__ = ["CacheMode", "CachedImages", "ImageCache", "image_cache_dir", "cache_mode"]

CacheMode = Literal["ram", "disk"]


def cache_mode(cache: Any) -> CacheMode | None:
    """``cache=`` as a mode: ``True`` and ``"ram"`` keep images in memory, ``"disk"`` as .npy files; False/None: off."""
    if cache is None or cache is False:
        return None
    if cache is True or cache == "ram":
        return "ram"
    if cache == "disk":
        return "disk"
    raise ValueError(f"cache={cache!r}: give 'ram' (or True), 'disk', or False")


def image_cache_dir() -> Path:
    """Where ``cache=disk`` keeps its decoded images: ``$ZOO_HOME/cache/images``."""
    from zoo_core.paths import zoo_home

    return zoo_home() / "cache" / "images"


class ImageCache:
    """Decoded images by path, in memory (``ram``) or as ``.npy`` files (``disk``)."""

    def __init__(self, mode: CacheMode) -> None:
        self.mode = mode
        self._images: dict[Path, "torch.Tensor"] = {}

    def _npy_path(self, path: Path) -> Path:
        stat = path.stat()
        key = hashlib.sha1(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
        return image_cache_dir() / key[:2] / f"{key}.npy"

    def _decoded_to_disk(self, path: Path) -> Path:
        import numpy as np

        target = self._npy_path(path)
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f"{target.stem}.{os.getpid()}.partial.npy")
            np.save(partial, read_image(path).numpy())
            os.replace(partial, target)  # another rank caching the same image at once writes the same bytes
        return target

    def fill(self, paths: list[Path], threads: int = 4) -> None:
        """Decode (and for ``disk`` write) every one of ``paths`` now, ``threads`` at a time."""
        work = self._decoded_to_disk if self.mode == "disk" else read_image
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            decoded = list(pool.map(work, paths))
        if self.mode == "ram":
            self._images.update(zip(paths, decoded))

    def read(self, path: Path) -> "torch.Tensor":
        """The image at ``path`` (uint8 ``3×H×W``), from the cache when it is there."""
        import numpy as np
        import torch

        if self.mode == "ram":
            cached = self._images.get(path)
            return cached if cached is not None else read_image(path)
        return torch.from_numpy(np.load(self._decoded_to_disk(path)))

    @property
    def bytes(self) -> int:
        """The memory the ``ram`` cache holds."""
        return sum(image.numel() * image.element_size() for image in self._images.values())


class CachedImages:
    """What a dataset needs for ``cache=``: ``read_image`` through the cache, and ``cache_images(mode)`` to fill it."""

    image_cache: ImageCache | None = None

    def cached_paths(self) -> list[Path]:
        """The image files the cache holds (every record's image)."""
        return [Path(record.image) for record in getattr(self, "records")]

    def read_image(self, path: str | Path) -> "torch.Tensor":
        """The image at ``path``, from the cache when one is filled."""
        return self.image_cache.read(Path(path)) if self.image_cache is not None else read_image(path)

    def cache_images(self, mode: CacheMode, threads: int = 4) -> ImageCache:
        """Decode every image once now, into memory (``ram``) or ``.npy`` files (``disk``)."""
        cache = ImageCache(mode)
        cache.fill(self.cached_paths(), threads)
        self.image_cache = cache
        return cache
