"""Pipelines: a recipe's pre-processing, model calls and post-processing for one item.

A pipeline's `process(item)` is a generator: it yields a Request (or a list of them) and
receives the outputs (or a list of outputs) when they are done, so many items are in flight at
once and their requests batch together, while the code reads top to bottom::

    class Orientation(Pipeline):
        def process(self, image):
            out = yield self.submit("orientation", preprocess(image))
            return postprocess(out)

`PipelineDriver` (`inferchain.driver`) advances the generators as requests finish, their host
steps on a pool of threads beside the engine (`host_workers`), results in input order.

An output the next model takes unchanged is passed on as it came back; where the next
model's input is declared `from: MODEL.OUTPUT` in the recipe, that output is an
`inferchain.DeviceTensor` on acl and never goes to the host (an array elsewhere)::

    out = yield self.submit("embed", x)
    result = yield self.submit("head", {"x": out["y"]})
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inferchain.config import RECIPE_PACKAGE, import_recipe_module
from inferchain.core.request import Request
from inferchain.errors import ConfigError, InvalidInput, MissingDependency
from inferchain.extras import missing_message, require
from inferchain.images import MODULES, ImageReader
from inferchain.pipeline_check import check_model_names

if TYPE_CHECKING:
    from inferchain.config import Recipe
    from inferchain.offline import OfflineInference

Step = Request | Future[Any] | list[Request | Future[Any]]  # what `process` may yield
Process = Generator[Step, Any, Any]


class Pipeline:
    """Base class of a recipe's pipeline; the default passes an item to the only model.

    Subclasses override `process` (and usually `load`, `to_record`, `summary`). `self.oi`
    is the running OfflineInference, `self.params` the recipe's `params:` mapping.
    """

    #: the kinds of file (suffixes, lower case) `input_files` takes from an input folder
    suffixes: tuple[str, ...] = (".npy",)
    #: items in flight at once when the caller does not say (`run(max_in_flight=...)`)
    max_in_flight: int = 64
    #: `inferchain run` reads each line of an input file as one item (`load_line`), e.g. a
    #: list of names; else each file is one item (`load`)
    item_per_line: bool = False
    #: threads that run items' host steps (`load` in `inferchain run`, the code of `process`
    #: between its yields) beside the models; None: the recipe's `host_workers`, else the
    #: default (`inferchain.host_pool.default_host_workers`); 0: the caller's thread. With
    #: threads, `process` runs for several items at once: it must not share mutable state
    #: between items without a lock
    host_workers: int | None = None
    #: modules `load` or `process` import only when they run (e.g. an audio reader):
    #: imported by `init()` and `inferchain doctor`, so that one missing is one error naming
    #: the recipe's `extra:`, not one per item
    requires: tuple[str, ...] = ()
    #: `inferchain run`'s default `--format`: `jsonl` (one JSON line per item) or `parquet`
    #: (shards with tensors as typed arrays; see `inferchain.shards`)
    output_format: str = "jsonl"
    #: `OfflineInference.run` reads a `str` item with `load` as it reads a `Path` (the items
    #: are file names); False: a `str` is data (a text), only a `Path` is read
    path_items: bool = False
    #: the models this pipeline submits to, checked against the recipe by `init()` before
    #: any model loads; None: the names its module's code gives as literals to `submit`,
    #: `submit_many`, `infer`, `map`, ... of `self`, `self.oi` or `oi`
    #: (`inferchain.pipeline_check`)
    model_names: tuple[str, ...] | None = None

    def __init__(self, oi: OfflineInference) -> None:
        self.oi = oi
        self.recipe: Recipe = oi.recipe
        self.params: dict[str, Any] = dict(oi.recipe.params)

    @property
    def anchor(self) -> int | None:
        """Items run in anchored runs of this many input positions, or None: a batch of a
        `batching: fill` model (whose rows' outputs may depend on what shares their batch,
        e.g. padding to the longest) is cut at every multiple of it, so its rows are a
        function of the input positions, not of timing or of what a resumed run has left;
        `inferchain run --resume` reruns the whole runs it needs (writing only the missing
        items). Default: the largest batch of the recipe's `batching: fill` models, each
        item's first step going to that model; override where a pipeline's items map to
        its batches otherwise."""
        fill = [m.batch_rows for m in self.recipe.models if m.batching == "fill"]
        return max(fill) if fill else None

    def submit(self, model: str, inputs: Any, **options: Any) -> Request:
        """Shorthand for `self.oi.submit`."""
        return self.oi.submit(model, inputs, **options)

    def in_process(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run `fn(*args)` in one of the OfflineInference's host processes, for host code
        that holds the GIL; yield the Future to receive the result (or its error raised at
        the yield). `fn` and `args` must pickle: a module-level function, plain values."""
        return self.oi.host_processes.submit(fn, *args)

    def process(self, item: Any) -> Process | Any:
        """One item's work: yield requests, receive outputs, return the result."""
        outputs = yield self.submit(self.recipe.models[0].name, item)
        return outputs

    def load(self, path: Path) -> Any:
        """Read one input file for `inferchain run` (default: a .npy array)."""
        return np.load(path)

    def load_line(self, text: str) -> Any:
        """One item from one line of an input file (`item_per_line`; blank lines are
        skipped); default: the line's text."""
        return text

    def input_files(self, folder: Path) -> list[Path]:
        """The files of an input folder this pipeline reads (`suffixes`), in a stable order."""
        return sorted(
            p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in self.suffixes
        )

    def to_record(self, result: Any) -> dict[str, Any]:
        """A JSON-serialisable record of one result (a line of results.jsonl)."""
        if isinstance(result, dict):
            return {k: np.asarray(v).tolist() for k, v in result.items()}
        return {"result": np.asarray(result).tolist()}

    def to_row(self, result: Any) -> dict[str, Any]:
        """One result as named values for a Parquet row: arrays stay arrays (a tensor column
        where every row's has one shape and dtype), scalars are columns. Default: a model's
        outputs as they are, or, for a pipeline that defines only `to_record`, its record."""
        if type(self).to_record is not Pipeline.to_record:
            return self.to_record(result)
        if isinstance(result, dict):
            return {k: np.asarray(v) for k, v in result.items()}
        return {"result": np.asarray(result)}

    def summary(self, result: Any) -> str:
        """One short line describing a result, printed by `inferchain run`."""
        record = self.to_record(result)
        return ", ".join(f"{k}={v}" for k, v in record.items())[:200]

    def save(self, source: Path, item: Any, result: Any, out_dir: Path) -> None:
        """Write extra artefacts for one result (e.g. an annotated image); default none."""

    def describe_load(self, path: Path) -> str:
        """One line saying what `load` makes of the file at `path` (`inferchain info RECIPE
        --input PATH`): by default the type, shape and dtype of what it returns."""
        try:
            item = self.load(path)
        except Exception as e:
            return f"{path}: {type(e).__name__}: {e}"
        return f"{path}: {describe_value(item)}"


