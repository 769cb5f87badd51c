"""`inferchain run RECIPE`: the recipe's pipeline over its inputs, one line per item."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from inferchain.config import load_recipe
from inferchain.errors import InferchainError
from inferchain.offline import OfflineInference
from inferchain.progress import Progress


def register(sub: Any) -> None:
    run = sub.add_parser("run", help="run a recipe's pipeline over its inputs")
    run.add_argument("recipe", help="recipe folder or its YAML file")
    run.add_argument("--input", action="append", type=Path, help="file or folder (repeatable)")
    run.add_argument("--output", type=Path, help="output folder (default out/<recipe name>)")
    run.add_argument("--limit", type=int, default=None, help="at most N items")
    run.add_argument("--ray", action="store_true", help="on Ray Data: RAY_ADDRESS or a local Ray")
    run.add_argument("--concurrency", type=int, default=1, help="with --ray: actors (default 1)")
    run.set_defaults(func=cmd_run)


def _inputs(paths: list[Path], oi: OfflineInference) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(oi.pipeline.input_files(p))
        elif p.is_file():
            files.append(p)
        else:
            raise InferchainError(f"--input {p}: no such file or folder")
    return files


def cmd_run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe)
    out_dir = Path(args.output or Path("out") / recipe.name)
    if args.ray:  # scale-out: the same recipe over a Ray dataset (docs/scale-out.md)
        from inferchain.integrations.ray import run_recipe

        level = getattr(args, "log_level", None)
        return run_recipe(recipe, args.input, out_dir, args.concurrency, args.limit, level)
    with OfflineInference(recipe) as oi:
        sources = args.input or ([recipe.root / recipe.inputs] if recipe.inputs else [])
        if not sources:
            raise InferchainError(f"{recipe.source}: no `inputs:` in the recipe; pass --input")
        files = _inputs(sources, oi)[: args.limit]
        pipeline = oi.pipeline
        out_dir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        failed = 0
        loaded: dict[Path, object] = {}  # items in flight, kept for `save`

        def load(f: Path) -> object:
            loaded[f] = pipeline.load(f)
            return loaded[f]

        progress = Progress(len(files), "run", summary=False)  # a bar on a TTY only
        with (out_dir / "results.jsonl").open("w", encoding="utf-8") as sink, progress:
            results = oi.run((load(f) for f in files), on_error="return")
            for source, result in zip(files, results, strict=True):
                if isinstance(result, Exception):
                    failed += 1
                    progress.print(f"{source.name}: ERROR {type(result).__name__}: {result}")
                    record = {"file": str(source), "error": f"{type(result).__name__}: {result}"}
                else:
                    progress.print(f"{source.name}: {pipeline.summary(result)}")
                    record = {"file": str(source), **pipeline.to_record(result)}
                    pipeline.save(source, loaded[source], result, out_dir)
                loaded.pop(source, None)
                progress.update()
                sink.write(json.dumps(record, ensure_ascii=False) + "\n")
        seconds = time.perf_counter() - started
    rate = len(files) / seconds if seconds else 0.0
    print(
        f"{len(files)} items, {failed} failed, {seconds:.2f}s ({rate:.1f} items/s); "
        f"results in {out_dir / 'results.jsonl'}"
    )
    return 1 if failed else 0
