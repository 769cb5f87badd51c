"""`inferchain doctor [RECIPE]`: can this machine run inferchain (and this recipe)?"""

from __future__ import annotations

import argparse
from typing import Any

from inferchain.cli.options import add_command
from inferchain.tools.doctor import diagnose, exit_status, format_checks


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    doctor = add_command(
        sub, parents, "doctor", cmd_doctor, help="check runtimes, providers, CANN, driver, NPUs"
    )
    doctor.add_argument("recipe", nargs="?", help="also check that this recipe can run here")
    doctor.add_argument("-v", "--verbose", action="store_true", help="show npu-smi's output")


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = diagnose(args.recipe)
    print(format_checks(checks, verbose=args.verbose))
    status = exit_status(checks)
    if status:
        print("\nthe recipe cannot run here (see FAIL above)")
    return status
