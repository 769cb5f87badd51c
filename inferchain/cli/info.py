"""`inferchain info RECIPE|MODEL_FILE [--input PATH]`: inputs, outputs and the memory budget
table; with `--input`, what the recipe's pipeline reads from those files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import attrs

from inferchain.cli.options import add_command
from inferchain.config import Recipe
from inferchain.errors import InferchainError
from inferchain.sources import sources_of
from inferchain.threads import planned
from inferchain.tools.info import ModelReport, describe_recipe, format_reports, recipe_for
from inferchain.tools.reading import describe_inputs


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    info = add_command(
        sub, parents, "info", cmd_info, help="a recipe's or a model file's IO and memory table"
    )
    info.add_argument(
        "target", help="recipe folder, its YAML file, or a .onnx / .om model (paths or pkg://)"
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of tables")
    info.add_argument(
        "--input",
        action="append",
        type=Path,
        metavar="PATH",
        help="also say what the recipe's pipeline reads from this file or folder (an image: "
        "its format and mode, and the shape, dtype and channel order given to the pipeline); "
        "repeatable",
    )


def cmd_info(args: argparse.Namespace) -> int:
    recipe, plan = planned(recipe_for(args.target))  # as OfflineInference would run it
    reports = describe_recipe(recipe)
    inputs = read_inputs(recipe, args.input) if args.input else None
    if args.json:
        data: Any = [_report_dict(r) for r in reports]
        if inputs is not None or plan is not None:
            data = {"models": data}
        if inputs is not None:
            data["inputs"] = inputs
        if plan is not None:
            data["thread_plan"] = attrs.asdict(plan)
        print(json.dumps(data, indent=2))
        return 0
    print(format_reports(reports))
    if plan is not None:
        print("\n" + "\n".join(plan.lines()))
    if inputs is not None:
        print("\ninputs, as the pipeline reads them:\n" + "\n".join(inputs))
    return 0


def read_inputs(recipe: Recipe, given: list[Path]) -> list[str]:
    """`describe_inputs` of the paths given, or one `!` line saying why they cannot be read
    (what `run` would refuse: said, not a crash)."""
    try:
        return describe_inputs(recipe, sources_of(recipe, given))
    except InferchainError as e:
        return [f"! not read: {' '.join(str(e).split())}"]


def _report_dict(r: ModelReport) -> dict[str, Any]:
    return {
        **r.info.to_dict(),
        "path": r.path,
        "memory": r.memory.to_dict(),
        "real_output_shapes": None
        if r.probed is None
        else {
            str(n): [list(s) for s in run]
            for n, run in zip(r.probed.batch_sizes, r.probed.shapes, strict=True)
        },
        "problems": list(r.problems),
    }
