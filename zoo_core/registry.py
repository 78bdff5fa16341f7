"""The declarative registry: the pydantic schema of a family declaration and registry.yaml loading.

registry.yaml at the repository root is the one source for the built-in tasks and families; a
wheel carries it as ``zoo_core/registry.yaml``. Third-party plugins return the same schemas from
their ``zoo_tasks`` and ``zoo_families`` hooks. Field reference: docs/registry.md.

A task is declared by what zoo must know before it imports any task code (``zoo list`` imports
no torch): its ``Task`` class, whether its models predict classes, and whether its inputs may be
rectangles. A family declaration is checked against the declaration of its task.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from zoo_core.errors import RegistryError

__all__ = [
    "TaskDeclaration",
    "builtin_tasks",
    "InputPipeline",
    "HUB_ENDPOINT",
    "WeightsSource",
    "SizeDeclaration",
    "FamilyDeclaration",
    "registry_path",
    "load_registry",
    "builtin_families",
    "declared_in_registry",
    "validate_declaration",
    "validate_task_declaration",
    "ImageSize",
    "image_size_hw",
    "normalise_image_size",
]

# libyaml's safe loader where PyYAML has it (its wheels do): the same documents as yaml.safe_load,
# parsed in C, and every process building a plugin manager (each training worker, each `zoo`
# command) reads the whole registry (docs/performance.md).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

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


class TaskDeclaration(BaseModel):
    """A task as zoo knows it before importing its code (its behaviour and other facts are its ``Task`` class's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    implementation: str = Field(description='"module:Class", the zoo_core.tasks.base.Task subclass; imported on first use')
    classes: bool = Field(default=True, description="its models predict classes (families declare published_num_classes)")
    rectangular: bool = Field(default=False, description="its inputs may be [height, width] rectangles, not only squares")
    libreyolo_name: str | None = Field(default=None, description="the name LibreYOLO's checkpoints give the task, where it differs")

    @field_validator("name")
    @classmethod
    def _task_name(cls, value: str) -> str:
        if not _FAMILY_NAME.match(value):
            raise ValueError(f"{value!r} must be lower case letters, digits and '_', starting with a letter")
        return value

    @field_validator("implementation")
    @classmethod
    def _implementation_reference(cls, value: str) -> str:
        if not _BUILDER_REF.match(value):
            raise ValueError(f'{value!r} must be "package.module:Class"')
        return value


HUB_ENDPOINT = "https://huggingface.co"
"""The Hugging Face Hub's address; ``HF_ENDPOINT`` replaces it at download time (a mirror, a test server)."""

_HUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_WEIGHTS_FILE_SUFFIXES = (".pt", ".pth", ".safetensors")  # naming.WEIGHT_SUFFIXES (naming sits above this module)


class WeightsSource(BaseModel):
    """Where the published weights of one size live: a file of a Hugging Face Hub repository, or a plain URL.

    A Hub file (``repo`` + ``file`` at ``revision``) is downloaded with huggingface_hub and checked
    against ``sha256`` where the registry pins one, else against the sha256 the Hub declares for it.
    A file elsewhere (``url``) needs its ``sha256``. ``names`` are the other file names that mean
    this file (LibreYOLO's spellings); docs/registry.md describes every field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str | None = Field(default=None, description='Hugging Face Hub repository, "owner/name"')
    file: str | None = Field(
        default=None, description="the file in the Hub repository; for a url, the name it is cached under (default: "
        "the URL's last segment)")
    revision: str = Field(default="main", min_length=1, description="branch, tag or commit of the Hub repository")
    url: str | None = Field(default=None, description="http(s) URL of a file that is not on the Hub")
    sha256: str | None = Field(
        default=None, description="hex sha256 of the file (required with url); a download that differs is rejected")
    licence: str = Field(default="unstated", min_length=1, description="the licence of the weights, as their publisher states it")
    licence_notice: str | None = Field(
        default=None, description="shown once when the file is first downloaded: the terms of a non-permissive licence")
    names: list[str] = Field(default_factory=list, description="other file names that mean this file (LibreYOLO's aliases)")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {value!r}")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise ValueError("must be the 64 hex digits of a sha256 digest")
        return value.lower() if value is not None else None

    @field_validator("repo")
    @classmethod
    def _hub_repo(cls, value: str | None) -> str | None:
        if value is not None and not _HUB_REPO.match(value):
            raise ValueError(f'must be a Hub repository "owner/name", got {value!r}')
        return value

    @field_validator("file")
    @classmethod
    def _relative_file(cls, value: str | None) -> str | None:
        if value is not None and (not value or value.startswith("/") or ".." in value.split("/") or "\\" in value):
            raise ValueError(f"must be a relative path inside the repository, got {value!r}")
        return value

    @field_validator("names")
    @classmethod
    def _weights_file_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if "/" in name or not name.lower().endswith(_WEIGHTS_FILE_SUFFIXES):
                raise ValueError(f"{name!r} must be a file name ending in {', '.join(_WEIGHTS_FILE_SUFFIXES)}")
        return value

    @model_validator(mode="after")
    def _one_place(self) -> "WeightsSource":
        if (self.repo is None) == (self.url is None):
            raise ValueError("declare either repo (with file) for a Hugging Face Hub file, or url (with sha256)")
        if self.repo is not None and self.file is None:
            raise ValueError("a Hub source needs the file in its repository: add file")
        if self.url is not None and self.sha256 is None:
            raise ValueError("field 'sha256' is required with url")
        return self

    @property
    def on_hub(self) -> bool:
        """Whether the file is downloaded from a Hugging Face Hub repository."""
        return self.repo is not None

    @property
    def file_name(self) -> str:
        """The file's own name (the last segment of ``file`` or of the URL): what it is called in the cache."""
        if self.file is not None:
            return self.file.rsplit("/", 1)[-1]
        assert self.url is not None
        return self.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]

    def download_url(self, endpoint: str | None = None) -> str:
        """The URL the file is downloaded from: the Hub's resolve route (at ``endpoint``, default the Hub), or ``url``."""
        if self.url is not None:
            return self.url
        from urllib.parse import quote

        base = (endpoint or HUB_ENDPOINT).rstrip("/")
        return f"{base}/{self.repo}/resolve/{quote(self.revision, safe='')}/{quote(str(self.file))}"

    def describe(self) -> str:
        """``hf://owner/repo@revision/file`` for a Hub file (what ``LibreYOLO`` also accepts), else the URL."""
        if self.repo is None:
            return str(self.url)
        revision = "" if self.revision == "main" else f"@{self.revision}"
        return f"hf://{self.repo}{revision}/{self.file}"


