"""The ``zoo`` command line.

``list``, ``info`` and ``plugins`` answer from declarations and hooks only: they never import
torch or an architecture module, so they stay fast. ``train``, ``val`` and ``predict`` import
the engine when they run; ``zoo train`` takes the main arguments as flags and any other training
argument as ``key=value`` (``zoo train yolo9-t --data shapes --device cpu,cpu lr0=0.001``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from zoo_core import __version__
from zoo_core.errors import ModelNameError, UnknownFamilyError, ZooError
from zoo_core.registry import TASKS

EXPORT_FORMATS = ("libreyolo",)

__all__ = ["main", "build_parser"]


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
        summaries = [summary for summary in summaries if summary["task"] == arguments.task]
    if arguments.ddp_capable:
        summaries = [summary for summary in summaries if summary["spawn"]]
    if arguments.json:
        print(json.dumps(summaries, indent=2))
        return 0
    rows = [
        [
            summary["family"],
            summary["task"],
            " ".join(summary["sizes"]),
            "yes" if summary["spawn"] else "torchrun only",
            "on" if summary["sync_bn"] else "off",
            summary["display"],
        ]
        for summary in summaries
    ]
    _print_table(rows, ["FAMILY", "TASK", "SIZES", "SPAWN", "SYNC_BN", "NAME"])
    return 0


def command_info(arguments: argparse.Namespace) -> int:
    """``zoo info FAMILY``: sizes, published parameter counts, input sizes and DDP defaults."""
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
            "weights": spec.weights.url if spec.weights else None,
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
    if declaration.published_num_classes:
        print(f"params at: {declaration.published_num_classes} classes (tolerance {declaration.param_tolerance:.0%})")
    print()
    rows = [
        [size, str(spec["input_size"]), _format_count(spec["params"]), spec["params_source"]]
        for size, spec in sizes.items()
    ]
    _print_table(rows, ["SIZE", "INPUT", "PARAMS", "SOURCE"])
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
    if manager.blocked_names:
        print(f"\nblocked: {', '.join(sorted(manager.blocked_names))}")
    return 0


def _parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``key=value`` words as typed arguments (values parsed as YAML scalars: 0.01, true, [0, 1])."""
    import yaml

    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise SystemExit(f"zoo: error: {pair!r} is not key=value (e.g. lr0=0.001 mosaic=0)")
        overrides[key.replace("-", "_")] = yaml.safe_load(value) if value else ""
    return overrides


def _model(name: str) -> Any:
    from zoo_core.facade import LibreYOLO

    return LibreYOLO(name)


def command_train(arguments: argparse.Namespace) -> int:
    """``zoo train MODEL --data D [--device ...] [key=value ...]``: train and print the result."""
    options = {
        key: value
        for key, value in {
            "data": arguments.data, "epochs": arguments.epochs, "batch": arguments.batch, "imgsz": arguments.imgsz,
            "device": arguments.device, "workers": arguments.workers, "project": arguments.project,
            "name": arguments.name, "seed": arguments.seed, "resume": arguments.resume or None,
        }.items()
        if value is not None
    }
    options.update(_parse_overrides(arguments.overrides))
    result = _model(arguments.model).train(**options)
    metrics = "  ".join(f"{name} {value:.4f}" for name, value in result.metrics.items()) or "no validation"
    print(f"metrics: {metrics}")
    print(f"run directory: {result.run_dir}  (best: {result.best})")
    return 0


def command_val(arguments: argparse.Namespace) -> int:
    """``zoo val MODEL --data D``: validate and print the metrics."""
    options = {"data": arguments.data, "batch": arguments.batch, "imgsz": arguments.imgsz, "device": arguments.device,
               "split": arguments.split, "workers": arguments.workers, "conf": arguments.conf, "iou": arguments.iou}
    metrics = _model(arguments.model).val(**{key: value for key, value in options.items() if value is not None})
    print("  ".join(f"{name} {value:.4f}" for name, value in metrics.items()))
    return 0


def command_predict(arguments: argparse.Namespace) -> int:
    """``zoo predict MODEL SOURCE [--save]``: predict and print one line per image."""
    options = {"conf": arguments.conf, "iou": arguments.iou, "imgsz": arguments.imgsz, "device": arguments.device,
               "save": arguments.save, "project": arguments.project, "name": arguments.name, "max_det": arguments.max_det}
    results = _model(arguments.model).predict(arguments.source, **{key: value for key, value in options.items() if value is not None})
    for result in results:
        print(result.summary())
    return 0


