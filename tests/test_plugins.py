"""The plugin system end to end, with real throwaway distributions found through entry points."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zoo_core import hookimpl, hookspecs
from zoo_core.errors import DuplicateFamilyError, PluginHookError, PluginImportError, UnknownFamilyError
from zoo_core.facade import LibreYOLO
from zoo_core.plugin_manager import get_plugin_manager, register_plugin
from zoo_core.registry import load_registry
from zoo_core.testing import isolated_plugin_manager, plugin_distribution_on_path, write_plugin_distribution

TINYNET_PLUGIN = '''
    """A third-party family: a tiny classifier."""
    from zoo_core import hookimpl

    IMPORTED = True

    @hookimpl
    def zoo_families():
        return [{
            "name": "tinynet",
            "display": "TinyNet",
            "task": "classify",
            "builder": "zoo_tinynet.model:build",
            "published_num_classes": 10,
            "sizes": {"s": {"input_size": 32, "params": 1290, "params_source": "this test"}},
            "name_patterns": ["tiny{size}"],
        }]
'''
TINYNET_MODEL = '''
    import torch

    class TinyNet(torch.nn.Module):
        def __init__(self, num_classes):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.head = torch.nn.Linear(8, num_classes)
        def forward(self, x):
            return self.head(self.conv(x).mean((2, 3)))

    def build(request):
        return TinyNet(request.num_classes)
'''


def tinynet_distribution(root: Path, **extra_modules: str) -> Path:
    return write_plugin_distribution(
        root,
        distribution="zoo-tinynet",
        version="2.3.4",
        entry_points={"tinynet": "zoo_tinynet"},
        modules={"zoo_tinynet": TINYNET_PLUGIN, "zoo_tinynet.model": TINYNET_MODEL, **extra_modules},
    )


def run_zoo(args: list[str], env: dict[str, str], extra_path: Path | None = None) -> subprocess.CompletedProcess:
    if extra_path is not None:
        env = {**env, "PYTHONPATH": f"{extra_path}:{env['PYTHONPATH']}"}
    return subprocess.run(
        [sys.executable, "-m", "zoo_core", *args], env=env, capture_output=True, text=True, timeout=120
    )


# --------------------------------------------------------------------------- third-party plugin
def test_a_third_party_plugin_appears_in_list_plugins_and_info(tmp_path, subprocess_env):
    root = tinynet_distribution(tmp_path / "site")
    env = {**subprocess_env, "ZOO_DISABLE_PLUGIN_AUTOLOAD": ""}
    listing = run_zoo(["list", "--json"], env, root)
    assert listing.returncode == 0, listing.stderr
    families = {item["family"]: item for item in json.loads(listing.stdout)}
    assert families["tinynet"]["distribution"] == "zoo-tinynet"
    assert "resnet" in families

    plugins = run_zoo(["plugins"], env, root)
    assert plugins.returncode == 0, plugins.stderr
    line = next(line for line in plugins.stdout.splitlines() if line.startswith("tinynet"))
    assert "zoo-tinynet" in line and "2.3.4" in line and line.rstrip().endswith("tinynet")

    info = run_zoo(["info", "tinynet"], env, root)
    assert info.returncode == 0, info.stderr
    assert "TinyNet" in info.stdout and "zoo-tinynet 2.3.4" in info.stdout
    assert "no (torchrun only)" in info.stdout


def test_a_plugin_without_declared_spawn_support_is_not_ddp_capable(tmp_path, subprocess_env):
    root = tinynet_distribution(tmp_path / "site")
    env = {**subprocess_env, "ZOO_DISABLE_PLUGIN_AUTOLOAD": ""}
    capable = run_zoo(["list", "--ddp-capable", "--json"], env, root)
    names = {item["family"] for item in json.loads(capable.stdout)}
    assert "tinynet" not in names and "resnet" in names


def test_the_plugins_builder_is_used(tmp_path):
    with plugin_distribution_on_path(tinynet_distribution(tmp_path / "site")):
        with isolated_plugin_manager(autoload=True):
            model = LibreYOLO("tiny-s", num_classes=4)
            assert type(model.model).__name__ == "TinyNet"
            assert model.family == "tinynet" and model.num_classes == 4
            assert get_plugin_manager().supports_spawn("tinynet") is False


def test_a_blocked_plugin_is_never_imported(tmp_path, monkeypatch):
    with plugin_distribution_on_path(tinynet_distribution(tmp_path / "site")):
        monkeypatch.setenv("ZOO_BLOCK_PLUGINS", "tinynet")
        with isolated_plugin_manager(autoload=True) as manager:
            assert "zoo_tinynet" not in sys.modules
            assert "tinynet" not in manager.families
            with pytest.raises(UnknownFamilyError, match="blocked plugins: tinynet"):
                manager.family("tinynet")
        monkeypatch.delenv("ZOO_BLOCK_PLUGINS")
        with isolated_plugin_manager(autoload=True, block=["tinynet"]) as manager:  # the Python argument
            assert "zoo_tinynet" not in sys.modules
            assert "tinynet" not in manager.families


def test_disabled_autoload_skips_third_party_but_keeps_builtins(tmp_path, monkeypatch):
    with plugin_distribution_on_path(tinynet_distribution(tmp_path / "site")):
        monkeypatch.setenv("ZOO_DISABLE_PLUGIN_AUTOLOAD", "1")
        with isolated_plugin_manager() as manager:
            assert "tinynet" not in manager.families and "resnet" in manager.families
            assert "zoo_tinynet" not in sys.modules
        monkeypatch.setenv("ZOO_DISABLE_PLUGIN_AUTOLOAD", "0")
        with isolated_plugin_manager() as manager:
            assert "tinynet" in manager.families


@pytest.mark.parametrize("decoy", ["zoo", "zoo-core"])
def test_a_decoy_distribution_first_on_the_path_does_not_hide_the_builtins(tmp_path, decoy):
    # An unrelated package named "zoo" exists on the public index, and a stale zoo-core without
    # entry points can sit first on a crowded path: neither may make a built-in family vanish.
    root = write_plugin_distribution(tmp_path / "site", distribution=decoy, entry_points={}, modules={}, version="0.0.1")
    with plugin_distribution_on_path(root):
        with isolated_plugin_manager(autoload=True) as manager:
            assert set(load_registry()) <= set(manager.families)
            assert manager.family_record("resnet").distribution == "zoo-core"


def test_a_broken_plugin_names_itself_its_distribution_and_the_switches(tmp_path):
    root = write_plugin_distribution(
        tmp_path / "site",
        distribution="zoo-broken",
        entry_points={"broken": "zoo_broken"},
        modules={"zoo_broken": "raise RuntimeError('boom at import')\n"},
    )
    with plugin_distribution_on_path(root):
        with pytest.raises(PluginImportError) as caught:
            with isolated_plugin_manager(autoload=True):
                pass
    message = str(caught.value)
    for expected in ("'broken'", "zoo-broken", "boom at import", "ZOO_BLOCK_PLUGINS=broken", "ZOO_DISABLE_PLUGIN_AUTOLOAD=1"):
        assert expected in message


def test_a_plugin_redeclaring_resnet_is_a_duplicate_naming_both(tmp_path):
    root = write_plugin_distribution(
        tmp_path / "site",
        distribution="zoo-resnet-fork",
        entry_points={"myresnet": "zoo_myresnet"},
        modules={
            "zoo_myresnet": '''
                from zoo_core import hookimpl
                from zoo_core.registry import builtin_families

                @hookimpl
                def zoo_families():
                    return builtin_families("resnet")
            '''
        },
    )
    with plugin_distribution_on_path(root):
        with pytest.raises(DuplicateFamilyError) as caught:
            with isolated_plugin_manager(autoload=True):
                pass
    message = str(caught.value)
    assert "family 'resnet'" in message
    assert "plugin 'resnet' (distribution zoo-core" in message
    assert "plugin 'myresnet' (distribution zoo-resnet-fork 1.0.0)" in message


def test_a_misspelt_hook_is_rejected_with_a_suggestion(tmp_path):
    root = write_plugin_distribution(
        tmp_path / "site",
        distribution="zoo-typo",
        entry_points={"typo": "zoo_typo"},
        modules={
            "zoo_typo": '''
                from zoo_core import hookimpl

                @hookimpl
                def build_modle(family, size, num_classes, options):
                    return None
            '''
        },
    )
    with plugin_distribution_on_path(root):
        with pytest.raises(PluginHookError) as caught:
            with isolated_plugin_manager(autoload=True):
                pass
    message = str(caught.value)
    assert "'build_modle'" in message and "did you mean 'build_model'" in message and "zoo-typo" in message


def test_unknown_family_lists_close_matches():
    with pytest.raises(UnknownFamilyError, match="Did you mean 'resnet'"):
        get_plugin_manager().family("resnett")


# --------------------------------------------------------------------------- hooks, one test each
class ForceSyncBatchNorm:
    """A policy plugin: sync_bn on for every family."""

    @hookimpl
    def default_sync_bn(self, family):
        return True


class NoSpawnPolicy:
    @hookimpl
    def supports_spawn(self, family):
        return False


class WrappedResnet:
    @hookimpl
    def build_model(self, family, size, num_classes, options):
        if family != "resnet":
            return None
        import torch

        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))


def test_every_hookspec_is_documented():
    specs = [name for name in hookspecs.__all__ if name not in ("PROJECT_NAME", "hookspec", "hookimpl")]
    assert set(specs) == {"zoo_tasks", "zoo_families", "build_model", "default_sync_bn", "supports_spawn", "training_recipe",
                          "convert_weights"}
    for name in specs:
        doc = getattr(hookspecs, name).__doc__ or ""
        assert len(doc.split()) > 15, f"hookspec {name} needs a docstring a plugin author can work from"


def test_hook_default_sync_bn_policy_plugin_overrides_every_family():
    manager = get_plugin_manager()
    assert manager.default_sync_bn("resnet") is False
    register_plugin(ForceSyncBatchNorm(), "force-sync-bn")
    assert all(manager.default_sync_bn(name) for name in manager.families)


def test_hook_supports_spawn_can_be_overridden():
    manager = get_plugin_manager()
    assert manager.supports_spawn("resnet") is True
    register_plugin(NoSpawnPolicy(), "no-spawn")
    assert manager.supports_spawn("resnet") is False


def test_hook_training_recipe_defaults_to_the_declared_recipe_or_the_core_one():
    from zoo_core.engine.recipe import TrainingRecipe

    manager = get_plugin_manager()
    recipe = manager.training_recipe("yolo9", "t")
    assert type(recipe) is TrainingRecipe and recipe.input_size_multiple() == 32
    assert recipe.config_defaults == dict(manager.family("yolo9").train_defaults)
    assert manager.training_recipe("resnet", "18").input_size_multiple() == 1


def test_hook_training_recipe_can_be_overridden_by_a_plugin():
    from zoo_core.engine.recipe import TrainingRecipe

    class SlowBackbone(TrainingRecipe):
        lr_multipliers = {"layer1.": 0.1}

    class Policy:
        @hookimpl
        def training_recipe(self, family, size):
            return SlowBackbone(get_plugin_manager().family(family), size) if family == "resnet" else None

    register_plugin(Policy(), "slow-backbone")
    manager = get_plugin_manager()
    assert type(manager.training_recipe("resnet", "18")) is SlowBackbone
    assert type(manager.training_recipe("convnext", "t")) is TrainingRecipe


def test_hook_convert_weights_answers_none_without_a_converter():
    assert get_plugin_manager().convert_weights("resnet", "18", {}, "upstream", "zoo") is None


def test_hook_build_model_first_result_wins_over_the_declared_builder():
    register_plugin(WrappedResnet(), "wrapped-resnet")
    model = LibreYOLO("resnet18", num_classes=5)
    assert type(model.model).__name__ == "Sequential"
    assert type(LibreYOLO("convnext-t", num_classes=5).model).__name__ == "ConvNeXt"


def test_hook_zoo_families_declares_through_a_runtime_plugin():
    class Declares:
        @hookimpl
        def zoo_families(self):
            return [{
                "name": "runtime_net", "display": "RuntimeNet", "task": "classify",
                "builder": "zoo_core.timm_families:build_timm_classifier",
                "published_num_classes": 1000, "spawn": True,
                "sizes": {"a": {"input_size": 32, "params": 11689512, "params_source": "resnet18",
                                "config": {"timm_name": "resnet18"}}},
            }]

    register_plugin(Declares(), "declares")
    manager = get_plugin_manager()
    assert manager.family("runtime_net").plugin == __name__
    assert manager.supports_spawn("runtime_net") is True
    assert LibreYOLO("runtime_net-a", num_classes=2).family == "runtime_net"


def test_an_invalid_declaration_names_the_plugin_and_field():
    class BadDeclaration:
        @hookimpl
        def zoo_families(self):
            return [{"name": "bad", "display": "Bad", "task": "classify", "builder": "x:y", "sizes": {}}]

    from zoo_core.errors import RegistryError

    with pytest.raises(RegistryError) as caught:
        register_plugin(BadDeclaration(), "bad-declaration")
    assert "plugin 'bad-declaration'" in str(caught.value) and "'sizes'" in str(caught.value)


def test_zoo_debug_traces_hook_calls(subprocess_env):
    env = {**subprocess_env, "ZOO_DEBUG": "1"}
    result = run_zoo(["list", "--ddp-capable"], env)
    assert result.returncode == 0
    assert "supports_spawn" in result.stderr


# --------------------------------------------------------------------------- cheap imports
def test_zoo_list_imports_neither_torch_nor_any_architecture(subprocess_env):
    code = (
        "import sys, io, contextlib\n"
        "from zoo_core.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['list', '--ddp-capable']) == 0\n"
        "    assert main(['info', 'resnet']) == 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm', 'torchvision', 'numpy'))\n"
        "arch = sorted(m for m in sys.modules if (m.startswith('zoo_') and not m.startswith('zoo_core') and '.' in m)\n"
        "              or m.split('.')[:2] in (['zoo_core', 'nn'], ['zoo_core', 'engine'], ['zoo_core', 'tasks']))\n"
        "plugins = sorted(m for m in sys.modules if m.startswith('zoo_') and m != 'zoo_core')\n"
        "print(heavy, arch, plugins)\n"
        "assert not heavy and not arch and plugins, (heavy, arch)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
