"""The ``zoo`` command line.

``list``, ``info`` and ``plugins`` answer from declarations and hooks only: they never import
torch or an architecture module, so they stay fast. ``train``, ``val`` and ``predict`` import
the engine when they run; ``zoo train`` takes the main arguments as flags and any other training
argument as ``key=value`` (``zoo train yolo9-t --data shapes --device cpu,cpu lr0=0.001``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from zoo_core import __version__
from zoo_core.errors import ModelNameError, TrainConfigError, UnknownFamilyError, ZooError

EXPORT_FORMATS = ("libreyolo", "onnx", "torchscript")

__all__ = ["main", "build_parser", "parse_key_values"]


def _format_count(count: int) -> str:
    return f"{count / 1e6:.1f}M" if count >= 1e5 else f"{count / 1e3:.1f}K"


def _print_table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(row[column])) for row in [header, *rows]) for column in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())


def _family_summary(manager: Any, name: str) -> dict[str, Any]:
    declaration = manager.family(name)
    record = manager.family_record(name)
    return {
        "family": name,
        "display": declaration.display,
        "task": declaration.task,
        "sizes": list(declaration.sizes),
        "weights": [size for size, spec in declaration.sizes.items() if spec.weights is not None],  # sizes with published weights
        "spawn": manager.supports_spawn(name),
        "sync_bn": manager.default_sync_bn(name),
        "plugin": record.name,
        "distribution": record.distribution,
    }


def command_list(arguments: argparse.Namespace) -> int:
    """``zoo list``: one line per family (``--ddp-capable``: only those that auto-spawn)."""
    from zoo_core.plugin_manager import get_plugin_manager

    manager = get_plugin_manager()
    summaries = [_family_summary(manager, name) for name in manager.families]
    if arguments.task:
        manager.task(arguments.task)  # an unknown task is an error naming the declared ones
        summaries = [summary for summary in summaries if summary["task"] == arguments.task]
    if arguments.ddp_capable:
        summaries = [summary for summary in summaries if summary["spawn"]]
    if arguments.json:
        print(json.dumps(summaries, indent=2))
        return 0
    if arguments.markdown:
        print(families_markdown(manager, [summary["family"] for summary in summaries]), end="")
        return 0
    rows = [
        [
            summary["family"],
            summary["task"],
            " ".join(summary["sizes"]),
            f"{len(summary['weights'])}/{len(summary['sizes'])}",  # sizes with published weights (zoo info says which)
            "yes" if summary["spawn"] else "torchrun only",
            "on" if summary["sync_bn"] else "off",
            summary["display"],
        ]
        for summary in summaries
    ]
    _print_table(rows, ["FAMILY", "TASK", "SIZES", "WEIGHTS", "SPAWN", "SYNC_BN", "NAME"])
    return 0


def _format_image_size(size: Any) -> str:
    """``640`` for a square, ``512x1024`` (height x width) for a rectangle."""
    return str(size) if isinstance(size, int) else "x".join(str(side) for side in size)


def families_markdown(manager: Any, families: list[str]) -> str:
    """docs/families.md: a Markdown table of ``families`` with every size's published facts.

    The page is this function's output (``zoo list --markdown > docs/families.md``), so the docs
    list exactly the families the registry declares; tests/test_docs_families.py keeps it so.
    """
    lines = [
        "# Families",
        "",
        "Generated from registry.yaml by `zoo list --markdown > docs/families.md`; do not edit by hand.",
        "Parameter counts are the published ones (at the published class count) with their source;",
        "the test suite builds every size and checks its count. `zoo info FAMILY` says more.",
        "",
        "| family | task | size | input | parameters | sync_bn | spawn | source |",
        "| --- | --- | --- | --- | ---: | --- | --- | --- |",
    ]
    for family in families:
        declaration = manager.family(family)
        summary = _family_summary(manager, family)
        for size, spec in declaration.sizes.items():
            height, width = (spec.input_size, spec.input_size) if isinstance(spec.input_size, int) else spec.input_size
            source = (spec.params_source or "").replace("|", "/").replace("\n", " ")
            lines.append(
                f"| {declaration.display} (`{family}`) | {declaration.task} | `{family}-{size}` | {height}x{width} | "
                f"{spec.params / 1e6:.2f} M | {'on' if summary['sync_bn'] else 'off'} | "
                f"{'yes' if summary['spawn'] else 'torchrun only'} | {source} |"
            )
    return "\n".join(lines) + "\n"


def command_info(arguments: argparse.Namespace) -> int:
    """``zoo info FAMILY``: sizes, published parameter counts, input sizes, published weights with their licence,
    and DDP defaults."""
    from zoo_core.naming import resolve_model_name
    from zoo_core.plugin_manager import get_plugin_manager

    manager = get_plugin_manager()
    name = arguments.family
    if name not in manager.families:
        try:
            name, _ = resolve_model_name(name, manager.families)
        except ModelNameError:
            manager.family(name)  # raises UnknownFamilyError with close matches
    declaration = manager.family(name)
    summary = _family_summary(manager, name)
    sizes = {
        size: {
            "input_size": spec.input_size,
            "params": spec.params,
            "params_source": spec.params_source,
            "weights": ({"source": spec.weights.describe(), "url": spec.weights.download_url(), "file_name": spec.weights.file_name,
                         **spec.weights.model_dump(exclude_none=True)} if spec.weights else None),
        }
        for size, spec in declaration.sizes.items()
    }
    if arguments.json:
        print(json.dumps({**summary, "paper": declaration.paper, "sizes": sizes}, indent=2))
        return 0
    record = manager.family_record(name)
    origin = f"{record.distribution} {record.version}" if record.distribution else "registered at run time"
    print(f"{declaration.display} ({name}) — task: {declaration.task}")
    if declaration.paper:
        print(f"paper:     {declaration.paper}")
    print(f"plugin:    {record.name} ({record.module}, {origin})")
    print(f"spawn:     {'yes' if summary['spawn'] else 'no (torchrun only)'}")
    print(f"sync_bn:   {'on' if summary['sync_bn'] else 'off'} by default under DDP")
    if declaration.channels_last:
        print("memory:    channels-last on a CPU (training and predict)")
    if declaration.published_num_classes:
        print(f"params at: {declaration.published_num_classes} classes (tolerance {declaration.param_tolerance:.2%})")
    print()
    rows = [
        [size, _format_image_size(spec["input_size"]), _format_count(spec["params"]), spec["params_source"]]
        for size, spec in sizes.items()
    ]
    _print_table(rows, ["SIZE", "INPUT", "PARAMS", "SOURCE"])
    print()
    published = [[size, spec["weights"]["file_name"], spec["weights"]["licence"], spec["weights"]["source"]]
                 for size, spec in sizes.items() if spec["weights"]]
    unpublished = [size for size, spec in sizes.items() if not spec["weights"]]
    if published:  # LibreYOLO(<file>) or LibreYOLO("<family>-<size>", pretrained=True) downloads them (docs/weights.md)
        _print_table(published, ["SIZE", "WEIGHTS", "LICENCE", "FROM"])
    if unpublished:
        print(f"no published weights: {', '.join(unpublished)} (train from scratch, or load a file of your own)")
    return 0


def command_convert_dota(arguments: argparse.Namespace) -> int:
    """``zoo convert-dota SOURCE TARGET``: a DOTA folder written as a YOLO OBB dataset (``zoo_core/data/obb_format.py``)."""
    from zoo_core.data.obb_format import convert_dota

    names = [name.strip() for name in arguments.names.split(",") if name.strip()] if arguments.names else None
    done = convert_dota(arguments.source, arguments.target, names=names, skip_difficult=arguments.skip_difficult)
    counts = ", ".join(f"{split}: {done.images[split]} images, {done.objects[split]} objects" for split in done.images)
    print(f"{done.yaml_path} ({len(done.names)} classes; {counts}); train with: zoo train <model> data={done.yaml_path}")
    return 0


def command_plugins(arguments: argparse.Namespace) -> int:
    """``zoo plugins``: every loaded plugin with its distribution, version and families."""
    from zoo_core.plugin_manager import get_plugin_manager

    manager = get_plugin_manager()
    records = [
        {
            "plugin": record.name,
            "module": record.module,
            "distribution": record.distribution,
            "version": record.version,
            "families": manager.families_of(record.name),
        }
        for record in manager.plugin_records()
    ]
    blocked = manager.blocked_plugins()  # what each block kept out, as it happened (case-insensitive names)
    if arguments.json:
        print(json.dumps(records, indent=2))
        return 0
    rows = [
        [
            item["plugin"],
            item["distribution"] or "(run time)",
            item["version"] or "",
            ", ".join(item["families"]) or "(none: hooks only)",
        ]
        for item in records
    ]
    _print_table(rows, ["PLUGIN", "DISTRIBUTION", "VERSION", "FAMILIES"])
    if blocked:
        print(f"\nblocks asked for: {', '.join(manager.block_requests)} (names compare case-insensitively)")
        for name, stopped in blocked.items():
            print(f"blocked: {name}: not imported: {'; '.join(stopped)}" if stopped
                  else f"blocked: {name}: no installed plugin or family has this name, so it blocked nothing")
    return 0


def parse_key_values(words: Sequence[str]) -> dict[str, Any]:
    """``key=value`` words as typed arguments (values read as YAML scalars: ``0.01``, ``true``, ``[0, 1]``).

    ``TrainConfigError`` names the word (its key) that is not ``key=value``, or whose value YAML cannot
    read or build: bad syntax, ``!!float abc``, a date such as ``2020-13-45`` behind an explicit tag,
    nesting or aliases past the bounds of ``load_bounded_yaml``. Dates are read as text (``name=2024-05-01``
    is a run name, not a ``datetime.date``).
    """
    from zoo_core.data.dataset_yaml import DatesAsText, load_bounded_yaml
    from zoo_core.errors import excerpt

    arguments: dict[str, Any] = {}
    for word in words:
        key, separator, value = word.partition("=")
        if not separator or not key.strip():
            raise TrainConfigError(f"{excerpt(word)} is not key=value (e.g. lr0=0.001 mosaic=0)")
        where = f"{key.strip()}={value}" if len(word) <= 80 else f"{key.strip()}={value[:60]}..."
        arguments[key.strip().replace("-", "_")] = (
            load_bounded_yaml(value, where, TrainConfigError, loader=DatesAsText.loader()) if value else ""
        )
    return arguments


def _image_size_argument(text: str) -> int | tuple[int, int]:
    """``--imgsz``: ``640`` (a square) or ``512,1024`` (height,width; also ``512x1024``)."""
    parts = text.lower().replace("x", ",").split(",")
    try:
        sides = [int(part) for part in parts]
    except ValueError:
        sides = []
    if len(sides) not in (1, 2):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give 640 (square) or 512,1024 (height,width)")
    return sides[0] if len(sides) == 1 else (sides[0], sides[1])


def _model(name: str) -> Any:
    from zoo_core.facade import LibreYOLO

    return LibreYOLO(name)


class _TrainHelpAction(argparse.Action):
    """``zoo train --help``: the flags, then every training argument grouped, with its default and one line.

    The list is built only when asked for, so other commands never import the training configuration.
    """

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, default: Any = argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from zoo_core.engine.config import argument_groups

        lines = [parser.format_help().rstrip(), "", "training arguments (key=value or --key value), with their defaults:"]
        for group, arguments in argument_groups().items():
            lines += ["", f"  {group}:"]
            width = max(len(name) for name, _, _ in arguments)
            shown = ["required" if default == "(required)" else repr(default) for _, default, _ in arguments]
            column = min(max(len(text) for text in shown), 14)
            for (name, _, description), default_text in zip(arguments, shown):
                lines.append(f"    {name:<{width}}  {default_text:<{column}}  {description}".rstrip())
        print("\n".join(lines))
        parser.exit()


# The model commands take every argument as ``--key value`` or ``key=value`` (Ultralytics' grammar),
# including ``model=``, ``data=`` and ``source=``; these flags exist for the common ones.
_FLAG_KEYS = {
    "train": ("data", "epochs", "batch", "imgsz", "device", "workers", "project", "name", "seed", "resume"),
    "val": ("data", "batch", "imgsz", "device", "split", "workers", "conf", "iou"),
    "predict": ("conf", "iou", "imgsz", "device", "max_det", "save", "project", "name"),
    "track": ("tracker", "conf", "iou", "imgsz", "device", "max_det", "save", "project", "name"),
    "export": ("format", "output"),
    "benchmark": ("data", "imgsz", "device", "batch"),
}
_POSITIONAL_KEYS = {"train": ("model",), "val": ("model",), "predict": ("model", "source"), "track": ("model", "source"),
                    "export": ("model",), "benchmark": ("model",)}


def _looks_like_key_value(word: str) -> bool:
    key, separator, _ = word.partition("=")
    return bool(separator) and key.replace("-", "_").isidentifier()


def command_settings(arguments: argparse.Namespace, require_model: bool = True) -> dict[str, Any]:
    """Every argument of a model command, from its flags, positional words and ``key=value`` words.

    A key given twice with two values is a ``TrainConfigError`` naming it; so is a missing model,
    unless ``require_model`` is False (``zoo train resume=...`` finds it in the checkpoint).
    """
    command = arguments.command
    words = [*arguments.words, *getattr(arguments, "extra", [])]
    resume_flag = getattr(arguments, "resume", None)
    if isinstance(resume_flag, str) and _looks_like_key_value(resume_flag):
        # `zoo train --resume epochs=3`: argparse gave the flag the next word, which is an argument of its own.
        words.append(resume_flag)
        arguments.resume = True
    pairs = [word for word in words if _looks_like_key_value(word)]
    plain = [word for word in words if not _looks_like_key_value(word)]
    settings = parse_key_values(pairs)
    for key, word in zip(_POSITIONAL_KEYS[command], plain):
        if key in settings and settings[key] != word:
            raise TrainConfigError(f"{key} is given twice: {word!r} and {key}={settings[key]!r}")
        settings[key] = word
    if len(plain) > len(_POSITIONAL_KEYS[command]):
        extra = plain[len(_POSITIONAL_KEYS[command]):]
        raise TrainConfigError(
            f"zoo {command} takes {' and '.join(_POSITIONAL_KEYS[command]).upper()} and then flags or key=value "
            f"arguments; {extra[0]!r} is neither (write it as key=value, e.g. lr0=0.001)"
        )
    for key in _FLAG_KEYS[command]:
        value = getattr(arguments, key, None)
        if value is None or value is False:
            continue
        if key in settings and settings[key] != value:
            raise TrainConfigError(f"{key} is given twice: --{key.replace('_', '-')} {value!r} and {key}={settings[key]!r}")
        settings[key] = value
    if "model" not in settings and require_model:
        raise TrainConfigError(f"zoo {command} needs a model: a name (yolo9-t) or a weights file, as MODEL or model=...")
    return settings


def _is_resume(value: Any) -> bool:
    return value is not None and value is not False and str(value).strip().lower() not in ("", "false", "no", "off", "0")


def _resume_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A resume as Ultralytics users type it: the model and the run's arguments come from the checkpoint.

    ``resume=PATH`` (or ``--resume PATH``) without a model resumes PATH; ``resume=true`` without a model
    the newest run under ``project`` (``runs``); with a model (``zoo train runs/.../last.pt resume=true``),
    the model's own run, as ``train(resume=True)`` does. ``data`` and the other arguments are the run's own.
    """
    from zoo_core.engine.resume import newest_checkpoint

    resume = settings["resume"]
    flag_true = resume is True or str(resume).strip().lower() in ("true", "yes", "on", "1")
    if "model" not in settings:
        settings["model"] = str(newest_checkpoint(settings.get("project")) if flag_true else resume)
    settings["resume"] = True if flag_true else str(resume)
    return settings


