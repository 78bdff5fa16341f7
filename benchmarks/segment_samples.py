"""Milliseconds per training sample of the segment task's dataset against the detect task's, on one thread.

Eight 640×480 noise images, each with 20 round objects (24-point polygons); the datasets at 640 px with
the default augmentation (mosaic, affine, flip, HSV). Both read the same records (the detection dataset
ignores the shapes), so the difference is what the masks cost: rasterising them, moving them through
the mosaic and warp, re-deriving the boxes.

    python benchmarks/segment_samples.py [--imgsz 640] [--objects 20] [--samples 16]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from zoo_core.data.instances import InstanceRecord, InstanceShape
from zoo_core.tasks.base import AugmentSettings
from zoo_core.tasks.detect import DetectionDataset
from zoo_core.tasks.segment import InstanceSegmentationDataset


def round_objects(folder: Path, images: int, objects: int) -> list[InstanceRecord]:
    """``images`` 640×480 noise images with ``objects`` random discs each, as instance records."""
    rng = np.random.default_rng(0)
    height, width = 480, 640
    records = []
    for index in range(images):
        path = folder / f"{index}.jpg"
        Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8)).save(path)
        shapes, labels = [], []
        for number in range(objects):
            centre_x, centre_y, radius = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.03, 0.1)
            angles = np.linspace(0, 2 * np.pi, 24, endpoint=False)
            polygon = np.stack([centre_x + radius * np.cos(angles), centre_y + radius * np.sin(angles) * width / height], 1)
            polygon = polygon.clip(0, 1).astype(np.float32)
            shapes.append(InstanceShape(polygons=(polygon,)))
            labels.append([number % 3, *polygon.min(0), *polygon.max(0)])
        records.append(InstanceRecord(image=path, height=height, width=width, labels=np.array(labels, np.float32), shapes=shapes,
                                      crowd=np.zeros(objects, bool)))
    return records


def milliseconds_per_sample(dataset: torch.utils.data.Dataset, samples: int) -> float:
    """The mean time of ``dataset[i]`` over ``samples`` draws, after one warm-up draw."""
    random.seed(0)
    torch.manual_seed(0)
    dataset[0]
    started = time.perf_counter()
    for index in range(samples):
        dataset[index % len(dataset)]
    return (time.perf_counter() - started) / samples * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--objects", type=int, default=20)
    parser.add_argument("--samples", type=int, default=16)
    options = parser.parse_args()
    torch.set_num_threads(1)
    names = {0: "a", 1: "b", 2: "c"}
    with tempfile.TemporaryDirectory() as folder:
        records = round_objects(Path(folder), 8, options.objects)
        costs: dict[tuple[str, str], float] = {}
        for dataset_class in (DetectionDataset, InstanceSegmentationDataset):
            for augment in (AugmentSettings(), None):
                dataset = dataset_class(records, names, options.imgsz, augment)
                split = "train" if augment else "val"
                costs[dataset_class.__name__, split] = cost = milliseconds_per_sample(dataset, options.samples)
                print(f"{dataset_class.__name__:28s} {split:5s} {cost:7.1f} ms a sample")
        for split in ("train", "val"):
            ratio = costs["InstanceSegmentationDataset", split] / costs["DetectionDataset", split]
            print(f"segment / detect, {split}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
