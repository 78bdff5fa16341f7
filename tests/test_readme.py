"""README.md: every titled block runs as written, in order, in a fresh folder (and the shipped sample image is zoo's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from zoo_core.data.shapes import render_scene
from zoo_core.paths import SAMPLE_SEED, sample_image

from .conftest import REPO_ROOT
from .markdown_blocks import code_blocks
from .support import script_environment

pytestmark = pytest.mark.timeout(900)

README = REPO_ROOT / "README.md"


def test_the_quickstart_runs_as_written(tmp_path, zoo_home):
    env = script_environment({"ZOO_HOME": str(zoo_home)})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    outputs = {}
    for block in (block for block in code_blocks(README) if block.title):
        # Each block in a fresh folder of its own, as a reader who copies just that one runs it: a block
        # that named a run folder only an earlier block creates (runs/detect/train2) would fail here.
        folder = tmp_path / block.title.replace(".", "_")
        folder.mkdir()
        (folder / block.title).write_text(block.code)
        command = [sys.executable, block.title] if block.language == "python" else ["bash", "-e", block.title]
        result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{block.title} failed:\n{result.stdout}\n{result.stderr}"
        outputs[block.title] = result.stdout
    assert (tmp_path / "quickstart_py/runs/detect/predict/sample.jpg").is_file()  # the input's file type is kept
    assert "results written to" in outputs["quickstart.sh"] or "mAP50" in outputs["quickstart.sh"]
    assert "drawn results written to runs/detect/predict" in outputs["quickstart.sh"]
    assert (tmp_path / "quickstart_sh/runs/detect/quickstart/weights/best.pt").is_file()


def test_the_sample_image_is_the_scene_zoo_draws():
    shipped = np.asarray(Image.open(sample_image()).convert("RGB"), dtype=np.float32)
    drawn = render_scene(np.random.default_rng(SAMPLE_SEED), 320).image.astype(np.float32)
    assert shipped.shape == drawn.shape and np.abs(shipped - drawn).mean() < 6.0  # JPEG at quality 90 (another scene: ~50)
