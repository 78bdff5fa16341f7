"""docs/multi-gpu.md: every code block on the page runs, in order, on two CPU ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT
from .support import run_concurrently, script_environment
from .markdown_blocks import code_blocks

pytestmark = pytest.mark.timeout(900)

DOC = REPO_ROOT / "docs" / "multi-gpu.md"


def environment() -> dict[str, str]:
    env = script_environment()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # zoo and torchrun
    return env


def test_every_code_block_is_titled_so_it_runs():
    for block in code_blocks(DOC):
        if block.language != "text":
            assert block.title, f"untitled {block.language} block would not be run:\n{block.code}"


def test_the_page_runs_top_to_bottom(tmp_path):
    blocks = [block for block in code_blocks(DOC) if block.title]
    for block in blocks:
        (tmp_path / block.title).write_text(block.code)
    env = environment()
    outputs: dict[str, str] = {}
    for block in blocks:
        if block.language == "python" and block.title == "train.py":
            continue  # launched by torchrun below
        if block.title == "multinode.sh":
            nodes = run_concurrently([["bash", "-c", line] for line in block.code.strip().splitlines()], tmp_path, env, 300)
            assert [code for code, _ in nodes] == [0, 0], "\n".join(output for _, output in nodes)
            continue
        command = [sys.executable, block.title] if block.language == "python" else ["bash", block.title]
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{block.title} failed:\n{result.stdout}\n{result.stderr}"
        outputs[block.title] = result.stdout
    assert "global batch 32, accumulate 1" in outputs["train_autobatch.py"]
    assert outputs["train_resume.py"].strip().endswith("2")
    assert "epoch 1: fitness" in outputs["train_callbacks.py"] and "epoch 1: lr " in outputs["train_callbacks.py"]
