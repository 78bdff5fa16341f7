"""Test isolation: every test gets its own working directory, cache and plugin manager.

Third-party plugins installed in the environment are ignored by default
(``ZOO_DISABLE_PLUGIN_AUTOLOAD=1``); tests that exercise them turn autoload back on explicitly.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from zoo_core.testing import isolated_plugin_manager

from .learning import LearningRun

REPO_ROOT = Path(__file__).resolve().parent.parent

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on two cores: one torch thread each, not two contending pairs.
    torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("learning", "learning tests (benchmarks/learning_margins.py varies these)")
    group.addoption("--learning-seed", type=int, default=0,
                    help="seed of every learning test's model, sampler and augmentation (default 0)")
    group.addoption("--learning-threads", type=int, default=None,
                    help="torch threads for every learning test (default: the session's)")
    group.addoption("--learning-report", type=Path, default=None,
                    help="append each learning test's scores to this file as JSON lines")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "learning" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.learning)


@pytest.fixture
def learning(request: pytest.FixtureRequest, _torch_threads_restored: None) -> LearningRun:
    """The seed and thread count of a learning test, and its ``expect`` (tests/learning.py)."""
    threads = request.config.getoption("--learning-threads")
    if threads is not None:  # after any file-level one-thread fixture, which autouse puts first
        torch.set_num_threads(threads)
    return LearningRun(test=request.node.nodeid, seed=request.config.getoption("--learning-seed"),
                       threads=torch.get_num_threads(), report=request.config.getoption("--learning-report"))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A test may set torch's thread count for itself; the next test starts with the session's again.

    A leaked count of 2 under `make test` put three busy threads on two cores for the rest of that
    worker's tests, and GNU OpenMP's spinning made some of them several times slower.
    """
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def _multiprocessing_temp_dir_outside_tests() -> None:
    """multiprocessing keeps the first temporary folder it is asked for (the forkserver's socket lives
    there) for the rest of the process: take it now, before a test points ``tempfile`` at a long tmp_path."""
    import multiprocessing.util

    multiprocessing.util.get_temp_dir()


@pytest.fixture(scope="session")
def zoo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache per test session, so built-in datasets are generated once."""
    return tmp_path_factory.mktemp("zoo_home")


@pytest.fixture(autouse=True)
def _isolated_zoo(zoo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ZOO_HOME", str(zoo_home))
    monkeypatch.setenv("ZOO_DISABLE_PLUGIN_AUTOLOAD", "1")
    # No test reaches the internet: a published file that is not cached is a WeightsOfflineError (the
    # tests of downloads serve files from 127.0.0.1 and lift this themselves: tests/hub_server.py).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")  # huggingface_hub would fetch its agent list from the Hub
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    for name in ("ZOO_BLOCK_PLUGINS", "ZOO_DEBUG", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    # The cache is shared by the session, its settings file is not: one test's runs_dir must not move another's runs.
    settings_file = zoo_home / "settings.yaml"
    settings_file.unlink(missing_ok=True)
    try:
        with isolated_plugin_manager():
            yield
    finally:
        settings_file.unlink(missing_ok=True)


@pytest.fixture
def subprocess_env(zoo_home: Path) -> dict[str, str]:
    """Environment for ``zoo`` subprocesses: the repository importable, the test's cache."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "plugins"), env.get("PYTHONPATH", "")])
    env["ZOO_HOME"] = str(zoo_home)
    return env