def command_export(arguments: argparse.Namespace) -> int:
    """``zoo export MODEL --format libreyolo [--output PATH]``: write the model in another format."""
    written = _model(arguments.model).export(format=arguments.format, path=arguments.output)
    print(f"exported {arguments.format}: {written}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``zoo`` (the engine adds train/val/predict)."""
    parser = argparse.ArgumentParser(prog="zoo", description="A vision model zoo with a DDP training engine.")
    parser.add_argument("--version", action="version", version=f"zoo {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="list the families")
    listing.add_argument("--ddp-capable", action="store_true", help="only families that auto-spawn one process per device")
    listing.add_argument("--task", choices=TASKS, help="only families of this task")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(handler=command_list)

    info = commands.add_parser("info", help="describe one family")
    info.add_argument("family", help="a family name (yolo9) or a model name (yolo9-t)")
    info.add_argument("--json", action="store_true")
    info.set_defaults(handler=command_info)

    plugins = commands.add_parser("plugins", help="list the loaded plugins")
    plugins.add_argument("--json", action="store_true")
    plugins.set_defaults(handler=command_plugins)

    training = commands.add_parser("train", help="train a model (several devices: one process each)")
    training.add_argument("model", help="a model name (yolo9-t) or weights (.safetensors/.pt)")
    training.add_argument("--data", required=True, help="'shapes', a dataset YAML or a folder")
    training.add_argument("--epochs", type=int)
    training.add_argument("--batch", type=int, help="global batch over all devices; -1: autobatch")
    training.add_argument("--imgsz", type=int)
    training.add_argument("--device", help="'0,1', 'cpu', 'cpu,cpu' (two CPU ranks), 'auto'")
    training.add_argument("--workers", type=int)
    training.add_argument("--project")
    training.add_argument("--name")
    training.add_argument("--seed", type=int)
    training.add_argument("--resume", nargs="?", const=True, default=None, help="continue a run (optionally: its last.pt)")
    training.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="any other training argument, e.g. lr0=0.001")
    training.set_defaults(handler=command_train)

    validation = commands.add_parser("val", help="validate a model on a dataset")
    validation.add_argument("model")
    validation.add_argument("--data", required=True)
    validation.add_argument("--batch", type=int)
    validation.add_argument("--imgsz", type=int)
    validation.add_argument("--device")
    validation.add_argument("--split", help="val (default) or test")
    validation.add_argument("--workers", type=int)
    validation.add_argument("--conf", type=float, help="detection: confidence threshold (default 0.001)")
    validation.add_argument("--iou", type=float, help="detection: NMS IoU threshold (default 0.7)")
    validation.set_defaults(handler=command_val)

    prediction = commands.add_parser("predict", help="predict on images and optionally save drawn results")
    prediction.add_argument("model")
    prediction.add_argument("source", help="an image file or a folder")
    prediction.add_argument("--conf", type=float)
    prediction.add_argument("--iou", type=float)
    prediction.add_argument("--imgsz", type=int)
    prediction.add_argument("--device")
    prediction.add_argument("--max-det", type=int, dest="max_det")
    prediction.add_argument("--save", action="store_true", help="write drawn predictions into the run directory")
    prediction.add_argument("--project")
    prediction.add_argument("--name")
    prediction.set_defaults(handler=command_predict)

    exporting = commands.add_parser("export", help="write a model in another format (libreyolo)")
    exporting.add_argument("model", help="a model name or weights file")
    exporting.add_argument("--format", required=True, choices=EXPORT_FORMATS, help="libreyolo: a LibreYOLO 1.6 checkpoint")
    exporting.add_argument("--output", help="the file to write (default: beside the weights, or in the current folder)")
    exporting.set_defaults(handler=command_export)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zoo``; errors that zoo raises on purpose print one message and exit with status 2."""
    parser = build_parser()
    # key=value training overrides may follow or precede the flags, so collect them wherever they are.
    arguments, extra = parser.parse_known_args(argv)
    leftovers = [word for word in extra if "=" not in word or word.startswith("-")]
    if arguments.command == "train" and leftovers and not leftovers[0].startswith("-"):
        parser.error(f"{leftovers[0]!r} is not a flag or key=value (training arguments look like lr0=0.001)")
    if leftovers or (extra and arguments.command != "train"):
        parser.error(f"unrecognized arguments: {' '.join(leftovers or extra)}")
    if extra:
        arguments.overrides = [*arguments.overrides, *extra]
    try:
        return int(arguments.handler(arguments) or 0)
    except (ZooError, UnknownFamilyError) as error:
        print(f"zoo: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
