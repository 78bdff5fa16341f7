"""The ``zoo`` command line.

``list``, ``info`` and ``plugins`` answer from declarations and hooks only: they never import
torch or an architecture module, so they stay fast. ``train``, ``val`` and ``predict`` import
the engine when they run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from zoo_core import __version__
from zoo_core.errors import ModelNameError, UnknownFamilyError, ZooError
from zoo_core.registry import TASKS

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zoo``; errors that zoo raises on purpose print one message and exit with status 2."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    try:
        return int(arguments.handler(arguments) or 0)
    except (ZooError, UnknownFamilyError) as error:
        print(f"zoo: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
