"""What a recipe's models (or one model file) take and give, and the memory they need.

Each model is loaded once on the calling thread through the recipe's backend, described,
probed as `init()` probes it (zeros at one or two batch sizes: the shapes its outputs really
have, beside the declared ones), and released; nothing else starts, so the tables are shown
even for a model that `init()` would refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from inferchain.backends.factory import make_backend
from inferchain.config import MODEL_SUFFIXES, PKG, Recipe, load_recipe, package_file
from inferchain.errors import ConfigError
from inferchain.memory import MemoryPlan
from inferchain.output_rows import OutputProbe, probe_session, real_shapes
from inferchain.registry import describe
from inferchain.tensors import ModelInfo
from inferchain.tools.table import megabytes, render


@attrs.frozen
class ModelReport:
    """One model: its IO description and its row of the memory budget table."""

    info: ModelInfo
    path: str
    memory: MemoryPlan
    probed: OutputProbe | None = None  # the outputs' real shapes (None: not probed)
    problems: tuple[str, ...] = ()  # what init() would refuse or warn of in them
    settings: tuple[tuple[str, str], ...] = ()  # how the runtime runs it (threads, streams, ...)


def recipe_for(target: str | Path) -> Recipe:
    """A recipe (folder, YAML file or pkg:// path to either) as it is; a bare `.onnx` / `.om`
    model file (or pkg:// path to one) as a one-model recipe with the defaults (see
    `docs/recipes.md`)."""
    path = model_file(target)
    if path is None:
        return load_recipe(target)
    model = {"name": path.stem, "path": str(path.resolve())}
    backend = MODEL_SUFFIXES[path.suffix.lower()]
    return Recipe.from_dict({"name": path.stem, "backend": backend, "models": [model]}, "", path)


def model_file(target: str | Path) -> Path | None:
    """The model file `target` names (a path or pkg://), or None when it is not one."""
    text = str(target)
    if Path(text).suffix.lower() not in MODEL_SUFFIXES:
        return None
    path = package_file(text, text) if text.startswith(PKG) else Path(target)
    if path.is_dir():
        return None
    if not path.is_file():
        raise ConfigError(f"{text}: model file not found")
    return path


def describe_recipe(recipe: Recipe, *, acl_module: object | None = None) -> list[ModelReport]:
    """Load each model once, describe it and plan its memory, then release it."""
    backend = make_backend(recipe, acl_module=acl_module)
    reports = []
    try:
        for model in recipe.models:
            session = backend.load(model, recipe.device)
            try:
                info, shapes, memory = describe(model, session)
                keys = shapes.warm_keys() if model.max_batch_size > 0 else []
                probed: OutputProbe | None = None
                problems: tuple[str, ...] = ()
                fixed = session.max_batch_size
                rows = model.batch_rows if fixed is None else min(model.batch_rows, fixed)
                refused = memory.problem()  # what init() refuses before it allocates
                if refused is not None:
                    problems = (refused,)
                elif keys and not shapes.layout.unbatched:  # zeros are values it takes
                    padded = model.pads_to(fixed)
                    probed, verdict = probe_session(
                        model.name, session, shapes.layout, rows, keys[0], padded=padded
                    )
                    problems = verdict.errors + verdict.warnings
                if rows < model.batch_rows:  # what init() refuses before it probes
                    problems = (_fixed_batch(model.name, model.max_batch_size, rows), *problems)
                settings = tuple(session.settings.items())
            finally:
                session.close()
            reports.append(ModelReport(info, model.path, memory, probed, problems, settings))
    finally:
        backend.close()
    return reports


def _fixed_batch(model: str, asked: int, fixed: int) -> str:
    return (
        f"model {model!r}: max_batch_size {asked} exceeds the {fixed} its fixed batch dim "
        f"accepts (probed at {fixed}): set max_batch_size: {fixed} (and more `instances` for "
        "throughput), or re-export the model with a dynamic batch dim"
    )


def format_io(reports: Sequence[ModelReport]) -> str:
    """One row per input and output: model, kind, name, dtype, declared shape (? = dynamic)
    and, for an output, its real shape per probed batch size ("rows: shape")."""
    rows: list[list[object]] = []
    for r in reports:
        real = real_shapes(r.probed, len(r.info.outputs))
        for kind, descs in (("input", r.info.inputs), ("output", r.info.outputs)):
            for i, t in enumerate(descs):
                shape = "[" + ", ".join("?" if d is None else str(d) for d in t.shape) + "]"
                seen = real.get(i, "-") if kind == "output" else ""
                rows.append([r.info.name, kind, t.name, t.dtype.name, shape, seen])
    return render(["model", "io", "name", "dtype", "declared shape", "real shape"], rows)


def format_memory(reports: Sequence[ModelReport]) -> str:
    """The memory budget table, in MiB; `fits` is what `init()` checks."""
    rows: list[list[object]] = []
    for r in reports:
        m = r.memory
        fits = "NO" if m.problem() is not None else "n/a" if m.budget_bytes is None else "yes"
        buffers = megabytes(m.buffer_bytes)
        rows.append(
            [
                m.model,
                megabytes(m.model_bytes),
                f"{buffers:.2f}+dyn" if m.dynamic and buffers is not None else buffers,
                m.max_batch,
                m.instances,
                m.streams,
                megabytes(m.static_bytes),
                megabytes(m.budget_bytes),
                fits,
            ]
        )
    headers = ["model", "file MB", "buffers MB", "max batch", "instances", "streams", "static MB"]
    return render([*headers, "budget MB", "fits"], rows)


def format_reports(reports: Sequence[ModelReport]) -> str:
    """Both tables, and each model's file and metadata keys."""
    lines = [format_io(reports)]
    lines.extend(f"! {p}" for r in reports for p in r.problems)
    lines.extend(["", format_memory(reports), ""])
    for r in reports:
        keys = ", ".join(sorted(r.info.metadata)) or "none"
        runs = "; runs with " + ", ".join(f"{k} {v}" for k, v in r.settings) if r.settings else ""
        lines.append(f"{r.info.name}: {r.path} (metadata: {keys}{runs})")
    lines.append("MB = MiB; buffers = input + output bytes for the max batch, one stream of one")
    lines.append("instance, which is also what each extra stream costs (+dyn: dims known only at")
    lines.append("run time are not counted); static = (file + buffers x streams) x instances,")
    lines.append("plus a stateful model's state lanes, which init() refuses when it exceeds")
    lines.append("memory_budget_mb or this machine's memory")
    return "\n".join(lines)
