"""Scale-out on Ray Data: one OfflineInference per actor, the recipe's pipeline per batch.

A recipe that runs on one machine runs over a dataset on a Ray cluster without distribution
code of ours: Ray Data moves the blocks, places the actors, retries and back-pressures; this
module only adapts a recipe to `Dataset.map_batches`::

    from inferchain.integrations.ray import RecipePredictor, read_dataset

    ds = read_dataset(["recipes/orientation/samples"])          # one `path` row per file
    out = ds.map_batches(
        RecipePredictor,
        fn_constructor_kwargs={"recipe": "/abs/recipes/orientation", "on_error": "return"},
        compute=ray.data.ActorPoolStrategy(size=2),   # or concurrency=2 (Ray < 2.51)
        batch_size=64, batch_format="numpy",
    )

Ray is imported only when needed: `import inferchain.integrations.ray` works without it, and
what needs it raises `RayNotInstalled`, naming the `[ray]` extra. See docs/scale-out.md.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from inferchain.backends.factory import set_runtime_log_level
from inferchain.closing import Closing
from inferchain.config import Recipe, load_recipe
from inferchain.driver import PipelineDriver
from inferchain.errors import Closed, ConfigError, InvalidInput, MissingDependency
from inferchain.logs import configure_output, get_logger
from inferchain.offline import OfflineInference
from inferchain.pipeline import Pipeline, PipelineWrapper, Process
from inferchain.results import ResultsFile
from inferchain.resume import input_key

log = get_logger(__name__)

Batch = dict[str, np.ndarray]  # column name -> one value per row (Ray Data's "numpy" format)
PATH = "path"  # the column of file paths, as `read_dataset` makes it
ERROR = "error"  # with on_error="return": "<ErrorType>: <message>", None when the item succeeded
PASSTHROUGH = ("id", PATH)  # copied from the input batch to the output when present
OnError = Literal["raise", "return"]


class RayNotInstalled(MissingDependency):
    """Ray Data is not installed: `pip install 'inferchain[ray]'`."""


def require_ray() -> Any:
    """The `ray` module with `ray.data` loaded, or `RayNotInstalled` naming the extra."""
    try:
        import ray
        import ray.data  # loads the submodule: `ray` alone does not
    except ImportError as e:
        raise RayNotInstalled(
            f"the Ray integration needs Ray Data, which is not installed ({e}); "
            "install the [ray] extra: pip install 'inferchain[ray]'"
        ) from e
    return ray


class RecipePredictor(Closing):
    """A callable class for `Dataset.map_batches`: one OfflineInference per Ray actor.

    `__init__` loads the recipe and starts its OfflineInference (models loaded once per
    actor); each call runs one batch (a dict of numpy columns) through the recipe's pipeline
    and returns one output row per input row: the `to_record` fields of each result, an
    `error` column with `on_error="return"`, and the `passthrough` columns present in the
    batch. The items of a batch are, in this order of precedence:

    - `inputs` given: the named column (each row one item) or, for several names, a dict
      name -> value per row (a column per model input);
    - else every column not in `passthrough`, the same way;
    - else (only passthrough columns) the files named by the `path` column, each read with
      the recipe pipeline's `load` on the actor (the same decoding as `inferchain run`).

    The OfflineInference is closed by `close()`, by `with`, or when the predictor is
    garbage-collected (`__del__`): Ray Data drops its reference when the actor exits
    gracefully at the end of the dataset, so `__del__` runs then. An actor that is killed or
    crashes runs nothing; its threads die with its process.

    `log_level` (e.g. "warning") configures structlog and onnxruntime's own log in the
    actor's process, which is its own application; None leaves logging as it is.
    """

    def __init__(
        self,
        recipe: Recipe | str | Path,
        *,
        overrides: Mapping[str, Any] | None = None,
        inputs: str | Sequence[str] | None = None,
        passthrough: Sequence[str] = PASSTHROUGH,
        max_in_flight: int | None = None,
        on_error: OnError = "raise",
        log_level: str | None = None,
    ) -> None:
        if log_level is not None:
            configure_output(log_level)
            set_runtime_log_level(log_level)
        self.inputs = [inputs] if isinstance(inputs, str) else inputs
        self.passthrough = tuple(passthrough)
        self.max_in_flight = max_in_flight
        self.on_error: OnError = on_error
        self._oi: OfflineInference | None = None
        self._oi = OfflineInference(_recipe(recipe, overrides)).init()
        self._files = _FilePipeline(self._oi.pipeline)

    def __call__(self, batch: Mapping[str, np.ndarray]) -> Batch:
        """One batch through the recipe's pipeline: one output row per input row."""
        pipeline, items = self._items(batch)
        driver = PipelineDriver(pipeline, max_in_flight=self.max_in_flight, on_error=self.on_error)
        records = [self._record(pipeline, r) for r in driver.run(items)]
        kept = {name: batch[name] for name in self.passthrough if name in batch}
        return {**kept, **_columns(records)}

    def _items(self, batch: Mapping[str, np.ndarray]) -> tuple[Pipeline, list[Any]]:
        oi = self._running()
        names = self.inputs or [c for c in batch if c not in self.passthrough]
        if missing := [n for n in names if n not in batch]:
            raise InvalidInput(f"input column(s) {missing} not in the batch {sorted(batch)}")
        if len(names) == 1:
            return oi.pipeline, list(batch[names[0]])
        if names:
            rows = len(batch[names[0]])
            return oi.pipeline, [{n: batch[n][i] for n in names} for i in range(rows)]
        if PATH not in batch:
            raise InvalidInput(
                f"a batch with columns {sorted(batch)} has no input column: name one with "
                f"inputs=..., or give a {PATH!r} column of files"
            )
        return self._files, [str(p) for p in batch[PATH]]

    def _record(self, pipeline: Pipeline, result: Any) -> dict[str, Any]:
        if self.on_error == "raise":
            return pipeline.to_record(result)
        if isinstance(result, Exception):
            return {ERROR: f"{type(result).__name__}: {result}"}
        return {**pipeline.to_record(result), ERROR: None}

    def _running(self) -> OfflineInference:
        if self._oi is None:
            raise Closed("RecipePredictor is closed")
        return self._oi

    def close(self) -> None:
        """Close this actor's OfflineInference (drain, join its threads); idempotent."""
        oi, self._oi = getattr(self, "_oi", None), None
        if oi is not None:
            oi.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class _FilePipeline(PipelineWrapper):
    """Items are file paths: each is read with the recipe pipeline's `load`, then processed.

    Reading inside `process` makes an unreadable file fail only its own item.
    """

    def __init__(self, inner: Pipeline) -> None:
        super().__init__(inner)
        if inner.item_per_line:
            raise ConfigError(
                f"{inner.recipe.source}: its pipeline reads one item per line of a file, and "
                "on Ray Data an item is a file; run it without --ray"
            )

    def process(self, item: Any) -> Process:
        work = self.inner.process(self.inner.load(Path(item)))
        if isinstance(work, Generator):
            return (yield from work)
        return work

    def to_record(self, result: Any) -> dict[str, Any]:
        return self.inner.to_record(result)


