"""docs/data.md: every Python example runs (in order, in an empty folder) and every YAML example parses."""

from __future__ import annotations

import contextlib
import io

import yaml

from zoo_core.data.shapes import ShapesConfig

from .conftest import REPO_ROOT
from .markdown_blocks import code_blocks

DOC = REPO_ROOT / "docs" / "data.md"


def test_the_python_examples_run_and_print_what_they_say():
    namespace: dict[str, object] = {"__name__": "__docs__"}
    printed = io.StringIO()
    blocks = [block for block in code_blocks(DOC) if block.language == "python"]
    assert len(blocks) >= 6
    with contextlib.redirect_stdout(printed):
        for block in blocks:
            exec(compile(block.code, f"{DOC}:python", "exec"), namespace)
    output = printed.getvalue()
    assert "shapes:train=32,val=8,size=96,seed=1" in output
    assert "class id 7 is outside names (0..2); line skipped" in output
    assert "['fitness', 'mAP50', 'mAP50-95', 'mAP75', 'mAR100']" in output
    assert "[[0.0, 0.25, 0.25, 0.625, 0.75]] 3600" in output  # a YOLO-seg polygon: its extent and its pixels
    assert "{0: 'car', 1: 'bus'} ['instances_val.json'] [[40.0, 30.0, 100.0, 90.0]]" in output  # COCO's layout
    assert "True runs/detect/predict" in output  # predict(classes=..., save_txt=..., save_crop=...) kept only those
    assert "8 True runs/detect/track/crossing.mp4" in output  # track(save=True): one annotated video


def test_the_yaml_examples_parse():
    for block in code_blocks(DOC):
        if block.language == "yaml":
            assert isinstance(yaml.safe_load(block.code), dict)


def test_the_documented_shapes_default_is_the_real_one():
    default = ShapesConfig()
    text = DOC.read_text(encoding="utf-8")
    assert f"{default.num_train} training and {default.num_val} validation scenes of {default.image_size}×{default.image_size} px, seed {default.seed}" in text
    assert default.directory_name in text
