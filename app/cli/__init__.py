"""The ``ourios`` command line (DESIGN.md §3).

::

    ourios serve [--config FILE]    load and validate the settings, then serve
    ourios config [--config FILE]   print the effective configuration as JSON, exit 0
    ourios wal inspect DIR          segments, offsets, sidecars, floor (read-only)
    ourios wal verify DIR|FILE      full CRC walk; the exit code says whether it is sound
    ourios wal verify --archive     verify this node's archived segments in the store
    ourios wal quarantine SEGMENT   move an unreadable segment aside, recording its loss
    ourios --version

Exit codes: 0 success; 2 a usage or configuration error (the ``ConfigError`` message
on stderr, no traceback); 70 a subcommand whose implementation could not be loaded;
otherwise what the subcommand returns — for ``serve``: 1 a start refused (one
``server.start_failed`` event names why), 75 stopped with acknowledged rows that only the
WAL holds (``server.stopped`` counts them; the next start publishes them), else 0.
``serve`` writes the effective configuration as its first event,
``config.effective`` with ``config: {...}`` (in the json log format; at debug level in the
console format, whose start-up summary is ``server.listening``), so tests and operators
can read back what the node runs with.

The modules: ``app.cli`` itself (the parser and ``serve``/``config``), ``wal`` (``ourios
wal inspect|verify|quarantine``) and ``__main__`` (``python -m app.cli``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import textwrap
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType

from app.base.config import SECTIONS, SETTINGS, ConfigError, Settings, load_settings
from app.base.malloc_arenas import bound_malloc_arenas, disable_huge_pages

__all__ = ["main", "run_serve", "settings_help"]

EXIT_USAGE = 2
#: EX_SOFTWARE from sysexits.h: the subcommand's code is missing or broken.
EXIT_UNAVAILABLE = 70

_WIDTH = 96


def main(argv: list[str] | None = None) -> int:
    """Run the ``ourios`` command; returns the process exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return handler(args)


def run_serve(settings: Settings, config_file: Path | None = None) -> int:
    """The body of ``ourios serve`` once the settings are valid (``config_file`` is
    handed to the worker processes, which load the same settings)."""
    from app.node.server import run_serve as serve

    return serve(settings, config_file)


def settings_help() -> str:
    """Every setting with its variable, YAML key, default and range, for ``--help``."""
    lines = [
        "settings (environment OURIOS_<SECTION>_<NAME> overrides the --config file's",
        "<section>: {<name>: value}, which overrides the default; see docs/CONFIG.md):",
    ]
    for section in SECTIONS:
        lines.append("")
        lines.append(f"{section}:")
        for row in SETTINGS:
            if row.section != section:
                continue
            lines.append(f"  {row.env_var}  ({row.yaml_key})")
            facts = f"default {row.default_display}; {row.allowed}"
            for text in (facts, row.doc):
                lines.extend(
                    textwrap.wrap(text, _WIDTH, initial_indent=" " * 6, subsequent_indent=" " * 6)
                )
    return "\n".join(lines)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ourios",
        description="OTLP log ingester: WAL before ack, Parquet to an object store.",
    )
    parser.add_argument("--version", action="version", version=f"ourios {_version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the ingester",
        description="Run the ingester: load and validate the settings, recover, serve.",
        epilog=settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_config_option(serve)
    serve.set_defaults(handler=_serve)

    config = commands.add_parser(
        "config",
        help="print the effective configuration",
        description="Load and validate the settings as serve would, print the effective "
        "configuration as one JSON object keyed by environment variable, and exit.",
    )
    _add_config_option(config)
    config.set_defaults(handler=_config)

    wal = commands.add_parser("wal", help="inspect, verify or quarantine a WAL")
    wal_commands = wal.add_subparsers(title="wal commands", metavar="WAL_COMMAND")
    inspect = wal_commands.add_parser(
        "inspect", help="list segments, offsets, sidecars and the floor (read-only)"
    )
    inspect.add_argument(
        "dir", metavar="DIR", type=Path, help="the WAL directory (or the data directory)"
    )
    inspect.set_defaults(handler=lambda args: _walcli("inspect", args.dir))
    verify = wal_commands.add_parser(
        "verify",
        help="walk every frame's CRC; non-zero exit if anything is unsound (read-only)",
        description="Verify a WAL directory, one segment file, or (--archive) this node's "
        "archived segments in the configured object store. Exit 0 clean, 1 a problem, 2 "
        "nothing to verify.",
    )
    verify.add_argument(
        "dir",
        metavar="DIR|FILE",
        type=Path,
        nargs="?",
        help="the WAL directory (or data directory), or one segment file",
    )
    verify.add_argument(
        "--archive",
        nargs="*",
        metavar="NAME",
        help="verify archived segments (all, or these names) in the store the settings name",
    )
    verify.add_argument("--node", help="whose archive (default: this node's server.node_id)")
    _add_config_option(verify)
    verify.set_defaults(handler=_verify)
    quarantine = wal_commands.add_parser(
        "quarantine",
        help="move an unreadable segment into quarantine/ with a record of its loss",
        description="Move SEGMENT (a file in the WAL directory of a stopped node) into "
        "quarantine/ beside it, with a record of the frames it held and which of them are "
        "lost, so the node can start. Refuses a segment that verifies clean unless --force.",
    )
    quarantine.add_argument("segment", metavar="SEGMENT", type=Path, help="the segment file")
    quarantine.add_argument(
        "--force", action="store_true", help="quarantine a segment that verifies clean"
    )
    quarantine.set_defaults(handler=_quarantine)
    wal.set_defaults(handler=lambda _args: _usage(wal))
    return parser


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help="optional YAML file of settings (the environment overrides it)",
    )