class PipelineWrapper(Pipeline):
    """A pipeline around another one (`inner`), e.g. to read its files or time its steps:
    it runs in the inner's OfflineInference and keeps the inner's `max_in_flight`."""

    def __init__(self, inner: Pipeline) -> None:
        super().__init__(inner.oi)
        self.inner = inner
        self.max_in_flight = inner.max_in_flight
        self.host_workers = inner.host_workers


class PathLoader(PipelineWrapper):
    """The inner pipeline over items where a path (`pathlib.Path`, any `os.PathLike`, and a
    `str` where the inner's `path_items` says its items are file names) is read with the
    inner's `load` when its item starts, so a file that cannot be read fails alone; any other
    item (a `str` of a pipeline whose items are texts) passes as it is. An `InvalidInput` of
    an item read from a file names the file. `OfflineInference.run` runs every pipeline this
    way."""

    def process(self, item: Any) -> Process:
        path = None
        if isinstance(item, os.PathLike) or (self.inner.path_items and isinstance(item, str)):
            path = Path(item)
            item = self.inner.load(path)
        try:
            work = self.inner.process(item)
            if isinstance(work, Generator):
                return (yield from work)
            return work
        except InvalidInput as e:
            if path is None or str(path) in str(e):
                raise
            raise InvalidInput(f"{path}: {e}") from e