def command_train(arguments: argparse.Namespace) -> int:
    """``zoo train MODEL data=D [key=value ...]``: train and print the result and where it is."""
    settings = command_settings(arguments, require_model=False)
    resuming = _is_resume(settings.get("resume"))
    if resuming:
        settings = _resume_settings(settings)
    elif "model" not in settings:
        raise TrainConfigError("zoo train needs a model: a name (yolo9-t) or a weights file, as MODEL or model=... "
                               "(or resume=path/to/last.pt, or resume=true for the newest run)")
    from zoo_core.engine.launcher import prepare_workers

    # The workers' imports then run while this process imports the same and builds the model.
    prepare_workers(settings.get("device"), validates=settings.get("val", True) is not False)
    model = _model(settings.pop("model"))
    if "data" not in settings and not resuming:  # a resume trains on the run's own data
        raise TrainConfigError("zoo train needs data=...: 'shapes', a dataset YAML or a folder")
    result = model.train(**settings)
    metrics = "  ".join(f"{name} {value:.4f}" for name, value in result.metrics.items()) or "no validation"
    print(f"metrics: {metrics}")
    print(f"run directory: {result.run_dir}  (best: {result.best})")
    return 0


def command_val(arguments: argparse.Namespace) -> int:
    """``zoo val MODEL [data=D]``: validate (on the dataset the model was trained on, by default) and print the metrics."""
    settings = command_settings(arguments)
    model = _model(settings.pop("model"))
    metrics = model.val(**settings)
    print("  ".join(f"{name} {value:.4f}" for name, value in metrics.items()))
    if model.last_val_dir is not None:
        print(f"results written to {model.last_val_dir}")
    return 0


