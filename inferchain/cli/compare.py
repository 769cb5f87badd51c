"""`inferchain compare MODEL_A MODEL_B`: a converted model's outputs against the original's;
`inferchain compare --precision P RECIPE`: a model at a lower precision against f32;
`inferchain compare --batch-invariance RECIPE`: a model's outputs at several batch sizes.

Exit status 0 when every output is within `--rtol/--atol`, 1 when one is not, 2 for bad
input (a missing file, inputs that do not fit the models).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from inferchain.cli.options import add_command, positive_int
from inferchain.config import PRECISIONS
from inferchain.errors import ConfigError
from inferchain.tools.compare import BACKENDS, DEFAULT_ATOL, DEFAULT_RTOL, compare_models
from inferchain.tools.feeds import DEFAULT_BATCH, DYNAMIC_DIM

FAKE_ACL_HELP = (
    "test aid, not for real checks: run acl models with inferchain.testing.fake_acl.FakeAcl "
    "(ONNX Runtime on the CPU, an .onnx file where pyACL takes an .om) instead of pyACL, "
    f"compiled for a static batch of --batch rows (default {DEFAULT_BATCH}) unless the ONNX "
    "batch dim is fixed"
)


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        parents,
        "compare",
        cmd_compare,
        help="precision check: run two models on the same inputs and compare their outputs",
        description=(
            "Run MODEL_A (the reference) and MODEL_B (model files, pkg:// paths or recipe "
            "folders) on the same inputs and compare each output "
            "by position: max abs/rel error, cosine similarity, elements beyond "
            "|B - A| <= atol + rtol * |A|. Exit 0 within tolerance, 1 beyond, 2 on bad input."
        ),
    )
    p.add_argument(
        "model_a",
        nargs="?",
        help="the reference: a model file (.onnx; .om with acl) or a recipe folder",
    )
    p.add_argument(
        "model_b", nargs="?", help="the model to check (e.g. its conversion), or a recipe"
    )
    p.add_argument(
        "--batch-invariance",
        metavar="RECIPE",
        help="instead of A against B: run the items RECIPE's pipeline gives each model (or "
        "--model; a stateful model: the rows of its step batches) at batch sizes 1, a middle "
        "one and the maximum, and shuffled; per output the largest difference from batches "
        "of 1 and the share of bit-identical items (default tolerance 0: bit-identical)",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="with --batch-invariance: run every model `deterministic: true` (each batch at "
        "its max batch, items at a shape of their own); it must pass then",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="with one RECIPE: its model (--model) at this precision against itself at f32, on "
        "--inputs, else the model's `reference:`, else random inputs; within the model's "
        "`tolerance:` (--rtol/--atol replace its elementwise part), the measures init() checks",
    )
    p.add_argument(
        "--input",
        action="append",
        type=Path,
        help="with --batch-invariance: input file or folder (default: the recipe's `inputs:`)",
    )
    p.add_argument(
        "--limit",
        type=positive_int,
        default=512,
        metavar="N",
        help="with --batch-invariance: the first N input items (default 512)",
    )
    p.add_argument(
        "--model", metavar="NAME", help="the model of a recipe with several (same name on both)"
    )
    p.add_argument(
        "--inputs",
        type=Path,
        metavar="NPZ",
        help="arrays by input name, with the batch dim (default: seeded random inputs within "
        f"MODEL_A's input description; dynamic dims other than the batch get {DYNAMIC_DIM})",
    )
    p.add_argument("--rtol", type=float, help=f"default {DEFAULT_RTOL:g}")
    p.add_argument("--atol", type=float, help=f"default {DEFAULT_ATOL:g}")
    for side in ("a", "b"):
        p.add_argument(
            f"--backend-{side}",
            choices=BACKENDS,
            help=f"backend of MODEL_{side.upper()} (default: acl for .om, else onnxruntime)",
        )
    p.add_argument(
        "--batch",
        type=int,
        help="rows of random inputs (default: the model's fixed batch, else "
        f"{DEFAULT_BATCH}); ignored with --inputs",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--device", type=int, default=0, help="device id for acl")
    p.add_argument("--fake-acl", action="store_true", help=FAKE_ACL_HELP)


def cmd_compare(args: argparse.Namespace) -> int:
    if args.batch_invariance is not None:
        return batch_invariance(args)
    if args.precision is not None:
        return precision(args)
    if args.model_a is None or args.model_b is None:
        raise ConfigError("compare takes MODEL_A MODEL_B, or --batch-invariance RECIPE")
    acl_module = None
    if args.fake_acl:
        from inferchain.testing.fake_acl import FakeAcl

        acl_module = FakeAcl(static_batch=args.batch or DEFAULT_BATCH)
    report = compare_models(
        args.model_a,
        args.model_b,
        args.inputs,
        rtol=_or(args.rtol, DEFAULT_RTOL),
        atol=_or(args.atol, DEFAULT_ATOL),
        backend_a=args.backend_a,
        backend_b=args.backend_b,
        batch=args.batch,
        seed=args.seed,
        device=args.device,
        acl_module=acl_module,
        model=args.model,
    )
    print(report.format())
    return 0 if report.passed else 1


def precision(args: argparse.Namespace) -> int:
    """`--precision P RECIPE`: the report `init()`'s check would refuse on, on given inputs."""
    from inferchain.tools.precision import compare_precision

    if args.model_a is None or args.model_b is not None:
        raise ConfigError("compare --precision takes one RECIPE")
    report = compare_precision(
        args.model_a,
        args.precision,
        args.inputs,
        model=args.model,
        backend_a=args.backend_a,
        backend_b=args.backend_b,
        rtol=args.rtol,
        atol=args.atol,
    )
    print(report.format())
    return 0 if report.passed else 1