class InputPipeline(BaseModel):
    """How an image becomes a family's network input: the resize its published weights were trained with.

    ``zoo_core/data/input_pipeline.py`` runs it; docs/registry.md describes every field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    resize: Literal["letterbox", "stretch", "crop", "native"] = Field(
        description="letterbox: aspect kept, padded; stretch: both sides to the input size; crop: shorter side to "
        "size / crop_pct, then the centre; native: the image as it is")
    placement: Literal["top_left", "centre"] = Field(default="top_left", description="where a letterboxed image sits")
    interpolation: Literal["bilinear", "bilinear_antialiased", "bicubic_antialiased"] = Field(
        default="bilinear", description="bilinear: OpenCV's INTER_LINEAR; the antialiased ones: PIL's filters")
    rounding: Literal["floor", "round"] = Field(default="floor", description="how a letterboxed side's new length is rounded")
    fit_side: int | None = Field(default=None, gt=0, description="a letterboxed image's longer side at most this (YOLO-NAS: 636)")
    pad_value: int = Field(default=114, ge=0, le=255, description="the grey of a letterbox's padding")
    crop_pct: float | None = Field(default=None, gt=0, le=1, description="crop: the share of the resized image kept")
    resize_in_float: bool = Field(default=False, description="resize the image in [0, 1] floats, not in uint8 levels")
    pad_multiple: int | None = Field(
        default=None, gt=0, description="native: the image padded (mirrored) on the right and bottom to a multiple of this")
    unpad_rounding: Literal["floor", "round"] = Field(
        default="floor", description="how a dense prediction's valid region is counted when it is mapped back "
        "(SegFormer's reference rounds where its resize truncated)")

    def merged(self, changes: Mapping[str, Any] | None) -> "InputPipeline":
        """This pipeline with the fields in ``changes`` replaced (a size's or a weights file's own)."""
        return self if not changes else InputPipeline.model_validate({**self.model_dump(), **dict(changes)})

    def describe(self) -> str:
        """The pipeline in a few words (``letterbox, top-left; OpenCV bilinear``), as docs/weights.md lists it."""
        if self.resize == "letterbox":
            words = f"letterbox, {'top-left' if self.placement == 'top_left' else 'centred'}"
            words += f", longer side at most {self.fit_side}" if self.fit_side else ""
            words += ", sides rounded" if self.rounding == "round" else ""
        elif self.resize == "stretch":
            words = "stretch" + (" in floats" if self.resize_in_float else "")
        elif self.resize == "crop":
            words = f"shorter side to imgsz / {self.crop_pct}, centre crop"
        else:
            return "native size" + (f", mirrored to a multiple of {self.pad_multiple}" if self.pad_multiple else "")
        kernel = {"bilinear": "OpenCV bilinear", "bilinear_antialiased": "PIL bilinear", "bicubic_antialiased": "PIL bicubic"}
        return f"{words}; {kernel[self.interpolation]}"


class SizeDeclaration(BaseModel):
    """One size (variant) of a family."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_size: ImageSize = Field(description="default input size in pixels: an int (square) or [height, width]")
    params: int = Field(gt=0, description="published parameter count at the family's published_num_classes")
    params_source: str = Field(min_length=1, description="where the published count comes from")
    config: dict[str, Any] = Field(default_factory=dict, description="keyword data for the builder")
    weights: WeightsSource | None = None
    input_pipeline: dict[str, Any] = Field(
        default_factory=dict, description="fields of the family's input_pipeline this size changes (a classifier's crop_pct)")

    @field_validator("input_size", mode="before")
    @classmethod
    def _image_size(cls, value: Any) -> ImageSize:
        return normalise_image_size(value)


