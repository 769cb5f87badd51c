"""`inferchain info RECIPE|MODEL_FILE`: inputs, outputs and the memory budget table."""

from __future__ import annotations

import argparse
import json
from typing import Any

from inferchain.cli.options import add_command
from inferchain.tools.info import describe_recipe, format_reports, recipe_for


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    info = add_command(
        sub, parents, "info", cmd_info, help="a recipe's or a model file's IO and memory table"
    )
    info.add_argument(
        "target", help="recipe folder, its YAML file, or a .onnx / .om model (paths or pkg://)"
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of tables")


def cmd_info(args: argparse.Namespace) -> int:
    reports = describe_recipe(recipe_for(args.target))
    if args.json:
        data = [
            {
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
            for r in reports
        ]
        print(json.dumps(data, indent=2))
    else:
        print(format_reports(reports))
    return 0
