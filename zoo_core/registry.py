"""The declarative registry: the pydantic schema of a family declaration and registry.yaml loading.

registry.yaml at the repository root is the one source for the built-in families; a wheel
carries it as ``zoo_core/registry.yaml``. Third-party plugins return the same schema from their
``zoo_families`` hook. Field reference: docs/registry.md.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from zoo_core.errors import RegistryError

__all__ = [
    "TASKS",
    "RECTANGULAR_TASKS",
    "WeightsSource",
    "SizeDeclaration",
    "FamilyDeclaration",
    "registry_path",
    "load_registry",
    "builtin_families",
    "declared_in_registry",
    "validate_declaration",
    "ImageSize",
    "image_size_hw",
    "normalise_image_size",
]

# libyaml's safe loader where PyYAML has it (its wheels do): the same documents as yaml.safe_load,
# but the 100 kB registry that every process building a plugin manager reads (each training worker,
# each `zoo` command) parses in 0.02 s instead of 0.3 s.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

TASKS = ("detect", "points", "classify", "semantic", "restore")
# Tasks whose data pipeline resizes to any height × width; the others letterbox or crop to a square.
RECTANGULAR_TASKS = frozenset({"semantic"})
Task = Literal["detect", "points", "classify", "semantic", "restore"]

_FAMILY_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_BUILDER_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


ImageSize = Union[int, tuple[int, int]]
"""An input size: an int for a square, ``(height, width)`` for a rectangle."""


def normalise_image_size(value: Any, what: str = "input_size", minimum: int = 1) -> ImageSize:
    """``value`` as an ``ImageSize``: an int, or a ``(height, width)`` pair of ints (a list or tuple).

    A pair of equal sides is the square's int, so square sizes have one spelling everywhere.
    A ``ValueError`` naming ``what`` for anything else, or for a side below ``minimum``.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        sides: tuple[int, ...] = (value,)
    elif isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(side, int) and not isinstance(side, bool) for side in value):
        sides = (value[0], value[1])
    else:
        raise ValueError(f"{what} must be an integer or a [height, width] pair of integers, got {value!r}")
    if min(sides) < minimum:
        raise ValueError(f"{what} needs sides of at least {minimum} pixel{'s' if minimum > 1 else ''}, got {value!r}")
    return sides[0] if len(sides) == 1 or sides[0] == sides[1] else (sides[0], sides[1])


def image_size_hw(size: ImageSize) -> tuple[int, int]:
    """``(height, width)`` of an input size (an int is a square)."""
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


class WeightsSource(BaseModel):
    """Where the published weights of one size can be downloaded from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="http(s) URL of a .safetensors or .pt file")
    sha256: str = Field(description="hex sha256 of the file; a download that differs is rejected")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise ValueError("must be the 64 hex digits of a sha256 digest")
        return value.lower()


class SizeDeclaration(BaseModel):
    """One size (variant) of a family."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_size: ImageSize = Field(description="default input size in pixels: an int (square) or [height, width]")
    params: int = Field(gt=0, description="published parameter count at the family's published_num_classes")
    params_source: str = Field(min_length=1, description="where the published count comes from")
    config: dict[str, Any] = Field(default_factory=dict, description="keyword data for the builder")
    weights: WeightsSource | None = None

    @field_validator("input_size", mode="before")
    @classmethod
    def _image_size(cls, value: Any) -> ImageSize:
        return normalise_image_size(value)


