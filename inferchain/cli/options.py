"""What the subcommand modules share: declaring a subcommand, and argument types."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

Command = Callable[[argparse.Namespace], int]  # a subcommand: parsed arguments -> exit status


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def add_command(
    sub: Any,
    parents: list[argparse.ArgumentParser],
    name: str,
    command: Command,
    *,
    help: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """The parser of subcommand `name` (with the common options of `parents`), which runs
    `command` on the parsed arguments."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, parents=parents, help=help, description=description
    )
    parser.set_defaults(func=command)
    return parser
