"""Precision references: a recipe's raw model outputs on its bundled inputs, kept in the repo.

Precision is checked in CI as a regression test. `tests/test_references.py` recomputes the
outputs of every recipe that has a file in `tests/references/` and compares them with
`diff_output` (the metrics of `inferchain compare`) within the tolerance stored in the file,
so a change that moves the numbers (pre-processing, a runtime upgrade, a backend change) fails
CI instead of slipping through. After an intended change, refresh and commit the files:

    python -m inferchain.testing.references --update              # every recipe with a file
    python -m inferchain.testing.references --update orientation  # one (or a new) recipe
    python -m inferchain.testing.references                       # check only, exit 1 on drift
    python -m inferchain.testing.references --inputs orientation  # its `reference:` .npz

`--inputs` writes the model inputs themselves (the pre-processed bundled inputs, stacked by
input name) to the file the recipe's model names as `reference:`, the inputs a lower
`precision:` is checked on at `init()`.

A recipe qualifies when it has one model and its pipeline has `preprocess(item)`: each input
file is loaded by the pipeline, pre-processed and mapped through the model (`oi.map`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import structlog
import yaml

from inferchain.config import load_recipe, recipe_file
from inferchain.errors import ConfigError, InferchainError, InvalidInput
from inferchain.offline import OfflineInference
from inferchain.tools.compare import OutputDiff, diff_output
from inferchain.tools.table import render

REPO = Path(__file__).resolve().parents[2]  # a source checkout (the files live in the repo)
RECIPES = REPO / "recipes"
REFERENCES = REPO / "tests" / "references"
RTOL = 1e-3  # default tolerance of a new file; an existing file keeps its own
ATOL = 1e-4  # (float32 outputs across CPUs, thread counts and OpenCV builds stay well inside)

Outputs = dict[str, dict[str, np.ndarray]]  # input file name -> output name -> array


@attrs.frozen(eq=False)
class Reference:
    """One recipe's committed outputs and the tolerance they are checked with."""

    recipe: str
    model: str
    rtol: float
    atol: float
    outputs: Outputs

    def to_json(self) -> str:
        files = {
            name: {
                k: {"dtype": v.dtype.name, "shape": list(v.shape), "data": v.ravel().tolist()}
                for k, v in outs.items()
            }
            for name, outs in sorted(self.outputs.items())
        }
        data = {
            "recipe": self.recipe,
            "model": self.model,
            "rtol": self.rtol,
            "atol": self.atol,
            "update": f"python -m inferchain.testing.references --update {self.recipe}",
            "outputs": files,
        }
        return json.dumps(data, indent=1) + "\n"

    @classmethod
    def from_file(cls, path: Path) -> Reference:
        if not path.is_file():
            raise ConfigError(f"{path}: no reference file (make it with --update)")
        data = json.loads(path.read_text(encoding="utf-8"))
        outputs = {
            name: {
                k: np.asarray(v["data"], v["dtype"]).reshape(v["shape"]) for k, v in outs.items()
            }
            for name, outs in data["outputs"].items()
        }
        return cls(data["recipe"], data["model"], data["rtol"], data["atol"], outputs)


@attrs.frozen
class Check:
    """The outcome of comparing fresh outputs with a reference."""

    diffs: tuple[tuple[str, OutputDiff], ...]  # (input file, diff) per output
    problems: tuple[str, ...]  # files or outputs missing on one side, shapes that differ

    @property
    def passed(self) -> bool:
        return not self.problems and all(d.passed for _, d in self.diffs)

    def format(self) -> str:
        rows = [
            [
                f,
                d.name_a,
                f"{d.max_abs:.2e}",
                f"{d.max_rel:.2e}",
                f"{d.mismatched}/{d.size}",
                "ok" if d.passed else "FAIL",
            ]
            for f, d in self.diffs
        ]
        table = render(["input", "output", "max abs", "max rel", "beyond tol", "result"], rows)
        return "\n".join([table, *self.problems])


def available(folder: Path = REFERENCES) -> list[str]:
    """The recipes that have a reference file in `folder`."""
    return sorted(p.stem for p in folder.glob("*.json"))


def compute(recipe_dir: Path, **overrides: Any) -> tuple[str, Outputs]:
    """(model name, raw outputs per input file) of a one-model recipe on its bundled inputs."""
    recipe = load_recipe(recipe_dir, **overrides)
    if len(recipe.models) != 1 or not recipe.inputs:
        raise ConfigError(f"{recipe.source}: references need one model and `inputs:`")
    model = recipe.models[0].name
    with OfflineInference(recipe) as oi:
        pipeline = oi.pipeline
        preprocess = getattr(pipeline, "preprocess", None)
        if not callable(preprocess):
            raise ConfigError(f"{recipe.source}: the pipeline has no preprocess(item)")
        files = pipeline.input_files(recipe.root / recipe.inputs)
        items = (preprocess(pipeline.load(f)) for f in files)
        results = list(oi.map(model, items))
    outputs = {
        f.name: {k: np.array(v, copy=True) for k, v in out.items()}
        for f, out in zip(files, results, strict=True)
    }
    return model, outputs