class FamilyDeclaration(BaseModel):
    """Everything zoo knows about a family without importing its code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    display: str = Field(min_length=1)
    task: str = Field(description="the name of a declared task (zoo list --task; registry.yaml's tasks)")
    builder: str = Field(description='"module:function" called with a BuildRequest to build the model')
    plugin: str | None = Field(default=None, description="the plugin package that serves this family")
    paper: str = ""
    sizes: dict[str, SizeDeclaration]
    name_patterns: list[str] = Field(default_factory=list)
    published_num_classes: int | None = Field(default=None, gt=0)
    param_tolerance: float = Field(default=0.02, ge=0, lt=1)
    spawn: bool = False
    sync_bn: bool = False
    input_pipeline: InputPipeline | None = Field(
        default=None, description="the resize the published weights expect; default: the task's (Task.default_input_pipeline)")
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
    converter: str | None = Field(
        default=None, description='"module:function" called as converter(size, state_dict, source, target) to convert '
        "weights between zoo's keys and a foreign layout; default: none (only files in zoo's keys load)"
    )
    libreyolo_family: str | None = Field(
        default=None, description="the model_family LibreYOLO's checkpoints of this family say, where it differs from the "
        "family's name (RTMDet-Ins: rtmdet, told apart from the detector by the checkpoint's task)"
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

    @field_validator("converter")
    @classmethod
    def _converter_reference(cls, value: str | None) -> str | None:
        if value is not None and not _BUILDER_REF.match(value):
            raise ValueError(f'{value!r} must be "package.module:function"')
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

    @field_validator("task")
    @classmethod
    def _declared_task(cls, value: str, info: ValidationInfo) -> str:
        tasks = _tasks_in(info)
        if value not in tasks:
            raise ValueError(f"{value!r} is not a declared task; the tasks are {', '.join(tasks)} (a plugin adds one "
                             "with its zoo_tasks hook, docs/plugins.md)")
        return value

    @model_validator(mode="after")
    def _fits_its_task(self, info: ValidationInfo) -> "FamilyDeclaration":
        tasks = _tasks_in(info)
        task = tasks[self.task]
        if task.classes and self.published_num_classes is None:
            raise ValueError(f"field 'published_num_classes' is required for task {self.task!r}")
        if not task.rectangular:
            rectangles = [size for size, declared in self.sizes.items() if not isinstance(declared.input_size, int)]
            if rectangles:
                rectangular = [name for name, declared in tasks.items() if declared.rectangular]
                raise ValueError(
                    f"sizes {', '.join(rectangles)}: a {self.task!r} model takes a square input_size (one integer); "
                    f"[height, width] is for {', '.join(rectangular) or 'no declared task'}"
                )
        return self

    def input_pipeline_of(self, size: str, task_default: InputPipeline) -> InputPipeline:
        """The input pipeline of ``size``: the family's (else ``task_default``, its task's) with the size's own fields."""
        return (self.input_pipeline or task_default).merged(self.size(size).input_pipeline)

    def size(self, size: str) -> SizeDeclaration:
        """The declaration of ``size``; a ``ModelNameError`` listing the sizes if it is not declared."""
        try:
            return self.sizes[size]
        except KeyError:
            from zoo_core.errors import ModelNameError

            raise ModelNameError(
                f"family {self.name!r} has no size {size!r}; declared sizes: {', '.join(self.sizes)}"
            ) from None


