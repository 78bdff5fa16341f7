"""A plain, non-editable ``pip install .`` into a fresh environment lists every family.

The wheel must carry registry.yaml and the built-in plugin packages. The fresh venv gets the
wheel without dependencies, then the three light ones ``zoo list`` needs (pluggy, pydantic,
pyyaml) from the package index; torch is deliberately absent, which also proves ``zoo list``
never needs it. A decoy distribution named ``zoo`` (an unrelated package of that name exists on
the public index) and a stale ``zoo-core`` without entry points are put first on the path: the
built-in families must still all be listed.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv

import pytest

from zoo_core.registry import load_registry
from zoo_core.testing import write_plugin_distribution

from .conftest import REPO_ROOT


@pytest.mark.timeout(600)
def test_non_editable_install_lists_every_family(tmp_path):
    environment = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(environment)
    python = environment / "bin" / "python"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def pip(*args: str) -> None:
        result = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *args], env=env, capture_output=True, text=True, timeout=500
        )
        assert result.returncode == 0, result.stdout + result.stderr

    pip("--no-deps", str(REPO_ROOT))
    pip("pluggy>=1.5", "pydantic>=2.5", "pyyaml>=6.0")

    decoys = tmp_path / "decoys"
    write_plugin_distribution(decoys, distribution="zoo", entry_points={}, modules={"zoo": "VERSION = '0.0.1'\n"})
    write_plugin_distribution(decoys, distribution="zoo-core", entry_points={}, modules={}, version="0.0.1")
    result = subprocess.run(
        [str(environment / "bin" / "zoo"), "list", "--json"], env={**env, "PYTHONPATH": str(decoys)}, capture_output=True,
        text=True, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    listed = {item["family"] for item in json.loads(result.stdout)}
    assert listed == set(load_registry())
    where = subprocess.run(
        [str(python), "-c", "import zoo_core, zoo_resnet; print(zoo_core.__file__); print(zoo_resnet.__file__)"],
        env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )
    assert where.returncode == 0, where.stderr
    for line in where.stdout.splitlines():
        assert line.startswith(str(environment)), f"imported from the source tree, not the install: {line}"
    assert "torch" not in subprocess.run(
        [str(python), "-m", "pip", "list"], env=env, capture_output=True, text=True, timeout=120
    ).stdout.lower().split()