class FamilyDeclaration(BaseModel):
    """Everything zoo knows about a family without importing its code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    display: str = Field(min_length=1)
    task: Task
    builder: str = Field(description='"module:function" called with a BuildRequest to build the model')
    plugin: str | None = Field(default=None, description="the plugin package that serves this family")
    paper: str = ""
    sizes: dict[str, SizeDeclaration]
    name_patterns: list[str] = Field(default_factory=list)
    published_num_classes: int | None = Field(default=None, gt=0)
    param_tolerance: float = Field(default=0.02, ge=0, lt=1)
    spawn: bool = False
    sync_bn: bool = False
    channels_last: bool = Field(
        default=False, description="on a CPU, train and predict with the network's 4-D tensors in channels-last memory "
        "(declare it where it is measured faster and gives the same outputs; benchmarks/channels_last.py)"
    )
    train_defaults: dict[str, Any] = Field(
        default_factory=dict, description="training arguments this family's published recipe uses (lr0, optimizer...)"
    )
    recipe: str | None = Field(
        default=None, description='"module:Class", a TrainingRecipe subclass; default: zoo_core.engine.recipe:TrainingRecipe'
    )

    @field_validator("name")
    @classmethod
    def _family_name(cls, value: str) -> str:
        if not _FAMILY_NAME.match(value):
            raise ValueError(f"{value!r} must be lower case letters, digits and '_', starting with a letter")
        return value

    @field_validator("builder")
    @classmethod
    def _builder_reference(cls, value: str) -> str:
        if not _BUILDER_REF.match(value):
            raise ValueError(f'{value!r} must be "package.module:function"')
        return value

    @field_validator("recipe")
    @classmethod
    def _recipe_reference(cls, value: str | None) -> str | None:
        if value is not None and not _BUILDER_REF.match(value):
            raise ValueError(f'{value!r} must be "package.module:Class"')
        return value

    @field_validator("sizes")
    @classmethod
    def _some_sizes(cls, value: dict[str, SizeDeclaration]) -> dict[str, SizeDeclaration]:
        if not value:
            raise ValueError("declare at least one size")
        for size in value:
            if not re.fullmatch(r"[a-z0-9_]+", size):
                raise ValueError(f"size {size!r} must be lower case letters, digits and '_'")
        return value

    @field_validator("name_patterns")
    @classmethod
    def _patterns_have_size(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if pattern.count("{size}") != 1:
                raise ValueError(f"pattern {pattern!r} must contain '{{size}}' exactly once")
        return value

    @model_validator(mode="after")
    def _classes_for_class_tasks(self) -> "FamilyDeclaration":
        if self.task != "restore" and self.published_num_classes is None:
            raise ValueError(f"field 'published_num_classes' is required for task {self.task!r}")
        if self.task not in RECTANGULAR_TASKS:
            rectangles = [size for size, declared in self.sizes.items() if not isinstance(declared.input_size, int)]
            if rectangles:
                raise ValueError(
                    f"sizes {', '.join(rectangles)}: a {self.task!r} model takes a square input_size (one integer); "
                    f"[height, width] is for {', '.join(sorted(RECTANGULAR_TASKS))}"
                )
        return self

    def size(self, size: str) -> SizeDeclaration:
        """The declaration of ``size``; a ``ModelNameError`` listing the sizes if it is not declared."""
        try:
            return self.sizes[size]
        except KeyError:
            from zoo_core.errors import ModelNameError

            raise ModelNameError(
                f"family {self.name!r} has no size {size!r}; declared sizes: {', '.join(self.sizes)}"
            ) from None


def _format_validation_error(where: str, error: ValidationError) -> str:
    lines = [f"{where} does not match the registry schema (docs/registry.md):"]
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"])
        lines.append(f"  field {field!r}: {item['msg']}" if field else f"  {item['msg']}")
    return "\n".join(lines)


def validate_declaration(data: Mapping[str, Any] | FamilyDeclaration, where: str) -> FamilyDeclaration:
    """Validate one declaration; a ``RegistryError`` naming ``where`` and every bad field if invalid."""
    if isinstance(data, FamilyDeclaration):
        return data
    if not isinstance(data, Mapping):
        raise RegistryError(f"{where} must be a mapping of fields, got {type(data).__name__}")
    try:
        return FamilyDeclaration.model_validate(dict(data))
    except ValidationError as error:
        raise RegistryError(_format_validation_error(where, error)) from None


def registry_path() -> Path:
    """The registry.yaml in use: the wheel's copy inside zoo_core, else the source tree's root."""
    packaged = Path(__file__).with_name("registry.yaml")
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "registry.yaml"


def load_registry(path: str | Path | None = None) -> dict[str, FamilyDeclaration]:
    """Read and validate a registry file (default: ``registry_path()``) into declarations by name."""
    path = Path(path) if path is not None else registry_path()
    if path == registry_path():
        return dict(_load_default_registry())
    return _load_registry_file(path)


@functools.lru_cache(maxsize=1)
def _load_default_registry() -> dict[str, FamilyDeclaration]:
    return _load_registry_file(registry_path())


def _load_registry_file(path: Path) -> dict[str, FamilyDeclaration]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise RegistryError(f"cannot read the registry {path}: {error}") from None
    try:
        document = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as error:
        raise RegistryError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("families"), dict):
        raise RegistryError(f"{path} must be a mapping with a 'families' mapping (docs/registry.md)")
    families: dict[str, FamilyDeclaration] = {}
    for name, fields in document["families"].items():
        if not isinstance(fields, dict):
            raise RegistryError(f"{path}: family {name!r} must be a mapping of fields")
        families[name] = validate_declaration({"name": name, **fields}, f"{path.name}: family {name!r}")
    return families


def builtin_families(*names: str) -> list[FamilyDeclaration]:
    """The registry.yaml declarations of ``names``: what a built-in plugin's ``zoo_families`` returns."""
    registry = _load_default_registry()
    missing = [name for name in names if name not in registry]
    if missing:
        raise RegistryError(f"{registry_path()} declares no family {', '.join(map(repr, missing))}")
    return [registry[name] for name in names]


def declared_in_registry(*names: str) -> Callable[[], list[FamilyDeclaration]]:
    """A ``zoo_families`` hook implementation that declares ``names`` from registry.yaml.

    A built-in plugin package's declaration is one line::

        zoo_families = declared_in_registry("yolo9")
    """
    from zoo_core.hookspecs import hookimpl

    def zoo_families() -> list[FamilyDeclaration]:
        return builtin_families(*names)

    zoo_families.__doc__ = f"Declare {', '.join(names)} from registry.yaml."
    return hookimpl(zoo_families)