def _tasks_in(info: ValidationInfo) -> Mapping[str, TaskDeclaration]:
    """The task declarations a family declaration is checked against: the validation's, else the built-in ones."""
    return (info.context or {}).get("tasks") or builtin_tasks()


def _format_validation_error(where: str, error: ValidationError) -> str:
    lines = [f"{where} does not match the registry schema (docs/registry.md):"]
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"])
        lines.append(f"  field {field!r}: {item['msg']}" if field else f"  {item['msg']}")
    return "\n".join(lines)


def validate_declaration(data: Mapping[str, Any] | FamilyDeclaration, where: str,
                         tasks: Mapping[str, TaskDeclaration] | None = None) -> FamilyDeclaration:
    """Validate one family declaration against ``tasks`` (default: the built-in tasks); a ``RegistryError``
    naming ``where`` and every bad field if invalid."""
    if isinstance(data, FamilyDeclaration):
        return data
    if not isinstance(data, Mapping):
        raise RegistryError(f"{where} must be a mapping of fields, got {type(data).__name__}")
    try:
        return FamilyDeclaration.model_validate(dict(data), context={"tasks": tasks})
    except ValidationError as error:
        raise RegistryError(_format_validation_error(where, error)) from None


def validate_task_declaration(data: Mapping[str, Any] | TaskDeclaration, where: str) -> TaskDeclaration:
    """Validate one task declaration; a ``RegistryError`` naming ``where`` and every bad field if invalid."""
    if isinstance(data, TaskDeclaration):
        return data
    if not isinstance(data, Mapping):
        raise RegistryError(f"{where} must be a mapping of fields, got {type(data).__name__}")
    try:
        return TaskDeclaration.model_validate(dict(data))
    except ValidationError as error:
        raise RegistryError(_format_validation_error(where, error)) from None


def registry_path() -> Path:
    """The registry.yaml in use: the wheel's copy inside zoo_core, else the source tree's root."""
    packaged = Path(__file__).with_name("registry.yaml")
    if packaged.is_file():
        return packaged
    return Path(__file__).resolve().parent.parent / "registry.yaml"


def load_registry(path: str | Path | None = None) -> dict[str, FamilyDeclaration]:
    """Read and validate a registry file (default: ``registry_path()``) into family declarations by name."""
    path = Path(path) if path is not None else registry_path()
    if path == registry_path():
        return dict(_load_default_registry()[1])
    return _load_registry_file(path)[1]


def builtin_tasks() -> dict[str, TaskDeclaration]:
    """The tasks registry.yaml declares, by name (what the core's ``zoo_tasks`` answer returns)."""
    return dict(_load_default_registry()[0])


@functools.lru_cache(maxsize=1)
def _load_default_registry() -> tuple[dict[str, TaskDeclaration], dict[str, FamilyDeclaration]]:
    return _load_registry_file(registry_path())


def _load_registry_file(path: Path) -> tuple[dict[str, TaskDeclaration], dict[str, FamilyDeclaration]]:
    """The task and family declarations of a registry file; a file without ``tasks`` uses the built-in ones."""
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
    declared_tasks = document.get("tasks")
    if declared_tasks is None and path != registry_path():
        tasks = builtin_tasks()
    elif isinstance(declared_tasks, dict) and declared_tasks:
        tasks = {}
        for name, fields in declared_tasks.items():
            if not isinstance(fields, dict):
                raise RegistryError(f"{path}: task {name!r} must be a mapping of fields")
            tasks[name] = validate_task_declaration({"name": name, **fields}, f"{path.name}: task {name!r}")
    else:
        raise RegistryError(f"{path}: 'tasks' must be a mapping of task name to fields (docs/registry.md); the "
                            "registry zoo ships declares every built-in task there")
    families: dict[str, FamilyDeclaration] = {}
    for name, fields in document["families"].items():
        if not isinstance(fields, dict):
            raise RegistryError(f"{path}: family {name!r} must be a mapping of fields")
        families[name] = validate_declaration({"name": name, **fields}, f"{path.name}: family {name!r}", tasks)
    return tasks, families


def builtin_families(*names: str) -> list[FamilyDeclaration]:
    """The registry.yaml declarations of ``names``: what a built-in plugin's ``zoo_families`` returns."""
    registry = _load_default_registry()[1]
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
