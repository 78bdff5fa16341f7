"""Helpers shared by the tests: small on-disk datasets, subprocess scripts and process inspection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from .conftest import REPO_ROOT
from .doubles import use_test_families

__all__ = [
    "use_test_families", "write_class_folders", "script_environment", "run_script", "run_concurrently",
    "torchrun_command", "children_of", "alive", "varied_class_scores",
]


def write_class_folders(root: Path, *, per_class: int = 12, val_per_class: int = 4, size: int = 32,
                        identical: bool = False, seed: int = 0) -> Path:
    """A two-class folder dataset: red or green squares on noise (``identical``: every image the same)."""
    rng = np.random.default_rng(seed)
    base = (rng.random((size, size, 3)) * 60).astype(np.uint8)
    for split, count in (("train", per_class), ("val", val_per_class)):
        for index, colour in enumerate([(230, 30, 30), (30, 230, 30)]):
            folder = root / split / f"c{index}"
            folder.mkdir(parents=True, exist_ok=True)
            for item in range(count):
                pixels = base.copy() if identical else (rng.random((size, size, 3)) * 60).astype(np.uint8)
                if not identical:
                    pixels[size // 4: 3 * size // 4, size // 4: 3 * size // 4] = colour
                Image.fromarray(pixels).save(folder / f"{item}.png")
    return root


def script_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for subprocess scripts: the repository importable, autoload off."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "plugins"), env.get("PYTHONPATH", "")])
    env["ZOO_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.update(extra or {})
    return env


def run_script(path: Path, *args: str, timeout: float = 240, env: dict[str, str] | None = None,
               launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run a Python script (optionally under a launcher such as torchrun) and capture its output."""
    command = [*(launcher or [sys.executable]), str(path), *args]
    return subprocess.run(command, cwd=path.parent, env=env or script_environment(), capture_output=True, text=True, timeout=timeout)


def run_concurrently(commands: list[list[str]], cwd: Path, env: dict[str, str], timeout: float = 240) -> list[tuple[int, str]]:
    """Start every command at once, wait for all; ``(return code, output)`` each. None outlives the call."""
    processes = [subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for command in commands]
    try:
        outputs = [process.communicate(timeout=timeout)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [(process.returncode, output) for process, output in zip(processes, outputs)]


def torchrun_command(*options: str) -> list[str]:
    """``python -m torch.distributed.run`` with ``options`` (the torchrun console script, portably)."""
    return [sys.executable, "-m", "torch.distributed.run", *options]


def children_of(pid: int) -> list[int]:
    """Direct child process ids of ``pid`` (Linux /proc)."""
    children: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    if not task_dir.exists():
        return children
    for task in task_dir.iterdir():
        with_children = task / "children"
        if with_children.exists():
            children.extend(int(child) for child in with_children.read_text().split())
    return children


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def varied_class_scores(model) -> None:
    """Random weights in a YOLO head's last class convolutions (``head.class_branches.*.2``), prior -1.

    They start at zero weights and a low prior, so a fresh model scores every box the same (0.003): nothing
    passes a tracker's thresholds and every NMS order is a tie. With these, a fresh or barely trained
    detector gives varied scores above 0.25, which is what the tests that compare two runs of it need.
    """
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.startswith("head.class_branches.") and ".2." in name:
                parameter.normal_(0.0, 0.3) if name.endswith("weight") else parameter.fill_(-1.0)