def _recipe(recipe: Recipe | str | Path, overrides: Mapping[str, Any] | None) -> Recipe:
    if not isinstance(recipe, Recipe):
        return load_recipe(recipe, **(overrides or {}))
    if overrides:
        raise ConfigError("overrides need a recipe path, not a loaded Recipe")
    return recipe


def _columns(records: list[dict[str, Any]]) -> Batch:
    """Records -> columns: the union of their keys, None where a record lacks one."""
    names = dict.fromkeys(k for r in records for k in r)
    return {name: _column([r.get(name) for r in records]) for name in names}


def _column(values: list[Any]) -> np.ndarray:
    """A typed array for same-typed scalars; otherwise objects, left for Arrow to type."""
    kinds = {type(v) for v in values}
    if len(kinds) == 1 and kinds <= {bool, int, float, str}:
        return np.asarray(values)
    column = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        column[i] = v
    return column


# -- datasets ---------------------------------------------------------------------------------


def read_dataset(
    paths: Sequence[str | Path],
    *,
    list_folder: Callable[[Path], list[Path]] | None = None,
    limit: int | None = None,
    skip: Collection[str] = (),
) -> Any:
    """A Ray dataset of inputs, all of one kind:

    - `.parquet` files, or folders holding only `.parquet` files: one row per table row;
    - `.npy` files: one row per entry of the first axis, in a `data` column (+ `path`);
    - other files and folders: one row per file, a `path` column (absolute); a folder is
      listed by `list_folder` (default: its visible files, sorted), e.g. a pipeline's
      `input_files`. The files must be readable at that path on every node; those whose
      `inferchain.results.input_key` is in `skip` are left out (`--resume`).
    """
    ray = require_ray()
    kind = _kind([Path(p) for p in paths])
    strings = [str(Path(p).resolve()) for p in paths]
    if kind == "files":
        files = _files([Path(p) for p in paths], list_folder or _visible_files)
        if not files:
            raise ConfigError(f"{', '.join(map(str, paths))}: no input files")
        todo = [f for f in files if input_key(f) not in skip][:limit]
        return ray.data.from_items([{PATH: str(f.resolve())} for f in todo])
    if skip:
        raise ConfigError("--resume takes input files, not parquet or .npy datasets")
    if kind == "parquet":
        ds = ray.data.read_parquet(strings)
    else:
        ds = ray.data.read_numpy(strings, include_paths=True)
    return ds if limit is None else ds.limit(limit)