def batch_invariance(args: argparse.Namespace) -> int:
    """`--batch-invariance RECIPE`: the recipe's pipeline over its inputs, recording what
    each model is given (items; the rows of a stateful model's step batches), then those
    again at several batch sizes."""
    from inferchain.tools.invariance import check_invariance

    items, apart = _recorded(args)
    rtol, atol = _or(args.rtol, 0.0), _or(args.atol, 0.0)
    report = check_invariance(
        args.batch_invariance, items, rtol=rtol, atol=atol, strict=args.deterministic,
        apart=apart,
    )  # fmt: skip
    print(report.format())
    return 0 if report.passed else 1


STEP_ROWS = 1024  # step rows kept per stateful model for the check


def _recorded(args: argparse.Namespace) -> tuple[dict[str, list[Any]], list[str]]:
    """What the recipe's pipeline gives each model over the inputs (`--model`: one), and
    the stateful models whose steppers keep their sequences apart by group."""
    import attrs

    from inferchain.backends.factory import make_backend
    from inferchain.cli.run_job import FileReader
    from inferchain.config import load_recipe
    from inferchain.driver import PipelineDriver
    from inferchain.offline import OfflineInference
    from inferchain.sources import input_files, input_items, sources_of
    from inferchain.tools.batch_rows import RecordingBackend
    from inferchain.tools.invariance import capture_items, capture_steppers, items_of, kept_apart

    recipe = load_recipe(args.batch_invariance)
    stateful = [m.name for m in recipe.models if m.state]
    one = tuple(attrs.evolve(m, streams=1) if m.state else m for m in recipe.models)
    recipe = attrs.evolve(recipe, models=one)  # their batches one at a time, as recorded
    backend = RecordingBackend(make_backend(recipe), stateful, STEP_ROWS)
    sources = sources_of(recipe, args.input)
    with OfflineInference(recipe, backend=backend) as oi:
        pipeline = oi.pipeline
        files = input_items(input_files(sources, pipeline), pipeline)[: args.limit]
        driver = PipelineDriver(FileReader(pipeline), on_error="return")
        with capture_items(oi) as items, capture_steppers(oi) as steppers:
            items_of(driver.run(enumerate(files)))
    items = {m: rows for m, rows in items.items() if m not in stateful} | backend.kept
    items = {m: items[m] for m in [m.name for m in recipe.models] if m in items}
    apart = kept_apart(steppers)
    if args.model is not None:
        recipe.model(args.model)  # ConfigError naming it when there is none
        return {args.model: items.get(args.model, [])}, apart
    return {m: rows for m, rows in items.items() if recipe.model(m).max_batch_size}, apart


def _or(value: float | None, default: float) -> float:
    """A tolerance flag's value, or its default where it was not given."""
    return default if value is None else value
