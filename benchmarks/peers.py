"""zoo against its peers on the same model, data and machine: training throughput, start-up, memory, predict latency.

YOLOv9-t is trained side by side by zoo, Ultralytics and LibreYOLO 1.6.0 on one YOLO-format
dataset (by default the built-in ``shapes`` scenes, written once as a dataset YAML), at the same
image size, batch, epochs, mosaic augmentation and thread count, on the CPU, without
validation. Each run is a fresh process of the peer's own interpreter; runs are interleaved
(zoo, Ultralytics, LibreYOLO, zoo, ...) for ``--rounds`` rounds so load drift hits all alike.
Printed: medians per implementation and their ratios to zoo.

- images/s over whole epochs: training images seen / time from the first epoch's start to the
  last epoch's end;
- steady-state images/s: the same over the epochs after the first;
- seconds to the first step: from the process start (before the framework is imported) to the
  end of the first training batch (LibreYOLO reports no per-batch event: not measured there);
- peak RSS of the process;
- predict latency: one image at a time at 640 px after two warm-up images, median over the images.

The peers run from their own virtual environments, which this project does not install::

    python3.11 -m venv /tmp/ultralytics-venv && /tmp/ultralytics-venv/bin/pip install ultralytics
    python3.11 -m venv /tmp/libreyolo-venv && /tmp/libreyolo-venv/bin/pip install libreyolo==1.6.0

    python benchmarks/peers.py --ultralytics-python /tmp/ultralytics-venv/bin/python \\
        --libreyolo-python /tmp/libreyolo-venv/bin/python            # 3 rounds, 5 epochs, 320 px, batch 8

A peer whose interpreter is not given, or cannot import its package, is skipped with a line saying so.
``--ranks 2`` trains zoo on ``device="cpu,cpu"`` (one launch, the engine's spawn) and LibreYOLO
under ``torchrun --nproc_per_node=2`` (gloo), with ``--threads`` split between the ranks and the
same global batch; both without SyncBatchNorm, which torch's own cannot run on a CPU
(benchmarks/sync_batchnorm_cost.py measures zoo's). Ultralytics trains on several ranks only on
CUDA devices, so it is skipped there with a line saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROCESS_START = time.time()
HERE = Path(__file__).resolve()
MODELS = {"zoo": "yolo9-t", "ultralytics": "yolov9t.yaml", "libreyolo": "t"}
MEASURES = ("images_per_s", "steady_images_per_s", "first_step_s", "peak_rss_mib", "predict_ms")


# ---------------------------------------------------------------------------------------------- workers
def epoch_figures(start: float, epoch_ends: list[float], images: int) -> dict[str, float | None]:
    """Images/s over all epochs and over the epochs after the first, from the first epoch's start and each epoch's end."""
    if not epoch_ends:
        return {"images_per_s": None, "steady_images_per_s": None}
    whole = images * len(epoch_ends) / (epoch_ends[-1] - start)
    steady = images * (len(epoch_ends) - 1) / (epoch_ends[-1] - epoch_ends[0]) if len(epoch_ends) > 1 else None
    return {"images_per_s": whole, "steady_images_per_s": steady}


def peak_rss_mib() -> float:
    """The largest resident set of this process so far."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ZooClock:
    """A zoo callback (the events of ``zoo_core.engine.callbacks.Callback``, duck-typed: the peers' interpreters
    import this file without zoo) that writes rank 0's training start, first optimizer step and epoch ends to ``path``.

    At module level and file-backed, so it also works in the ranks of ``device="cpu,cpu"``, where
    callbacks travel to the workers by pickling.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.times: dict[str, Any] = {"start": None, "first_step": None, "epoch_ends": []}

    def _record(self) -> None:
        if os.environ.get("RANK", "0") == "0":
            self.times["peak_rss_mib"] = peak_rss_mib()  # the rank's own: forkserver workers are not our children
            self.path.write_text(json.dumps(self.times))

    def on_train_start(self, run_dir: Path, config: dict[str, Any]) -> None:
        self.times["start"] = time.time()
        self._record()

    def on_optimizer_step(self, step: int) -> None:
        if self.times["first_step"] is None:
            self.times["first_step"] = time.time()
            self._record()

    def on_epoch_end(self, report: Any) -> None:
        self.times["epoch_ends"].append(time.time())
        self._record()


def train_zoo(arguments: argparse.Namespace, train_images: int) -> dict[str, Any]:
    from zoo_core import LibreYOLO

    device = "cpu,cpu" if arguments.ranks == 2 else "cpu"
    with tempfile.TemporaryDirectory() as project:
        clock = ZooClock(Path(project) / "clock.json")
        LibreYOLO(MODELS["zoo"]).train(data=arguments.data, epochs=arguments.epochs, imgsz=arguments.imgsz, batch=arguments.batch,
                                      nbs=arguments.batch, workers=arguments.workers, device=device, val=False, plots=False,
                                      verbose=False, mosaic=1.0, close_mosaic=0, project=project, callbacks=[clock],
                                      **({"sync_bn": False} if arguments.ranks == 2 else {}))
        times = json.loads(clock.path.read_text())
    return {**epoch_figures(times["start"], times["epoch_ends"], train_images),
            "first_step_s": (times["first_step"] or time.time()) - PROCESS_START, "rank_peak_rss_mib": times["peak_rss_mib"]}


def train_ultralytics(arguments: argparse.Namespace, train_images: int) -> dict[str, Any]:
    from ultralytics import YOLO

    times: dict[str, Any] = {"start": None, "first_batch": None, "epoch_ends": []}
    model = YOLO(MODELS["ultralytics"])
    model.add_callback("on_train_epoch_start", lambda trainer: times.__setitem__("start", times["start"] or time.time()))
    model.add_callback("on_train_batch_end", lambda trainer: times.__setitem__("first_batch", times["first_batch"] or time.time()))
    model.add_callback("on_train_epoch_end", lambda trainer: times["epoch_ends"].append(time.time()))
    with tempfile.TemporaryDirectory() as project:
        model.train(data=arguments.data, epochs=arguments.epochs, imgsz=arguments.imgsz, batch=arguments.batch,
                    nbs=arguments.batch, workers=arguments.workers, device="cpu", val=False, plots=False, amp=False,
                    mosaic=1.0, close_mosaic=0, project=project, verbose=False, warmup_epochs=0)
    return {**epoch_figures(times["start"], times["epoch_ends"], train_images),
            "first_step_s": (times["first_batch"] or time.time()) - PROCESS_START}


def train_libreyolo(arguments: argparse.Namespace, train_images: int) -> dict[str, Any]:
    import libreyolo

    class Clock:
        def __init__(self) -> None:
            self.start = 0.0
            self.epoch_ends: list[float] = []

        def on_train_start(self, event: Any) -> None:
            self.start = time.time()

        def on_train_epoch_end(self, event: Any) -> None:
            self.epoch_ends.append(time.time())

    clock = Clock()
    model = libreyolo.LibreYOLO9(None, size=MODELS["libreyolo"], nb_classes=arguments.num_classes, device="cpu")
    with tempfile.TemporaryDirectory() as project:
        model.train(data=arguments.data, epochs=arguments.epochs, imgsz=arguments.imgsz, batch=arguments.batch,
                    workers=arguments.workers, device="cpu", project=project, callbacks=[clock], mosaic=1.0,
                    close_mosaic=0, val=False, **({"sync_bn": False} if arguments.ranks == 2 else {}))
    return {**epoch_figures(clock.start, clock.epoch_ends, train_images), "first_step_s": None}


def predict_latency(implementation: str, images: list[str], num_classes: int) -> float:
    """Median milliseconds per image at 640 px, one image at a time, after two warm-up images."""
    if implementation == "zoo":
        from zoo_core import LibreYOLO

        model = LibreYOLO(MODELS["zoo"], num_classes=num_classes)
        run = lambda path: model.predict(path, imgsz=640)  # noqa: E731
    elif implementation == "ultralytics":
        from ultralytics import YOLO

        model = YOLO(MODELS["ultralytics"])
        run = lambda path: model.predict(path, imgsz=640, device="cpu", verbose=False)  # noqa: E731
    else:
        import libreyolo

        model = libreyolo.LibreYOLO9(None, size=MODELS["libreyolo"], nb_classes=num_classes, device="cpu")
        model.model.eval()  # a fresh LibreYOLO model is built in training mode
        run = lambda path: model(path, imgsz=640)  # noqa: E731
    for path in images[:2]:
        run(path)
    samples = []
    for path in images:
        started = time.perf_counter()
        run(path)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def worker(arguments: argparse.Namespace) -> None:
    """One measurement in this process; prints one JSON line."""
    import torch

    torch.set_num_threads(max(1, arguments.threads // (arguments.ranks if arguments.worker != "zoo" else 1)))
    layout = json.loads(Path(arguments.layout).read_text())
    if arguments.job == "train":
        trainer = {"zoo": train_zoo, "ultralytics": train_ultralytics, "libreyolo": train_libreyolo}[arguments.worker]
        row = trainer(arguments, layout["train_images"])
    else:
        row = {"predict_ms": predict_latency(arguments.worker, layout["val_paths"], arguments.num_classes)}
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for the run
        peak = max(peak_rss_mib(), row.pop("rank_peak_rss_mib", 0.0))
        print("PEERS-RESULT " + json.dumps({**row, "peak_rss_mib": peak}), flush=True)


# ---------------------------------------------------------------------------------------------- the parent
def write_dataset(folder: Path, images: int, side: int) -> tuple[Path, dict[str, Any]]:
    """The built-in shapes scenes as a YOLO dataset YAML (train and val), and what the workers need to know of it."""
    import yaml

    from zoo_core.data.shapes import SHAPES_CLASSES, materialize_shapes, shapes

    root = materialize_shapes(shapes(num_train=images, num_val=max(4, images // 4), image_size=side, seed=0))
    path = folder / "peers-data.yaml"
    path.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "names": list(SHAPES_CLASSES)}))
    val_paths = sorted(str(image) for image in (root / "images/val").iterdir())
    return path, {"train_images": images, "val_paths": val_paths, "num_classes": len(SHAPES_CLASSES)}


def available(implementation: str, python: str | None, ranks: int) -> str | None:
    """The interpreter that runs ``implementation``, or None after saying why it is skipped."""
    if implementation == "zoo":
        return sys.executable
    package = {"ultralytics": "ultralytics", "libreyolo": "libreyolo"}[implementation]
    if implementation == "ultralytics" and ranks == 2:
        print("skipping ultralytics: it trains on several ranks only on CUDA devices")
        return None
    if not python:
        print(f"skipping {implementation}: give --{implementation}-python (a venv with `pip install {package}`)")
        return None
    probe = subprocess.run([python, "-c", f"import {package}"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"skipping {implementation}: {python} cannot import {package} ({probe.stderr.strip().splitlines()[-1:]})")
        return None
    return python


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_worker(python: str, implementation: str, job: str, arguments: argparse.Namespace, layout: Path) -> dict[str, Any] | None:
    launcher = [python]
    if implementation == "libreyolo" and job == "train" and arguments.ranks == 2:
        launcher = [python, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                    f"--master_port={free_port()}"]
    command = [*launcher, str(HERE), "--worker", implementation, "--job", job, "--layout", str(layout), "--data", str(arguments.data)]
    for name in ("epochs", "imgsz", "batch", "threads", "workers", "ranks", "num_classes"):
        command += [f"--{name.replace('_', '-')}", str(getattr(arguments, name))]
    environment = {**os.environ, "OMP_NUM_THREADS": str(arguments.threads), "PYTHONPATH": str(HERE.parent.parent)}
    completed = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=arguments.timeout)
    for line in completed.stdout.splitlines():
        if line.startswith("PEERS-RESULT "):
            return json.loads(line[len("PEERS-RESULT "):])
    print(f"{implementation} {job} failed (exit {completed.returncode}): {completed.stderr.strip()[-600:]}")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ultralytics-python", help="interpreter of a venv with ultralytics")
    parser.add_argument("--libreyolo-python", help="interpreter of a venv with libreyolo==1.6.0")
    parser.add_argument("--data", help="a YOLO dataset YAML (default: the built-in shapes scenes)")
    parser.add_argument("--images", type=int, default=32, help="training images of the built-in scenes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="data loader workers (0: in the training process)")
    parser.add_argument("--ranks", type=int, choices=(1, 2), default=1)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds one run may take")
    parser.add_argument("--no-predict", action="store_true", help="skip the predict latency")
    # internal: one measurement in a worker process
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--layout", help=argparse.SUPPRESS)
    parser.add_argument("--num-classes", type=int, default=3, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments)
        return

    pythons = {name: available(name, getattr(arguments, f"{name}_python", None), arguments.ranks) for name in MODELS}
    pythons = {name: python for name, python in pythons.items() if python}
    with tempfile.TemporaryDirectory() as folder:
        if arguments.data is None:
            data, layout = write_dataset(Path(folder), arguments.images, arguments.imgsz)
            arguments.data = str(data)
        else:
            layout = {"train_images": arguments.images, "val_paths": [], "num_classes": arguments.num_classes}
        arguments.num_classes = layout["num_classes"]
        layout_path = Path(folder) / "layout.json"
        layout_path.write_text(json.dumps(layout))
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in pythons}
        for round_index in range(arguments.rounds):
            for name, python in pythons.items():
                row = run_worker(python, name, "train", arguments, layout_path) or {}
                if not arguments.no_predict and layout["val_paths"]:
                    predicted = run_worker(python, name, "predict", arguments, layout_path) or {}
                    row["predict_ms"] = predicted.get("predict_ms")
                rows[name].append(row)
                print(f"round {round_index + 1}/{arguments.rounds} {name}: "
                      + ", ".join(f"{key} {value:.2f}" for key, value in row.items() if isinstance(value, float)), flush=True)
    report(rows, arguments)


def report(rows: dict[str, list[dict[str, Any]]], arguments: argparse.Namespace) -> None:
    """Medians per implementation and their ratio to zoo's."""
    medians = {name: {measure: _median([row.get(measure) for row in samples]) for measure in MEASURES} for name, samples in rows.items()}
    print(f"\nYOLOv9-t, {arguments.imgsz} px, batch {arguments.batch}, {arguments.epochs} epochs, {arguments.threads} threads, "
          f"{arguments.ranks} rank(s), medians of {arguments.rounds} rounds; (ratio to zoo)")
    print(f"{'':<12}" + "".join(f"{measure:>24}" for measure in MEASURES))
    for name, values in medians.items():
        cells = []
        for measure in MEASURES:
            value, ours = values[measure], medians.get("zoo", {}).get(measure)
            ratio = f" ({value / ours:.2f}x)" if value is not None and ours and name != "zoo" else ""
            cells.append(f"{'-' if value is None else f'{value:.2f}'}{ratio}")
        print(f"{name:<12}" + "".join(f"{cell:>24}" for cell in cells))


def _median(values: list[Any]) -> float | None:
    present = [value for value in values if isinstance(value, (int, float))]
    return statistics.median(present) if present else None


if __name__ == "__main__":
    main()
