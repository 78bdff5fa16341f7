"""ByteTrack and BoT-SORT on generated ``shapes`` videos: HOTA, MOTA, IDF1 and frames per second.

Two sources of boxes, each over the three scenarios (crossing, occlusion, shaking) and several seeds:

- ground truth: each frame's true boxes at score 0.9, so only the association is measured; fps is the
  tracker's own (``update`` per frame);
- a detector: ``--weights best.pt`` of a model trained on ``shapes`` (or, without it, a yolo9-t this script
  trains for ``--epochs`` on ``shapes`` at the video size first); ``model.track`` end to end, so fps includes
  the network on this machine's CPU.

    python benchmarks/tracking.py                          # ground truth only, seeds 0-4
    python benchmarks/tracking.py --detector --epochs 30   # also train a yolo9-t and track with it
    python benchmarks/tracking.py --detector --weights runs/detect/train/weights/best.pt

The metrics are zoo's HOTA/CLEAR/Identity (``zoo_core/tracking/metrics.py``, checked against trackeval 1.3.0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zoo_core.data.shapes_video import SCENARIOS, shapes_video  # noqa: E402
from zoo_core.tracking.config import BUILTIN_TRACKERS, tracker_config  # noqa: E402
from zoo_core.tracking.metrics import tracking_metrics  # noqa: E402
from zoo_core.tracking.trackers import build_tracker  # noqa: E402

METRICS = ("HOTA", "MOTA", "IDF1")


def on_ground_truth(video, tracker_name: str) -> tuple[dict[str, float], float]:
    """The metrics of ``tracker_name`` fed ``video``'s true boxes, and its frames per second."""
    tracker = build_tracker(tracker_config(tracker_name))
    ids, boxes = [], []
    started = time.perf_counter()
    for frame, frame_boxes, classes in zip(video.frames, video.boxes, video.classes):
        found = tracker.update(frame_boxes, np.full(len(frame_boxes), 0.9), classes, frame)
        ids.append(found.ids)
        boxes.append(found.boxes)
    elapsed = time.perf_counter() - started
    return tracking_metrics(video.ids, video.boxes, ids, boxes), len(video) / elapsed


def on_detector(model, video, tracker_name: str) -> tuple[dict[str, float], float]:
    """The metrics of ``model.track`` on ``video``'s frames with ``tracker_name``, and its frames per second."""
    frames = list(video.frames)
    started = time.perf_counter()
    results = model.track(frames, tracker=tracker_name, imgsz=video.frames.shape[1], device="cpu", verbose=False)
    elapsed = time.perf_counter() - started
    ids = [result.boxes.id.numpy() for result in results]
    boxes = [result.boxes.xyxy.numpy().astype(np.float64) for result in results]
    return tracking_metrics(video.ids, video.boxes, ids, boxes), len(video) / elapsed


def trained_detector(size: int, epochs: int, project: Path):
    """A yolo9-t trained on ``shapes`` scenes of ``size`` px for ``epochs`` (CPU)."""
    from zoo_core import LibreYOLO

    model = LibreYOLO("yolo9-t")
    # nbs=16: an optimizer step per batch (the default nominal batch of 64 would take four per epoch here).
    model.train(data=f"shapes:train=256,val=32,size={size}", epochs=epochs, imgsz=size, batch=16, nbs=16, warmup_epochs=1,
                device="cpu", workers=0, project=str(project), name="detector", plots=False)
    return model


def print_table(title: str, rows: dict[tuple[str, str], list[tuple[dict[str, float], float]]]) -> None:
    print(f"\n{title}: mean over seeds (min in brackets)")
    print(f"{'scenario':<10} {'tracker':<10} " + " ".join(f"{name:>14}" for name in METRICS) + f" {'fps':>10}")
    for (scenario, tracker), runs in rows.items():
        cells = []
        for name in METRICS:
            values = [metrics[name] for metrics, _ in runs]
            cells.append(f"{statistics.mean(values):.3f} ({min(values):.3f})")
        fps = statistics.median(rate for _, rate in runs)
        print(f"{scenario:<10} {tracker:<10} " + " ".join(f"{cell:>14}" for cell in cells) + f" {fps:>10.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--detector", action="store_true", help="also track with a detector's boxes")
    parser.add_argument("--weights", help="the detector's weights (default: train a yolo9-t on shapes here)")
    parser.add_argument("--epochs", type=int, default=30, help="epochs of the yolo9-t trained without --weights")
    arguments = parser.parse_args()

    videos = {(scenario, seed): shapes_video(scenario, frames=arguments.frames, size=arguments.size, seed=seed)
              for scenario in SCENARIOS for seed in arguments.seeds}
    rows: dict[tuple[str, str], list] = {}
    for (scenario, _seed), video in videos.items():
        for tracker in BUILTIN_TRACKERS:
            rows.setdefault((scenario, tracker), []).append(on_ground_truth(video, tracker))
    print_table(f"ground-truth boxes, {arguments.frames} frames of {arguments.size} px", rows)

    if arguments.detector:
        from zoo_core import LibreYOLO

        with tempfile.TemporaryDirectory(prefix="zoo-tracking-bench-") as project:
            if arguments.weights:
                model = LibreYOLO(arguments.weights)
                source = arguments.weights
            else:
                model = trained_detector(arguments.size, arguments.epochs, Path(project))
                source = f"yolo9-t trained {arguments.epochs} epochs on shapes at {arguments.size} px"
            rows = {}
            for (scenario, _seed), video in videos.items():
                for tracker in BUILTIN_TRACKERS:
                    rows.setdefault((scenario, tracker), []).append(on_detector(model, video, tracker))
        print_table(f"detector boxes ({source}), model.track end to end on CPU", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