def command_predict(arguments: argparse.Namespace) -> int:
    """``zoo predict MODEL SOURCE [save=true]``: predict, print one line per image and where drawings went."""
    settings = command_settings(arguments)
    model = _model(settings.pop("model"))
    if "source" not in settings:
        raise TrainConfigError("zoo predict needs a SOURCE: an image, a folder, a glob or a video (or source=...)")
    settings.pop("stream", None)
    verbose = settings.pop("verbose", True) is not False  # verbose=false: no line per image, as Ultralytics
    drawn: set[str] = set()
    written: set[str] = set()  # labels/ or crops/ without drawings
    # Streamed: a video or a large folder is read, predicted and printed one image at a time.
    for result in model.predict(settings.pop("source"), stream=True, verbose=False, **settings):
        if verbose:
            print(result.summary())
        if getattr(result, "save_path", None):
            drawn.add(str(result.save_path.parent))
        elif getattr(result, "save_dir", None):
            written.add(str(result.save_dir))
    if drawn:
        print(f"drawn results written to {', '.join(sorted(drawn))}")
    if written:
        print(f"results written to {', '.join(sorted(written))}")
    return 0


def command_track(arguments: argparse.Namespace) -> int:
    """``zoo track MODEL SOURCE [tracker=botsort] [save=true]``: track, print one line per frame and where the video went."""
    settings = command_settings(arguments)
    model = _model(settings.pop("model"))
    if "source" not in settings:
        raise TrainConfigError("zoo track needs a SOURCE: a video, or a folder of frames in order (or source=...)")
    settings.pop("stream", None)
    verbose = settings.pop("verbose", True) is not False
    written: set[str] = set()
    for result in model.track(settings.pop("source"), stream=True, verbose=False, **settings):
        if verbose:
            ids = result.boxes.id.tolist() if result.boxes.id is not None else []
            print(f"{result.summary()}{'; ids ' + ' '.join(map(str, ids)) if ids else ''}")
        if getattr(result, "save_path", None):
            written.add(str(result.save_path))
    if written:
        print(f"tracked results written to {', '.join(sorted(written))}")
    return 0


