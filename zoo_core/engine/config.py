"""The training configuration: every argument ``LibreYOLO.train`` and ``zoo train`` accept.

Validated by pydantic at the boundary; an unknown key or a bad value is a ``TrainConfigError``
naming the key, what was given and what is accepted. Defaults follow Ultralytics' names and
meanings so users can carry their habits over; a family may override them with its published
recipe (``train_defaults`` in its declaration), and the user's arguments win over both.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from zoo_core.engine.schedule import ScheduleName
from zoo_core.errors import TrainConfigError, excerpt
from zoo_core.registry import ImageSize, normalise_image_size
from zoo_core.settings import LoggerName, default_loggers, runs_dir

__all__ = ["TrainConfig", "RESUME_OVERRIDABLE", "argument_groups"]

# Arguments that may differ when resuming: they change where and how a run executes, not
# what it computes.
RESUME_OVERRIDABLE = frozenset(
    {"device", "workers", "callbacks", "loggers", "master_port", "ddp_timeout", "verbose", "plots", "resume"}
)


# The first field of each group, in TrainConfig's order (``zoo train --help`` lists them so).
_GROUP_STARTS = {"data": "what and where", "optimizer": "optimisation", "patience": "stopping, checkpoints, outputs",
                 "sync_bn": "distributed and speed", "augment": "augmentation (the task applies the ones that fit it)"}


def argument_groups() -> dict[str, list[tuple[str, Any, str]]]:
    """Every training argument as ``(name, default, description)``, grouped as TrainConfig declares them."""
    groups: dict[str, list[tuple[str, Any, str]]] = {}
    current = ""
    for name, field in TrainConfig.model_fields.items():
        current = _GROUP_STARTS.get(name, current)
        if field.is_required():
            default: Any = "(required)"
        elif field.default_factory is not None:
            default = field.default_factory()  # project and loggers: what the settings say now
        else:
            default = field.default
        groups.setdefault(current, []).append((name, default, field.description or ""))
    return groups


class TrainConfig(BaseModel):
    """Training arguments. ``batch`` is the global batch over all ranks (E5, docs/architecture.md)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    # what and where
    data: str = Field(description="dataset: a built-in name ('shapes'), a YAML file or a folder")
    epochs: int = Field(100, ge=1, description="passes over the training set")
    batch: int = Field(16, description="global batch over all ranks; -1 measures what fits (autobatch)")
    imgsz: ImageSize | None = Field(None, description="training size: an int (square) or (height, width); default: the model's input size")
    device: str | int | list[int | str] | None = Field(None, description="'0,1', [0, 1], 0, 'cuda:0', 'cpu', 'cpu,cpu', 'mps', 'auto'")
    workers: int = Field(2, ge=0, description="DataLoader worker processes per rank")
    project: str = Field(default_factory=lambda: str(runs_dir()), description="the runs folder (default: the runs_dir setting, 'runs')")
    name: str = Field("train", description="the run folder under project/task/ (train, train2, ... when taken)")
    exist_ok: bool = Field(False, description="reuse project/task/name instead of numbering a new folder")
    seed: int = Field(0, description="seed of initialisation, sampling and augmentation (each rank offsets it)")
    fraction: float = Field(1.0, gt=0, le=1, description="fraction of the training set to use")
    cache: bool | Literal["ram", "disk"] = Field(False, description="decode the images once: ram (or true) keeps them in memory, disk as .npy files under ZOO_HOME/cache")
    dropout: float = Field(0.0, ge=0, lt=1, description="classification: dropout before the classifier layer (timm's drop_rate)")
    single_cls: bool = Field(False, description="train every class as one, 'item' (detect, segment, pose): find objects, not kinds")

    # optimisation
    optimizer: Literal["auto", "SGD", "Adam", "AdamW"] = Field("auto", description="auto: the family's published optimizer")
    lr0: float = Field(0.01, gt=0, description="initial learning rate")
    lrf: float = Field(0.01, ge=0, le=1, description="final learning rate as a fraction of lr0")
    momentum: float = Field(0.937, ge=0, lt=1, description="SGD momentum, or Adam/AdamW beta1")
    beta2: float = Field(0.999, ge=0, lt=1, description="Adam/AdamW beta2")
    weight_decay: float = Field(5e-4, ge=0, description="L2 penalty on weights (not on biases or norms)")
    cos_lr: bool = Field(False, description="cosine decay (same as lr_schedule='cosine')")
    lr_schedule: ScheduleName | None = Field(None, description="linear, cosine, flat_cosine, multistep, poly, constant; None: cos_lr decides")
    flat_epochs: float = Field(0.0, ge=0, description="flat_cosine: epochs at the full learning rate before the cosine")
    lr_milestones: list[float] = Field(default_factory=list, description="multistep: epochs at which lr is multiplied by lr_gamma")
    lr_gamma: float = Field(0.1, gt=0, le=1, description="multistep: the factor at each milestone")
    lr_power: float = Field(0.9, gt=0, description="poly: the exponent")
    warmup_epochs: float = Field(3.0, ge=0, description="epochs of linear learning-rate and momentum warm-up")
    warmup_iters: int | None = Field(None, ge=0, description="warm-up length in iterations (overrides warmup_epochs)")
    warmup_momentum: float = Field(0.8, ge=0, lt=1, description="momentum at the start of warm-up")
    warmup_bias_lr: float = Field(0.1, ge=0, description="biases' learning rate at the start of warm-up")
    nbs: int | None = Field(64, ge=1, description="nominal batch: gradients accumulate to about this many images")
    max_grad_norm: float | None = Field(10.0, gt=0, description="clip the gradient norm to this (None: no clipping)")
    ema: bool = Field(True, description="validate and save an exponential moving average of the weights")
    ema_decay: float = Field(0.9999, gt=0, lt=1, description="the average's decay once warmed up")
    ema_tau: float = Field(2000.0, gt=0, description="steps over which the decay ramps up to ema_decay")
    amp: bool = Field(True, description="mixed precision on CUDA: bfloat16 where the GPU has it, else float16 with loss "
                                        "scaling (ignored elsewhere; engine/precision.py)")

    # stopping, checkpoints, outputs
    patience: int = Field(100, ge=0, description="epochs without fitness improvement before stopping; 0 = never")
    time: float | None = Field(None, gt=0, description="maximum training time in hours")
    resume: bool | str = Field(False, description="continue a run: True (this model's last.pt) or a last.pt path")
    save_period: int = Field(-1, description="also save weights/epoch{N}.pt every N epochs (-1: never)")
    val: bool = Field(True, description="validate after every epoch")
    callbacks: list[Any] = Field(default_factory=list, description="Callback objects (rank 0 calls them; model.add_callback for functions)")
    loggers: list[LoggerName] = Field(default_factory=lambda: default_loggers(),
                                      description="csv, tensorboard, mlflow, wandb; default: the loggers setting, ['csv']")
    plots: bool = Field(True, description="draw labels, batches, curves and confusion matrices into the run folder")
    verbose: bool = Field(True, description="print progress and per-epoch lines")

    # distributed
    sync_bn: bool | None = Field(None, description="None: the family's default (default_sync_bn hook)")
    master_port: int | None = Field(None, ge=1, le=65535, description="the rendezvous port of spawned ranks (None: a free one)")
    ddp_timeout: float = Field(10800.0, gt=0, description="process-group timeout in seconds (3 hours)")
    find_unused_parameters: bool = Field(False, description="DDP: allow parameters that get no gradient in a step")
    cuda_graph: bool = Field(False, description="one CUDA device: capture the step as a CUDA graph (torch.compile reduce-overhead)")
    compile: bool = Field(False, description="run the model's training forward (and its backward) through torch.compile; "
                          "the first steps compile for a while (minutes on a CPU), see benchmarks/compile_gain.py")
    freeze: int | list[str] | None = Field(
        None, description="keep these parameters fixed: the first N blocks in forward order (engine/freezing.py says "
                          "what a block is; the run prints their names), or a list of name prefixes ['backbone']"
    )
    profile: bool = Field(False, description="write a torch.profiler trace of the first steps (one device)")

    # augmentation (the task applies the ones that fit it)
    augment: bool = Field(True, description="False: no augmentation at all (the task's letterbox only)")
    hsv_h: float = Field(0.015, ge=0, le=1, description="hue jitter (fraction)")
    hsv_s: float = Field(0.7, ge=0, le=1, description="saturation jitter (fraction)")
    hsv_v: float = Field(0.4, ge=0, le=1, description="brightness jitter (fraction)")
    degrees: float = Field(0.0, ge=0, le=180, description="random rotation, ± degrees")
    translate: float = Field(0.1, ge=0, le=1, description="random shift, ± fraction of the size")
    scale: float = Field(0.5, ge=0, lt=1, description="random zoom, ± fraction")
    fliplr: float = Field(0.5, ge=0, le=1, description="probability of a left-right flip")
    flipud: float = Field(0.0, ge=0, le=1, description="probability of an up-down flip (aerial and microscope images)")
    mosaic: float = Field(1.0, ge=0, le=1, description="probability of a four-image mosaic")
    mixup: float = Field(0.0, ge=0, le=1, description="probability of blending a mosaic with a second one (MixUp)")
    close_mosaic: int = Field(10, ge=0, description="the no-augmentation phase: the last N epochs train without mosaic "
                              "(and whatever else the family's recipe stops there)")
    multi_scale: bool = Field(False, description="train each batch at a random size from the family's published list "
                              "(default 0.5-1.5 × imgsz); only with augment, detection tasks")

    @field_validator("data", mode="before")
    @classmethod
    def _path_to_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, Path) else value

    @field_validator("resume", mode="before")
    @classmethod
    def _resume_path_to_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, Path) else value

    @field_validator("imgsz", mode="before")
    @classmethod
    def _image_size(cls, value: Any) -> Any:
        # (h, w) or [h, w] (a YAML/JSON list); at least 16 px a side, a square pair is its int
        return None if value is None else normalise_image_size(value, "imgsz", minimum=16)

    @field_validator("batch")
    @classmethod
    def _batch_positive_or_auto(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("must be a positive global batch, or -1 for autobatch")
        return value

    @classmethod
    def build(cls, arguments: Mapping[str, Any], *, defaults: Mapping[str, Any] | None = None, source: str = "train()") -> "TrainConfig":
        """Validate ``defaults`` (a family's recipe) overlaid with ``arguments`` (the user's)."""
        merged = {**(defaults or {}), **arguments}
        unknown = [key for key in merged if key not in cls.model_fields]
        if unknown:
            key = unknown[0]
            origin = source if key in arguments else "the family's train_defaults"
            close = difflib.get_close_matches(key, list(cls.model_fields), n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise TrainConfigError(
                f"unknown training argument {key!r} in {origin}.{hint} "
                f"Accepted arguments: {', '.join(cls.model_fields)}"
            )
        if isinstance(merged.get("callbacks"), (list, tuple)):
            from zoo_core.engine.callbacks import check_callbacks

            check_callbacks(merged["callbacks"])  # before pydantic: list[Any] would accept a function never called
        if "data" not in merged:
            raise TrainConfigError(f"{source} needs data=...: a built-in dataset name ('shapes'), a dataset YAML or a folder")
        try:
            return cls.model_validate(merged)
        except ValidationError as error:
            problems = []
            for item in error.errors():
                key = ".".join(str(part) for part in item["loc"]) or "(arguments)"
                given = merged.get(str(item["loc"][0])) if item["loc"] else None
                problems.append(f"training argument {key!r}={excerpt(given)} is invalid: {item['msg']}")
            raise TrainConfigError("; ".join(problems)) from None

    def for_checkpoint(self) -> dict[str, Any]:
        """The arguments as plain data (callbacks dropped), for checkpoints and ``args.yaml``."""
        return self.model_dump(exclude={"callbacks"}, mode="json")