class ImagePipeline(Pipeline):
    """A pipeline whose items are images: file names (`str` or `Path`), encoded bytes, PIL
    images or arrays, each read by `self.reader` (`inferchain.images.ImageReader`) into uint8
    (H, W, 3) pixels in the order `channels` says: by default what Pillow's
    `Image.open(f).convert("RGB")` gives. The recipe's `params.image` chooses the rest:
    `alpha` (`drop`, `white`, `rapidocr`), `exif` (turn as the EXIF tag says) and `max_mb`
    (the largest image an item may make, checked before decoding and before a resize)."""

    suffixes = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
    requires = MODULES
    path_items = True
    #: the channel order this pipeline's code is written for: `rgb` or `bgr` (OpenCV's)
    channels: str = "rgb"

    def __init__(self, oi: OfflineInference) -> None:
        super().__init__(oi)
        image = self.params.get("image")
        self.reader = ImageReader.from_params(image, self.recipe.source, self.channels)

    def load(self, path: Path) -> Any:
        """The file's pixels, as `self.reader` reads them."""
        return self.reader.read(path)

    def describe_load(self, path: Path) -> str:
        """The file's format, mode and size, and the pixels `self.reader` gives of it."""
        return self.reader.describe(path)


def describe_value(value: Any) -> str:
    """`uint8 (480, 640, 3)` for an array, the same per name for a mapping of arrays, the
    type's name otherwise."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype.name} {tuple(value.shape)}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {describe_value(v)}" for k, v in value.items()) or "{}"
    return type(value).__name__


def pipeline_class(recipe: Recipe) -> type[Pipeline]:
    """The class `file.py:ClassName` of the recipe's `pipeline:` key, imported from the
    recipe's folder, with every module it `requires` importing and every model it submits to
    in the recipe (`inferchain.pipeline_check`): `init()` and `inferchain doctor` check this
    before any model loads or any item runs.

    A module that is not installed (imported by the file, or in `requires`) is one
    `MissingDependency` naming the recipe and the install command of its `extra:`; anything
    else wrong is a `ConfigError` naming the recipe file.
    """
    assert recipe.pipeline is not None
    file, sep, cls_name = recipe.pipeline.partition(":")
    path = recipe.root / file
    if not sep or not path.is_file():
        raise ConfigError(
            f"{recipe.source}: key 'pipeline' must be 'file.py:ClassName' in the recipe's "
            f"folder, got {recipe.pipeline!r}"
        )
    what = f"{recipe.source}: recipe {recipe.name}'s pipeline {file}"
    try:
        module = import_recipe_module(recipe, path.stem)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.startswith(RECIPE_PACKAGE):
            raise ConfigError(f"{what} could not be imported: {e}") from e
        absent = {e.name: f"{type(e).__name__}: {e}"}
        raise MissingDependency(missing_message(what, absent, recipe.extra)) from e
    except Exception as e:  # a syntax error, a failing import-time statement, ...
        raise ConfigError(f"{what} could not be imported: {type(e).__name__}: {e}") from e
    cls = getattr(module, cls_name, None)
    if cls is None:
        there = [
            name
            for name, value in vars(module).items()
            if isinstance(value, type)
            and value.__module__ == module.__name__
            and not name.startswith("_")
        ]
        raise ConfigError(
            f"{recipe.source}: key 'pipeline': no class {cls_name!r} in {file}; classes "
            f"there: {', '.join(there) or 'none'}"
        )
    if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
        raise ConfigError(
            f"{recipe.source}: key 'pipeline': {recipe.pipeline!r} is not a Pipeline subclass"
        )
    require(cls.requires, recipe.extra, what)
    check_model_names(cls, recipe)
    return cls


def load_pipeline(recipe: Recipe, oi: OfflineInference) -> Pipeline:
    """Import `file.py:ClassName` from the recipe's folder (`pipeline_class`) and build it."""
    return pipeline_class(recipe)(oi)