def _kind(paths: list[Path]) -> str:
    kinds = {_kind_of(p) for p in paths}
    if len(kinds) != 1:
        raise ConfigError(f"inputs must all be parquet, all .npy or all other files: {paths}")
    return kinds.pop()


def _kind_of(path: Path) -> str:
    if not path.exists():
        raise ConfigError(f"input {path}: no such file or folder")
    if path.is_dir():
        files = _visible_files(path)
        return "parquet" if files and all(f.suffix == ".parquet" for f in files) else "files"
    return {".parquet": "parquet", ".npy": "npy"}.get(path.suffix.lower(), "files")


def _visible_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _files(paths: list[Path], list_folder: Callable[[Path], list[Path]]) -> list[Path]:
    return [f for p in paths for f in (list_folder(p) if p.is_dir() else [p])]


def map_recipe(
    ds: Any,
    recipe: str | Path,
    *,
    concurrency: int = 1,
    batch_size: int | None = None,
    num_cpus: float | None = None,
    **predictor: Any,
) -> Any:
    """`ds.map_batches(RecipePredictor, ...)` with the recipe's defaults.

    `concurrency` actors, each with its own OfflineInference; `batch_size` rows per call
    (default 4 x the largest `max_batch_size`, so batches of several models can fill);
    `num_cpus` Ray CPUs reserved per actor (Ray's default 1; set it to the recipe's threads
    per actor so Ray packs actors by cores). Other keywords go to `RecipePredictor`.
    """
    path = Path(recipe).resolve()
    size = batch_size or 4 * max(m.max_batch_size or 1 for m in load_recipe(path).models)
    remote = {} if num_cpus is None else {"num_cpus": num_cpus}
    return ds.map_batches(
        RecipePredictor,
        fn_constructor_kwargs={"recipe": str(path), **predictor},
        compute=require_ray().data.ActorPoolStrategy(size=concurrency),
        batch_size=size,
        batch_format="numpy",
        **remote,
    )