def command_benchmark(arguments: argparse.Namespace) -> int:
    """``zoo benchmark MODEL data=D [imgsz=640] [device=cpu]``: PyTorch and each graph format, one table."""
    from zoo_core.model_benchmark import BENCHMARK_FORMATS, benchmark, format_table

    settings = command_settings(arguments)
    if "data" not in settings:
        raise TrainConfigError("zoo benchmark needs data=...: the dataset each format is validated on (e.g. data=shapes)")
    formats = settings.pop("formats", ",".join(BENCHMARK_FORMATS))
    formats = tuple(part.strip() for part in formats.split(",")) if isinstance(formats, str) else tuple(formats)
    rows = benchmark(settings.pop("model"), formats=formats, **settings)
    print(format_table(rows))
    return 1 if all(row.error for row in rows) else 0


def command_export(arguments: argparse.Namespace) -> int:
    """``zoo export MODEL format=F [output=PATH]``: write the model in another format and say where."""
    settings = command_settings(arguments)
    model = _model(settings.pop("model"))
    export_format = settings.pop("format", None)
    if export_format not in EXPORT_FORMATS:
        raise TrainConfigError(f"zoo export needs format=...: one of {', '.join(EXPORT_FORMATS)} (got {export_format!r})")
    written = model.export(format=export_format, path=settings.pop("output", None), **settings)
    print(f"exported {export_format}: {written}")
    return 0


