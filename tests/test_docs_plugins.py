"""docs/plugins.md: the example plugins (a family; a task with a family of it) are written to disk and their own tests run."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from zoo_core import hookimpl
from zoo_core.plugin_manager import get_plugin_manager, register_plugin
from zoo_core.testing import plugin_distribution_on_path, write_plugin_distribution

from .conftest import REPO_ROOT
from .markdown_blocks import code_blocks

DOC = REPO_ROOT / "docs" / "plugins.md"


def titled_blocks() -> dict[str, str]:
    return {block.title: block.code for block in code_blocks(DOC) if block.title}


def test_every_python_block_of_the_page_is_a_titled_file():
    for block in code_blocks(DOC):
        if block.language in ("python", "toml"):
            assert block.title, f"untitled {block.language} block would not be tested:\n{block.code}"


def run_plugin_tests(tmp_path, subprocess_env, prefix: str, *, passed: int) -> None:
    """Write the page's plugin whose block titles start with ``prefix`` as a distribution, and run its tests."""
    files = {name[len(prefix):]: code for name, code in titled_blocks().items() if name.startswith(prefix)}
    project = tomllib.loads(files["pyproject.toml"])
    package = next(iter(project["project"]["entry-points"]["zoo.plugins"].values()))
    site = write_plugin_distribution(
        tmp_path / "site",
        distribution=project["project"]["name"],
        version=project["project"]["version"],
        entry_points=project["project"]["entry-points"]["zoo.plugins"],
        modules={
            name[: -len(".py")].replace("/", ".").removesuffix(".__init__"): code
            for name, code in files.items()
            if name.startswith(f"{package}/")
        },
    )
    tests = [name for name in files if name.startswith("tests/")]
    for name in tests:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(files[name])
    env = {**subprocess_env, "PYTHONPATH": f"{site}:{subprocess_env['PYTHONPATH']}", "ZOO_DISABLE_PLUGIN_AUTOLOAD": ""}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(str(tmp_path / name) for name in tests)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{passed} passed" in result.stdout


def test_the_example_task_plugin_trains_validates_and_predicts_on_two_cpu_ranks(tmp_path, subprocess_env):
    """A task and a family of it, from a distribution of their own: nothing in zoo_core names them."""
    run_plugin_tests(tmp_path, subprocess_env, "zoo-counting/", passed=2)


def test_the_example_plugin_installs_and_its_tests_pass(tmp_path, subprocess_env):
    run_plugin_tests(tmp_path, subprocess_env, "", passed=4)


def test_the_policy_plugin_switches_sync_bn_off_everywhere(tmp_path):
    (tmp_path / "zoo_no_sync_bn.py").write_text(titled_blocks()["zoo_no_sync_bn.py"])
    with plugin_distribution_on_path(tmp_path):
        import zoo_no_sync_bn

        manager = get_plugin_manager()
        register_plugin(ForceOn(), "force-on")
        assert manager.default_sync_bn("resnet") is True
        register_plugin(zoo_no_sync_bn)
        assert not any(manager.default_sync_bn(name) for name in manager.families)


class ForceOn:
    """Turns sync_bn on, so the policy plugin's effect is visible (registered later, it is called first)."""

    @hookimpl
    def default_sync_bn(self, family):
        return True
