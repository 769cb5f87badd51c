"""The `inferchain` command line: parsing, logging set-up and one-line errors.

One thin module per subcommand (`run`, `bench`, `info`, `doctor`, `compare`) parses its
arguments, calls a tool from `inferchain.tools` (or the library) and prints.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from inferchain.backends.factory import set_runtime_log_level
from inferchain.logs import configure_output

#: Subcommand modules of this package, in the order `--help` lists them.
COMMANDS = ("run", "bench", "info", "doctor", "compare")
LOG_LEVELS = ("debug", "info", "warning", "error")

DESCRIPTION = "Batch inference with recipes: many models in one process, batched per model."
EPILOG = (
    "Exit status: 0 success; 1 some items failed (run, bench), a check failed (doctor) or "
    "outputs differ beyond tolerance (compare); 2 bad input or an error (one line on stderr, "
    "a traceback with --debug); 130 interrupted; 141 the output's reader went away (a broken "
    "pipe: `inferchain info RECIPE | head`), quietly."
)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"inferchain: error: {message} (see {self.prog} --help)\n")


def _add_common(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options accepted before and after the subcommand (the subcommand's copies keep
    no default of their own, so they never reset what was given before it)."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=default("warning"),
        help="the least severe events shown on stderr (default warning)",
    )
    parser.add_argument(
        "--log-format",
        choices=("auto", "console", "json"),
        default=default("auto"),
        help="console on a terminal, JSON otherwise (default auto)",
    )
    parser.add_argument(
        "--debug", action="store_true", default=default(False), help="show tracebacks"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="inferchain", description=DESCRIPTION, epilog=EPILOG)
    _add_common(parser, defaults=True)
    common = Parser(add_help=False)
    _add_common(common, defaults=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"inferchain.cli.{name}").register(sub, [common])
    return parser


#: a writer whose reader went away (`inferchain info | head`): the status a shell shows for a
#: process that SIGPIPE ended, 128 + 13
BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 prints escaped
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    configure_output(args.log_level, args.log_format)
    set_runtime_log_level(args.log_level)
    try:
        status = int(args.func(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return status
    except BrokenPipeError:
        _stdout_to_devnull()
        return BROKEN_PIPE
    except KeyboardInterrupt:
        print("inferchain: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every error is one line; the traceback only when asked for
        if args.debug:
            raise
        print(f"inferchain: error: {describe(e)}", file=sys.stderr)
        return 2


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that the flush at exit finds no closed pipe to fail on
    (the quiet end a shell's tools make when their reader goes away)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind stdout (a test's capture)
        pass


def describe(error: BaseException) -> str:
    """One line for an error: the message of inferchain's and the OS's errors, the type and
    message of anything else."""
    from inferchain.errors import InferchainError, cut_message

    if isinstance(error, InferchainError):
        text = str(error)
    elif isinstance(error, OSError) and error.strerror:
        text = f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    else:
        text = f"{type(error).__name__}: {error} (--debug shows the traceback)"
    return cut_message(" ".join(text.split())) or type(error).__name__
