"""``zoo benchmark``: one model in PyTorch and in each graph format, side by side (Ultralytics' ``yolo benchmark``).

For every format the model is written to a private temporary folder (removed afterwards), loaded back as a model
(``LibreYOLO("x.onnx")`` runs its graph), validated on ``data`` and timed: file size, the task's fitness metric
(mAP50-95 where the task has it, else its fitness metric: classification's top-1, ...) and milliseconds per image of the network alone (the median
of ``runs`` timed batches after ``warmup``, preprocessing and postprocessing excluded, as Ultralytics' inference
column). A format that fails says why in its row instead of stopping the table.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo_core.errors import ArgumentError, ZooError

__all__ = ["BenchmarkRow", "benchmark", "format_table", "BENCHMARK_FORMATS"]

#: The formats ``benchmark`` compares, in the table's order.
BENCHMARK_FORMATS = ("pytorch", "onnx", "torchscript")


@dataclass
class BenchmarkRow:
    """One format's figures (``error`` instead of them when it could not be written, loaded or run)."""

    format: str
    file_mb: float | None = None
    metric: str = ""
    score: float | None = None
    ms_per_image: float | None = None
    error: str = ""


def _network_time(libre: Any, device: str, image_size: Any, batch: int, warmup: int, runs: int) -> float:
    """Milliseconds per image of ``libre``'s inference model on random input of ``image_size`` (median of ``runs``)."""
    import torch

    from zoo_core.registry import image_size_hw
    from zoo_core.tasks.runner import resolve_device

    torch_device = resolve_device(device)
    model = libre.inference_model(torch_device)
    height, width = image_size_hw(image_size)
    images = torch.rand(batch, 3, height, width, generator=torch.Generator().manual_seed(0)).to(torch_device)
    timings = []
    with torch.no_grad():
        for step in range(warmup + runs):
            if torch_device.type == "cuda":
                torch.cuda.synchronize(torch_device)
            started = time.perf_counter()
            model(images)
            if torch_device.type == "cuda":
                torch.cuda.synchronize(torch_device)
            if step >= warmup:
                timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1000 / batch


def benchmark(model: str | Any, data: str, imgsz: Any = None, device: str = "cpu", formats: tuple[str, ...] = BENCHMARK_FORMATS,
              batch: int = 1, warmup: int = 2, runs: int = 10, workers: int = 0) -> list[BenchmarkRow]:
    """The figures of ``model`` (a name, a weights file or a ``LibreYOLO``) in each of ``formats`` on ``data``."""
    from zoo_core.facade import LibreYOLO
    from zoo_core.paths import BENCHMARK_PREFIX, owned_temp_dir
    from zoo_core.tasks import get_task

    unknown = [name for name in formats if name not in BENCHMARK_FORMATS]
    if unknown:
        raise ArgumentError(f"benchmark formats={unknown[0]!r}: the formats are {', '.join(BENCHMARK_FORMATS)}")
    source = model if isinstance(model, LibreYOLO) else LibreYOLO(model)
    image_size = imgsz if imgsz is not None else source.input_size
    metric = get_task(source.task).fitness_metric
    rows = []
    with owned_temp_dir(BENCHMARK_PREFIX) as folder:
        for name in formats:
            row = BenchmarkRow(name, metric=metric)
            try:
                if name == "pytorch":
                    written = source.save(Path(folder) / "model.safetensors")
                    candidate = source
                else:
                    written = source.export(format=name, path=Path(folder) / f"model.{name}", imgsz=image_size)
                    candidate = LibreYOLO(written)
                row.file_mb = written.stat().st_size / 1e6
                scores = candidate.val(data=data, imgsz=image_size, device=device, batch=max(batch, 1), workers=workers,
                                       plots=False, verbose=False)
                row.metric = "mAP50-95" if "mAP50-95" in scores else metric  # detection's headline, as Ultralytics'
                row.score = float(scores[row.metric])
                row.ms_per_image = _network_time(candidate, device, image_size, batch, warmup, runs)
            except (ZooError, ValueError, RuntimeError, ImportError) as error:
                row.error = f"{type(error).__name__}: {error}".splitlines()[0][:160]
            rows.append(row)
    return rows


def format_table(rows: list[BenchmarkRow]) -> str:
    """The rows as the table ``zoo benchmark`` prints."""
    metric = next((row.metric for row in rows if not row.error), rows[0].metric if rows else "score")
    lines = [f"{'format':<12} {'file MB':>8} {metric:>10} {'ms/image':>9}"]
    for row in rows:
        if row.error:
            lines.append(f"{row.format:<12} failed: {row.error}")
        else:
            lines.append(f"{row.format:<12} {row.file_mb:>8.1f} {row.score:>10.4f} {row.ms_per_image:>9.2f}")
    return "\n".join(lines)
