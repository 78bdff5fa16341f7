"""Property-based fuzzing of every parser that takes user input (hypothesis).

The property is the same for each: an input either parses, or raises a ``ZooError`` subclass
whose message says what is wrong — never another exception type (no ``KeyError: 101`` from deep
inside a library). The device and ``key=value`` parsers must also name the argument in that
message (``device=...``, the key). The example counts are bounded so the suite stays fast; each
test prints how many inputs it tried. Inputs that once broke a parser are ``@example``s, tried on
every run.
"""

from __future__ import annotations

import io
import json
import struct
import warnings

import torch
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zoo_core.cli import parse_key_values
from zoo_core.data.yolo_format import read_detection_yaml, read_labels
from zoo_core.data.errors import DatasetWarning, ProblemReport
from zoo_core.devices import parse_device
from zoo_core.engine.config import TrainConfig
from zoo_core.errors import ZooError
from zoo_core.registry import validate_declaration
from zoo_core.weight_formats import recognise

EXAMPLES = 60
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TRIED: dict[str, int] = {}


def tried(name: str) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1


def parses_or_zoo_error(call, *args) -> None:
    try:
        call(*args)
    except ZooError:
        pass


scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                      max_leaves=12)


text_lines = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
number_lines = st.lists(st.floats(allow_nan=True), max_size=9).map(lambda numbers: " ".join(str(number) for number in numbers))


@FUZZ
@given(st.lists(st.one_of(text_lines, number_lines), max_size=6))
def test_label_lines_parse_or_are_reported(tmp_path_factory, lines):
    tried("label files")
    path = tmp_path_factory.mktemp("labels") / "image.txt"
    path.write_text("\n".join(lines), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DatasetWarning)
        rows = read_labels(path, 3, ProblemReport("fuzz"))
    assert rows is None or (rows.ndim == 2 and rows.shape[1] == 5)


@FUZZ
@given(st.dictionaries(st.sampled_from(["path", "train", "val", "test", "names", "nc", "extra"]), values, max_size=6))
@example({"path": [{"x" * 300: None}]})  # found by fuzzing: OSError "File name too long"
@example({"nc": "", "names": [None]})  # found by fuzzing: ValueError from int("")
def test_dataset_yaml_parses_or_is_a_dataset_error(tmp_path_factory, content):
    tried("dataset YAML")
    root = tmp_path_factory.mktemp("data")
    (root / "images").mkdir()
    path = root / "data.yaml"
    path.write_text(yaml.safe_dump(content, allow_unicode=True), encoding="utf-8")
    parses_or_zoo_error(read_detection_yaml, path)


@FUZZ
@given(st.one_of(st.text(max_size=20), st.integers(-5, 20), st.lists(st.one_of(st.text(max_size=6), st.integers(-3, 9)),
                                                                     max_size=4), values))
@example("²")  # found by fuzzing: str.isdigit() is true for superscripts, int() is not: a raw ValueError
@example("cuda:²")
@example(["0", "¹"])
def test_device_strings_parse_or_are_a_device_spec_error(device):
    tried("device arguments")
    try:
        parse_device(device)
    except ZooError as error:
        assert str(error).startswith("device="), error  # names the argument


key_value_words = st.one_of(
    st.text(max_size=30),
    st.tuples(st.sampled_from(["lr0", "epochs", "name", "device", "imgsz", "x"]), st.text(max_size=24)).map("=".join),
)


@FUZZ
@given(st.lists(key_value_words, max_size=5))
@example(["lr0=2020-13-45"])  # found by fuzzing: YAML's timestamp constructor raised "month must be in 1..12"
@example(["epochs=2001-12-14 25:61:61"])  # ValueError: hour must be in 0..23
@example(["lr0=!!float abc"])  # ValueError from float()
@example(["lr0=!!timestamp x"])  # AttributeError from inside PyYAML
@example(["lr0=" + "[" * 3000])  # RecursionError in PyYAML's composer
@example(["name=2024-05-01"])  # a date-like run name stays text
def test_key_value_arguments_parse_or_are_a_train_config_error(words):
    tried("key=value arguments")
    keys = [word.partition("=")[0].strip() for word in words]
    try:
        overrides = parse_key_values(words)
    except ZooError as error:  # names the word or its key
        assert any(key and key in str(error) for key in keys) or any(repr(word)[1:20] in str(error) for word in words), error
        return
    try:
        TrainConfig.build({"data": "shapes", **overrides})
    except ZooError as error:
        assert any(repr(key.replace("-", "_")) in str(error) for key in keys), error


@FUZZ
@given(st.dictionaries(st.sampled_from(["name", "display", "task", "builder", "sizes", "name_patterns", "spawn", "sync_bn",
                                        "published_num_classes", "param_tolerance", "train_defaults", "recipe", "plugin"]),
                       values, max_size=9))
def test_registry_entries_validate_or_are_a_registry_error(entry):
    tried("registry entries")
    parses_or_zoo_error(validate_declaration, entry, "fuzzed entry")


def _safetensors_bytes(header: object, payload: bytes) -> bytes:
    encoded = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(encoded)) + encoded + payload


@FUZZ
@given(st.one_of(st.binary(max_size=64), values.map(lambda header: _safetensors_bytes(header, b"\x00" * 16)),
                 st.fixed_dictionaries({"w": st.fixed_dictionaries({"dtype": st.sampled_from(["F32", "I64", "XX"]),
                                                                    "shape": st.lists(st.integers(-1, 4), max_size=3),
                                                                    "data_offsets": st.lists(st.integers(-2, 64), max_size=3)}),
                                        "__metadata__": st.dictionaries(st.sampled_from(["zoo", "x"]),
                                                                        st.text(max_size=30), max_size=2)}
                                       ).map(lambda header: _safetensors_bytes(header, b"\x01" * 64))))
def test_safetensors_files_load_or_are_a_weights_error(tmp_path_factory, content):
    tried("safetensors files")
    path = tmp_path_factory.mktemp("weights") / "model.safetensors"
    path.write_bytes(content)
    parses_or_zoo_error(recognise, path)


def _valid_pt_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save({"model": {"weight": torch.ones(4)}, "meta": {"family": "resnet", "size": "18", "task": "classify",
                                                             "num_classes": 2}}, buffer)
    return buffer.getvalue()


VALID_PT = _valid_pt_bytes()


@FUZZ
@given(st.one_of(st.binary(max_size=96),
                 st.tuples(st.integers(0, len(VALID_PT) - 1), st.binary(min_size=1, max_size=8)).map(
                     lambda edit: VALID_PT[:edit[0]] + edit[1] + VALID_PT[edit[0] + len(edit[1]):]),
                 st.integers(1, len(VALID_PT) - 1).map(lambda cut: VALID_PT[:cut])))
@example(b"G")  # found by fuzzing: struct.error from deep inside torch.load
def test_pt_archives_load_or_are_a_weights_error(tmp_path_factory, content):
    tried(".pt archives")
    path = tmp_path_factory.mktemp("weights") / "resnet18.pt"
    path.write_bytes(content)
    parses_or_zoo_error(recognise, path)


def test_zz_print_the_counts():
    """Runs last in this module: the number of inputs each property saw (for the record)."""
    print("fuzzed inputs per parser:", json.dumps(TRIED))
    if TRIED:
        assert all(count >= EXAMPLES // 2 for count in TRIED.values())
