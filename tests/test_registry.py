"""registry.yaml: schema validation with errors that name family and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from zoo_core.errors import RegistryError
from zoo_core.naming import name_table
from zoo_core.registry import builtin_tasks, load_registry, registry_path

GOOD_ENTRY = """
schema_version: 1
families:
  tiny:
    display: Tiny
    task: classify
    builder: some.module:build
    published_num_classes: 10
    sizes:
      s: {input_size: 32, params: 1000, params_source: "a test"}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "registry.yaml"
    path.write_text(text)
    return path


def test_the_shipped_registry_is_valid_and_names_are_unambiguous():
    families = load_registry()
    assert families, "registry.yaml declares no family"
    for name, declaration in families.items():
        assert declaration.name == name
        assert declaration.task in builtin_tasks()
        # One package may serve related families (zoo_yolo9: yolo9 and yolo9_seg share the GELAN detector).
        assert declaration.plugin in {f"zoo_{family}" for family in families}, (
            f"{name}: built-in plugins live in plugins/zoo_<family>/, got {declaration.plugin!r}"
        )
        for size in declaration.sizes.values():
            assert size.params_source.strip()
    name_table(families)  # raises if two models share a spelling


def test_every_registry_family_has_its_plugin_package_and_entry_point():
    import tomllib

    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())
    entry_points = project["project"]["entry-points"]["zoo.plugins"]
    wheel_packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    for name, declaration in load_registry().items():
        # A family served by another family's package (yolo9_seg by zoo_yolo9) rides on that entry point.
        assert entry_points.get(name, declaration.plugin) == declaration.plugin
        assert declaration.plugin in entry_points.values()
        assert f"plugins/{declaration.plugin}" in wheel_packages
        assert (root / "plugins" / declaration.plugin / "__init__.py").is_file()


def test_a_valid_file_loads(tmp_path):
    families = load_registry(write(tmp_path, GOOD_ENTRY))
    assert families["tiny"].sizes["s"].params == 1000
    assert families["tiny"].spawn is False, "spawn support must be declared, never assumed"
    assert families["tiny"].param_tolerance == 0.02


@pytest.mark.parametrize(
    ("replace", "by", "field"),
    [
        ("task: classify", "task: painting", "task"),
        ("params: 1000", "params: -5", "sizes.s.params"),
        ('params_source: "a test"', "", "sizes.s.params_source"),
        ("builder: some.module:build", "builder: not a reference", "builder"),
        ("    published_num_classes: 10\n", "    published_num_classes: 10\n    colour: red\n", "colour"),
        ("    published_num_classes: 10\n", "", "published_num_classes"),
    ],
)
def test_errors_name_the_family_and_the_field(tmp_path, replace, by, field):
    text = GOOD_ENTRY.replace(replace, by)
    assert text != GOOD_ENTRY
    with pytest.raises(RegistryError) as caught:
        load_registry(write(tmp_path, text))
    message = str(caught.value)
    assert "family 'tiny'" in message
    assert f"field '{field}" in message or f"'{field}'" in message


def test_weights_need_a_real_sha256(tmp_path):
    text = GOOD_ENTRY.replace(
        'params_source: "a test"}',
        'params_source: "a test", weights: {url: "http://x/y.pt", sha256: "abc"}}',
    )
    with pytest.raises(RegistryError, match="sizes.s.weights.sha256"):
        load_registry(write(tmp_path, text))


def test_the_registry_is_read_with_libyaml_and_reads_as_safe_load_reads_it():
    import yaml

    from zoo_core import registry

    text = registry.registry_path().read_text(encoding="utf-8")
    if yaml.__with_libyaml__:  # PyYAML's wheels are built with it
        assert registry._SAFE_LOADER is yaml.CSafeLoader
    assert yaml.load(text, Loader=registry._SAFE_LOADER) == yaml.safe_load(text)
    with pytest.raises(yaml.constructor.ConstructorError):  # no arbitrary Python objects, as safe_load
        yaml.load("!!python/object/apply:os.getcwd []", Loader=registry._SAFE_LOADER)


def test_a_registry_file_that_asks_for_python_objects_is_refused(tmp_path):
    with pytest.raises(RegistryError, match="not valid YAML"):
        load_registry(write(tmp_path, "families: !!python/object/apply:os.getcwd []"))


def test_not_yaml_and_not_a_mapping(tmp_path):
    with pytest.raises(RegistryError, match="not valid YAML"):
        load_registry(write(tmp_path, "families: [unclosed"))
    with pytest.raises(RegistryError, match="'families' mapping"):
        load_registry(write(tmp_path, "- a list"))


def test_yaml_tags_are_refused(tmp_path):
    # safe_load only: a python object tag must never be constructed.
    with pytest.raises(RegistryError):
        load_registry(write(tmp_path, "families: !!python/object/apply:os.system ['echo hi']"))


class _DuplicateKeyCheckingLoader(yaml.SafeLoader):
    """A safe loader that refuses a mapping key given twice (PyYAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):  # noqa: D102 - PyYAML's hook
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise AssertionError(
                    f"registry.yaml gives {key!r} twice (lines {seen[key]} and {key_node.start_mark.line + 1}): "
                    "the later one silently replaces the earlier; keep one"
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def test_no_key_of_the_shipped_registry_is_given_twice():
    """A merge that adds a family or task twice must not pass: YAML would keep only the second."""
    text = registry_path().read_text(encoding="utf-8")
    yaml.load(text, Loader=_DuplicateKeyCheckingLoader)  # noqa: S506 - a SafeLoader subclass only