def _load(config_file: Path | None) -> Settings | None:
    try:
        return load_settings(config_file=config_file)
    except ConfigError as exc:
        print(f"ourios: configuration error: {exc}", file=sys.stderr)
        return None


def _serve(args: argparse.Namespace) -> int:
    # Before any thread or worker exists: part of the memory bound (DESIGN.md §5.12).
    bound_malloc_arenas()
    disable_huge_pages()
    settings = _load(args.config)
    if settings is None:
        return EXIT_USAGE
    return run_serve(settings, args.config)


def _config(args: argparse.Namespace) -> int:
    settings = _load(args.config)
    if settings is None:
        return EXIT_USAGE
    print(json.dumps(settings.effective()), flush=True)
    return 0


def _walcli(command: str, directory: Path) -> int:
    # Imported here so the rest of the CLI works whatever state app.cli.wal is in.
    try:
        module: ModuleType = importlib.import_module("app.cli.wal")
    except ImportError as exc:
        print(f"ourios: wal {command} is unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    run: Callable[..., int] | None = getattr(module, command, None)
    if run is None:
        print(
            f"ourios: wal {command} is unavailable: app.cli.wal has no {command}()", file=sys.stderr
        )
        return EXIT_UNAVAILABLE
    return run(directory, sys.stdout)


def _verify(args: argparse.Namespace) -> int:
    if args.archive is not None:
        if args.dir is not None:
            print("ourios wal verify: give DIR|FILE or --archive, not both", file=sys.stderr)
            return EXIT_USAGE
        module = _walcli_module("verify")
        if module is None:
            return EXIT_UNAVAILABLE
        run: Callable[..., int] = module.verify_archive
        return run(args.archive, sys.stdout, config_file=args.config, node=args.node)
    if args.dir is None:
        print("ourios wal verify: DIR|FILE or --archive is required", file=sys.stderr)
        return EXIT_USAGE
    return _walcli("verify", args.dir)


def _quarantine(args: argparse.Namespace) -> int:
    module = _walcli_module("quarantine")
    if module is None:
        return EXIT_UNAVAILABLE
    run: Callable[..., int] = module.quarantine
    return run(args.segment, sys.stdout, force=args.force)


def _walcli_module(command: str) -> ModuleType | None:
    try:
        return importlib.import_module("app.cli.wal")
    except ImportError as exc:
        print(f"ourios: wal {command} is unavailable: {exc}", file=sys.stderr)
        return None


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _version() -> str:
    try:
        return metadata.version("ourios")
    except metadata.PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