def reference_inputs(recipe_dir: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """(the file the recipe's one model names as `reference:`, which need not exist yet;
    the model's inputs on the bundled inputs: each file loaded and pre-processed by the
    pipeline, stacked by input name)."""
    source = recipe_file(recipe_dir)
    raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    entries = raw.get("models") or [{}]
    target = entries[0].get("reference")
    if len(entries) != 1 or not isinstance(target, str):
        raise ConfigError(f"{source}: reference inputs need one model with `reference:`")
    name = str(entries[0].get("name"))
    recipe = load_recipe(source, models={name: {"reference": None, "warmup": False}})
    if not recipe.inputs:
        raise ConfigError(f"{source}: reference inputs need the recipe's `inputs:`")
    with OfflineInference(recipe) as oi:
        pipeline = oi.pipeline
        files = pipeline.input_files(recipe.root / recipe.inputs)
        preprocess = getattr(pipeline, "preprocess", None)
        if not callable(preprocess):
            raise ConfigError(f"{recipe.source}: the pipeline has no preprocess(item)")
        items = [preprocess(pipeline.load(f)) for f in files]
        names = [t.name for t in oi.model_info(name).inputs]
    rows = [item if isinstance(item, dict) else {names[0]: item} for item in items]
    return recipe.root / target, {n: np.stack([r[n] for r in rows]) for n in names}


def write_inputs(name: str, recipes: Path = RECIPES) -> Path:
    """Write recipe `name`'s reference inputs to its `reference:` file."""
    path, arrays = reference_inputs(recipes / name)
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]
    return path


def check(reference: Reference, actual: Mapping[str, Mapping[str, np.ndarray]]) -> Check:
    """Every output of every input file of `reference` against `actual`, by name."""
    diffs: list[tuple[str, OutputDiff]] = []
    problems = [
        f"{f}: no reference (update the file)" for f in sorted(set(actual) - set(reference.outputs))
    ]
    for name, expected in sorted(reference.outputs.items()):
        got = actual.get(name)
        if got is None:
            problems.append(f"{name}: in the reference, not among the inputs")
            continue
        for i, (out, ref) in enumerate(expected.items()):
            if out not in got:
                problems.append(f"{name}: output {out!r} missing (has {', '.join(got)})")
                continue
            try:
                diff = diff_output(
                    i, out, out, ref, np.asarray(got[out]), rtol=reference.rtol, atol=reference.atol
                )
            except InvalidInput as e:
                problems.append(f"{name}: {e}")
                continue
            diffs.append((name, diff))
    return Check(tuple(diffs), tuple(problems))


def update(name: str, recipes: Path = RECIPES, folder: Path = REFERENCES) -> Path:
    """Recompute recipe `name`'s reference and write it (keeping an existing file's
    tolerance)."""
    path = folder / f"{name}.json"
    rtol, atol = RTOL, ATOL
    if path.is_file():
        old = Reference.from_file(path)
        rtol, atol = old.rtol, old.atol
    model, outputs = compute(recipes / name)
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(Reference(name, model, rtol, atol, outputs).to_json(), encoding="utf-8")
    return path


def verify(name: str, recipes: Path = RECIPES, folder: Path = REFERENCES) -> Check:
    """Recompute recipe `name`'s outputs and check them against its reference file."""
    reference = Reference.from_file(folder / f"{name}.json")
    _, outputs = compute(recipes / name)
    return check(reference, outputs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferchain.testing.references",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recipes", nargs="*", help="recipe names (default: every one with a file)")
    parser.add_argument("--update", action="store_true", help="rewrite the reference files")
    parser.add_argument(
        "--inputs", action="store_true", help="write the recipes' `reference:` input files"
    )
    parser.add_argument("--recipes-dir", type=Path, default=RECIPES)
    parser.add_argument("--references-dir", type=Path, default=REFERENCES)
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    names = args.recipes or available(args.references_dir)
    failed = 0
    for name in names:
        try:
            failed += _one(name, args)
        except InferchainError as e:
            print(f"{name}: error: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _one(name: str, args: argparse.Namespace) -> int:
    if args.inputs:
        print(f"{name}: wrote {write_inputs(name, args.recipes_dir)}")
        return 0
    if args.update:
        print(f"{name}: wrote {update(name, args.recipes_dir, args.references_dir)}")
        return 0
    result = verify(name, args.recipes_dir, args.references_dir)
    print(f"{name}: {'PASS' if result.passed else 'FAIL'}\n{result.format()}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