def command_user_settings(arguments: argparse.Namespace) -> int:
    """``zoo settings`` (show), ``zoo settings key=value ...`` (set) and ``zoo settings reset`` (zoo_core/settings.py)."""
    from zoo_core.settings import ZooSettings, load_settings, reset_settings, settings_path, update_settings

    words = list(arguments.words)
    if words == ["reset"]:
        print(f"settings reset to the defaults: {reset_settings()}")
        words = []
    elif words:
        if "reset" in words:
            raise TrainConfigError("zoo settings reset takes no other word; reset first, then set keys with key=value")
        changes = parse_key_values(words)
        for key, value in changes.items():  # loggers=csv,tensorboard: a list typed the way --device lists are
            if key == "loggers" and isinstance(value, str):
                changes[key] = [name.strip() for name in value.split(",") if name.strip()]
        update_settings(changes)
    current = load_settings()
    if arguments.json:
        print(json.dumps({"path": str(settings_path()), **current.model_dump()}, indent=2))
        return 0
    print(f"settings file: {settings_path()}{'' if settings_path().is_file() else ' (absent: every setting is its default)'}")
    defaults = ZooSettings()
    for key, field in ZooSettings.model_fields.items():
        value = getattr(current, key)
        mark = "" if value == getattr(defaults, key) else "  (set)"
        print(f"  {key:<13} {json.dumps(value)}{mark}  # {field.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``zoo`` (the engine adds train/val/predict)."""
    # allow_abbrev=False on every parser: argparse would otherwise take `--epoch 3` as `--epochs 3`
    # silently; an abbreviation is then an unknown argument, answered with a did-you-mean (main()).
    parser = argparse.ArgumentParser(prog="zoo", description="A vision model zoo with a DDP training engine.", allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"zoo {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", allow_abbrev=False, help="list the families")
    listing.add_argument("--ddp-capable", action="store_true", help="only families that auto-spawn one process per device")
    listing.add_argument("--task", help="only families of this task (detect, classify, semantic, ...: every declared task)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.add_argument("--markdown", action="store_true", help="the Markdown table of docs/families.md")
    listing.set_defaults(handler=command_list)

    info = commands.add_parser("info", allow_abbrev=False, help="describe one family")
    info.add_argument("family", help="a family name (yolo9) or a model name (yolo9-t)")
    info.add_argument("--json", action="store_true")
    info.set_defaults(handler=command_info)

    dota = commands.add_parser("convert-dota", allow_abbrev=False, help="write a DOTA folder as a YOLO OBB dataset")
    dota.add_argument("source", help="the DOTA folder: train/ and val/, each with images/ and labelTxt/")
    dota.add_argument("target", help="a new (or empty) folder for the YOLO OBB dataset and its data.yaml")
    dota.add_argument("--names", help="the class order, comma-separated (default: every class seen, sorted)")
    dota.add_argument("--skip-difficult", action="store_true", help="leave out the objects DOTA marks difficult")
    dota.set_defaults(handler=command_convert_dota)

    plugins = commands.add_parser("plugins", allow_abbrev=False, help="list the loaded plugins")
    plugins.add_argument("--json", action="store_true")
    plugins.set_defaults(handler=command_plugins)

    training = commands.add_parser("train", allow_abbrev=False, add_help=False,
                                   help="train a model (several devices: one process each)")
    training.add_argument("-h", "--help", action=_TrainHelpAction, help="show this help, with every training argument")
    training.add_argument("words", nargs="*", metavar="MODEL|KEY=VALUE",
                          help="a model name (yolo9-t) or weights, then any training argument as key=value (lr0=0.001)")
    training.add_argument("--data", help="'shapes', a dataset YAML or a folder (or data=...)")
    training.add_argument("--epochs", type=int)
    training.add_argument("--batch", type=int, help="global batch over all devices; -1: autobatch")
    training.add_argument("--imgsz", type=_image_size_argument, help="640, or height,width: 512,1024")
    training.add_argument("--device", help="'0,1', 'cpu', 'cpu,cpu' (two CPU ranks), 'auto'")
    training.add_argument("--workers", type=int)
    training.add_argument("--project")
    training.add_argument("--name")
    training.add_argument("--seed", type=int)
    training.add_argument("--resume", nargs="?", const=True, default=None,
                          help="continue a run: its last.pt, or (alone) the model's newest run, or with no model the newest in runs/")
    training.set_defaults(handler=command_train)

    validation = commands.add_parser("val", allow_abbrev=False, help="validate a model on a dataset")
    validation.add_argument("words", nargs="*", metavar="MODEL|KEY=VALUE", help="a model (weights), then key=value arguments")
    validation.add_argument("--data", help="default: the dataset the model was trained on")
    validation.add_argument("--batch", type=int)
    validation.add_argument("--imgsz", type=_image_size_argument, help="640, or height,width: 512,1024")
    validation.add_argument("--device")
    validation.add_argument("--split", help="val (default) or test")
    validation.add_argument("--workers", type=int)
    validation.add_argument("--conf", type=float, help="detection: confidence threshold (default 0.001)")
    validation.add_argument("--iou", type=float, help="detection: NMS IoU threshold (default 0.7)")
    validation.set_defaults(handler=command_val)

    prediction = commands.add_parser("predict", allow_abbrev=False, help="predict on images and optionally save drawn results")
    prediction.add_argument("words", nargs="*", metavar="MODEL SOURCE|KEY=VALUE",
                            help="a model, an image/folder/glob/video, then key=value arguments")
    prediction.add_argument("--conf", type=float)
    prediction.add_argument("--iou", type=float)
    prediction.add_argument("--imgsz", type=_image_size_argument, help="640, or height,width: 512,1024")
    prediction.add_argument("--device")
    prediction.add_argument("--max-det", type=int, dest="max_det")
    prediction.add_argument("--save", action="store_true", help="write drawn predictions into the run directory")
    prediction.add_argument("--project")
    prediction.add_argument("--name")
    prediction.set_defaults(handler=command_predict)

    tracking = commands.add_parser("track", allow_abbrev=False,
                                   help="track objects through a video with ByteTrack or BoT-SORT; save=true writes it annotated")
    tracking.add_argument("words", nargs="*", metavar="MODEL SOURCE|KEY=VALUE",
                          help="a model, a video or folder of frames, then key=value arguments")
    tracking.add_argument("--tracker", help="bytetrack (default), botsort, or a tracker YAML")
    tracking.add_argument("--conf", type=float, help="detector threshold (default: the tracker's track_low_thresh)")
    tracking.add_argument("--iou", type=float)
    tracking.add_argument("--imgsz", type=_image_size_argument, help="640, or height,width: 512,1024")
    tracking.add_argument("--device")
    tracking.add_argument("--max-det", type=int, dest="max_det")
    tracking.add_argument("--save", action="store_true", help="write the annotated video (IDs and trails) into the run directory")
    tracking.add_argument("--project")
    tracking.add_argument("--name")
    tracking.set_defaults(handler=command_track)

    exporting = commands.add_parser("export", allow_abbrev=False, help=f"write a model in another format ({', '.join(EXPORT_FORMATS)})")
    exporting.add_argument("words", nargs="*", metavar="MODEL|KEY=VALUE", help="a model name or weights file")
    exporting.add_argument("--format", choices=EXPORT_FORMATS, help="libreyolo: a LibreYOLO 1.6 checkpoint; onnx, torchscript: the inference graph")
    exporting.add_argument("--output", help="the file to write (default: beside the weights, or in the current folder)")
    exporting.set_defaults(handler=command_export)

    benchmarking = commands.add_parser("benchmark", allow_abbrev=False,
                                       help="file size, accuracy and speed of a model in PyTorch, ONNX and TorchScript")
    benchmarking.add_argument("words", nargs="*", metavar="MODEL|KEY=VALUE", help="a model name or weights file, then data=...")
    benchmarking.add_argument("--data", help="the dataset each format is validated on")
    benchmarking.add_argument("--imgsz", type=_image_size_argument, help="640, or height,width: 512,1024")
    benchmarking.add_argument("--device")
    benchmarking.add_argument("--batch", type=int, help="images per timed forward pass (default 1)")
    benchmarking.set_defaults(handler=command_benchmark)

    user_settings = commands.add_parser("settings", allow_abbrev=False,
                                        help="show or change the settings file (runs, weights and datasets folders, default loggers)")
    user_settings.add_argument("words", nargs="*", metavar="KEY=VALUE|reset",
                               help="nothing: show; key=value: set (runs_dir=/data/runs loggers=csv,tensorboard); reset: the defaults")
    user_settings.add_argument("--json", action="store_true", help="machine-readable output")
    user_settings.set_defaults(handler=command_user_settings)
    return parser


def _flag_suggestion(parser: argparse.ArgumentParser, command: str, flags: list[str]) -> str:
    """`` (did you mean --epochs?)`` for the first unknown flag close to one of ``command``'s flags, else ``""``."""
    import difflib

    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    known = [option for action in commands.choices[command]._actions for option in action.option_strings
             if option.startswith("--")]
    for flag in flags:
        typed = flag.partition("=")[0]
        # An abbreviation (what argparse used to expand) first, then a near spelling.
        close = [option for option in known if option.startswith(typed)][:1] or difflib.get_close_matches(typed, known, n=1, cutoff=0.6)
        if close:
            return f" (did you mean {close[0]}?)"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zoo``; an error prints one ``zoo: error:`` line (``ZOO_DEBUG=1``: the traceback too)."""
    parser = build_parser()
    # key=value words may sit anywhere among the flags; argparse leaves the ones after a flag over.
    arguments, extra = parser.parse_known_args(argv)
    flags = [word for word in extra if word.startswith("-")]
    if flags or (extra and not hasattr(arguments, "words")):
        parser.error(f"unrecognized arguments: {' '.join(flags or extra)}{_flag_suggestion(parser, arguments.command, flags)}")
    arguments.extra = extra  # words after a flag: command_settings sorts them
    try:
        return int(arguments.handler(arguments) or 0)
    except BrokenPipeError:  # `zoo list | head -3`: the reader left; end quietly, like other commands do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (ZooError, UnknownFamilyError) as error:
        print(f"zoo: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zoo: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - one line for the user; ZOO_DEBUG=1 shows the traceback
        if os.environ.get("ZOO_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off"):
            raise
        print(f"zoo: error: {type(error).__name__}: {error} (set ZOO_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
