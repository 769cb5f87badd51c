"""The `inferchain` command line. Each subcommand lives in `inferchain/commands/<name>.py`.

Exit status 0 on success; on bad input a one-line error and status 2 (a traceback only with
`--debug`). This is the one place that configures logging.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

import structlog

from inferchain.errors import InferchainError

#: Subcommand modules under inferchain/commands/, in the order `--help` lists them.
COMMANDS = ("run", "bench", "info", "doctor", "compare")


def _stderr_logger(*args: object) -> structlog.PrintLogger:
    """A logger on whatever `sys.stderr` is at the time (it may be replaced, e.g. in tests)."""
    return structlog.PrintLogger(sys.stderr)


def configure_logging(level: str, fmt: str) -> None:
    """structlog to stderr: console lines on a TTY, JSON otherwise (or as asked)."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferchain", description=__doc__)
    parser.add_argument("--log-level", default="warning", help="debug, info, warning, error")
    parser.add_argument("--log-format", default="auto", choices=("auto", "console", "json"))
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"inferchain.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        return int(args.func(args))
    except InferchainError as e:
        if args.debug:
            raise
        print(f"inferchain: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