def write_results(ds: Any, output: Path, results: ResultsFile | None = None) -> tuple[int, int]:
    """Write a results dataset; returns (rows, failed rows).

    `output` ending in `.parquet`: a folder of Parquet files written by the workers. Else
    `output/results.jsonl` (`results`, opened here: by default an earlier run's file is
    refused), streamed through the driver in input order and flushed line by line as
    `inferchain run` writes it (`file` = the `path` column; `error` only on failures).
    """
    if output.suffix == ".parquet":
        ds.write_parquet(str(output.resolve()))
        return _count_errors(require_ray().data.read_parquet(str(output.resolve())))
    ds.context.execution_options.preserve_order = True
    rows = failed = 0
    with results or ResultsFile(output) as sink:
        for table in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            for row in table.to_pylist():
                record = _jsonl_record(row)
                failed += ERROR in record
                rows += 1
                sink.write(record)
    return rows, failed


def _jsonl_record(row: dict[str, Any]) -> dict[str, Any]:
    head = {"key": input_key(row[PATH]), "file": row.pop(PATH)} if PATH in row else {}
    error = row.pop(ERROR, None)
    if error is not None:
        return {**head, ERROR: error}
    return {**head, **row}


def _count_errors(ds: Any) -> tuple[int, int]:
    rows = failed = 0
    for table in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        rows += table.num_rows
        if ERROR in table.column_names:
            failed += table.num_rows - table.column(ERROR).null_count
    return rows, failed


# -- `inferchain run RECIPE --ray` ------------------------------------------------------------


def connect(num_cpus: int | None = None) -> bool:
    """Join the cluster at `RAY_ADDRESS`, or start a local Ray with `num_cpus` (default: the
    CPUs this process may use); False if Ray was already up (then nothing is changed)."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        ray.init(num_cpus=num_cpus or len(os.sched_getaffinity(0)), include_dashboard=False)
    return True


def run_recipe(
    recipe: Recipe | str | Path,
    inputs: Sequence[Path] | None,
    output: Path,
    concurrency: int = 1,
    limit: int | None = None,
    log_level: str | None = None,
    results: ResultsFile | None = None,
) -> int:
    """`inferchain run RECIPE --ray`: the recipe over `inputs` (default: the recipe's
    `inputs:`) on Ray Data, results into `output` (`results`: how an earlier run's
    `results.jsonl` is treated, see `ResultsFile`); the exit status (1 if an item failed)."""
    ray = require_ray()
    loaded = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    sources = inputs or ([loaded.root / loaded.inputs] if loaded.inputs else [])
    if not sources:
        raise ConfigError(f"{loaded.source}: no `inputs:` in the recipe; pass --input")
    parquet = output.suffix == ".parquet"
    sink = None if parquet else (results or ResultsFile(output)).open()
    started_here = connect(max(len(os.sched_getaffinity(0)), concurrency + 1))
    try:
        started = time.perf_counter()
        skip = sink.resume_keys() if sink is not None else ()
        ds = read_dataset(sources, list_folder=_recipe_lister(loaded), limit=limit, skip=skip)
        mapped = map_recipe(
            ds, loaded.source, concurrency=concurrency, on_error="return", log_level=log_level
        )
        rows, failed = write_results(mapped, output, sink)
        seconds = time.perf_counter() - started
    finally:
        if sink is not None:
            sink.close()
        if started_here:
            ray.shutdown()
    where = output if output.suffix == ".parquet" else output / "results.jsonl"
    rate = rows / seconds if seconds else 0.0
    print(
        f"{rows} items, {failed} failed, {seconds:.2f}s ({rate:.1f} items/s) on Ray with "
        f"{concurrency} actor(s); results in {where}"
    )
    return 1 if failed else 0


def _recipe_lister(recipe: Recipe) -> Callable[[Path], list[Path]]:
    """The recipe pipeline's `input_files`, from a driver-side instance loaded without warm-up."""

    def list_folder(folder: Path) -> list[Path]:
        quiet = {m.name: {"warmup": False, "instances": 1} for m in recipe.models}
        with OfflineInference(load_recipe(recipe.source, models=quiet)) as oi:
            return oi.pipeline.input_files(folder)

    return list_folder
