"""docs/weights.md: every titled block runs in order, on a LibreYOLO checkpoint made here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zoo_core.data.shapes import SHAPES_CLASSES

from .conftest import REPO_ROOT
from .markdown_blocks import code_blocks
from .oracle_cases import build_libreyolo
from .support import script_environment

pytest.importorskip("libreyolo", reason="LibreYOLO 1.6 is in the test extra: pip install -e '.[test]'")
pytestmark = pytest.mark.timeout(600)

DOC = REPO_ROOT / "docs" / "weights.md"


def test_every_python_and_bash_block_is_titled_so_it_runs():
    for block in code_blocks(DOC):
        if block.language in ("python", "bash"):
            assert block.title, f"untitled {block.language} block would not be run:\n{block.code}"


def test_the_page_runs_top_to_bottom(tmp_path, zoo_home):
    build_libreyolo("yolo9", "t").save(str(tmp_path / "LibreYOLO9t.pt"))
    env = script_environment({"ZOO_HOME": str(zoo_home)})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for block in (block for block in code_blocks(DOC) if block.title):
        (tmp_path / block.title).write_text(block.code)
        command = [sys.executable, block.title] if block.language == "python" else ["bash", block.title]
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{block.title} failed:\n{result.stdout}\n{result.stderr}"
    import libreyolo

    for written in (tmp_path / "yolo9t-mine.pt", tmp_path / "runs/detect/train/weights/best.libreyolo.pt"):
        checkpoint = torch.load(written, weights_only=True)
        assert (checkpoint["model_family"], checkpoint["nc"]) == ("yolo9", len(SHAPES_CLASSES)), written
        assert type(libreyolo.LibreYOLO(str(written), device="cpu")).__name__ == "LibreYOLO9"


def pipeline_rows() -> list[str]:
    """The rows of the page's input-pipeline table, from the registry: a family's pipeline, and what a size changes."""
    from zoo_core.registry import load_registry
    from zoo_core.tasks import task_of_family

    rows = []
    for name, declaration in load_registry().items():
        pipelines = {size: task_of_family(declaration, size).input_pipeline for size in declaration.sizes}
        first = next(iter(pipelines.values()))
        changes = [f"{size}: {', '.join(f'{key} {value}' for key, value in pipeline.model_dump().items() if value != getattr(first, key))}"
                   for size, pipeline in pipelines.items() if pipeline != first]
        note = f" ({'; '.join(changes)})" if changes else ""
        rows.append(f"| {declaration.display} (`{name}`) | {declaration.task} | {first.describe()}{note} |")
    return rows


def test_the_input_pipeline_table_is_the_registrys():
    text = DOC.read_text()
    missing = [row for row in pipeline_rows() if row not in text]
    assert not missing, "docs/weights.md's input-pipeline table differs from registry.yaml; its rows should be:\n" + "\n".join(missing)
