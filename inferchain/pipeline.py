"""Pipelines: a recipe's pre-processing, model calls and post-processing for one item.

A pipeline's `process(item)` is a generator: it yields a Request (or a list of them) and
receives the outputs (or a list of outputs) when they are done, so many items are in flight at
once and their requests batch together, while the code reads top to bottom::

    class Orientation(Pipeline):
        def process(self, image):
            out = yield self.submit("orientation", preprocess(image))
            return postprocess(out)

`PipelineDriver` advances the generators on the caller's thread as requests finish.
"""

from __future__ import annotations

import hashlib
import importlib
import queue
import sys
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from inferchain.anchors import current_run, new_driver
from inferchain.core.request import Outputs, Request
from inferchain.errors import ConfigError, RequestTimeout
from inferchain.logs import get_logger

if TYPE_CHECKING:
    from inferchain.config import Recipe
    from inferchain.offline import OfflineInference

log = get_logger(__name__)

Step = Request | list[Request]
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
    #: `inferchain run`'s default `--format`: `jsonl` (one JSON line per item) or `parquet`
    #: (shards with tensors as typed arrays; see `inferchain.shards`)
    output_format: str = "jsonl"

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


class PipelineWrapper(Pipeline):
    """A pipeline around another one (`inner`), e.g. to read its files or time its steps:
    it runs in the inner's OfflineInference and keeps the inner's `max_in_flight`."""

    def __init__(self, inner: Pipeline) -> None:
        super().__init__(inner.oi)
        self.inner = inner
        self.max_in_flight = inner.max_in_flight


class ImagePipeline(Pipeline):
    """A pipeline whose items are BGR uint8 images (H, W, 3), read with OpenCV."""

    suffixes = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")

    def load(self, path: Path) -> Any:
        from inferchain.images import read_image

        return read_image(path)


def load_pipeline(recipe: Recipe, oi: OfflineInference) -> Pipeline:
    """Import `file.py:ClassName` from the recipe's folder and build it."""
    assert recipe.pipeline is not None
    file, sep, cls_name = recipe.pipeline.partition(":")
    path = recipe.root / file
    if not sep or not path.is_file():
        raise ConfigError(
            f"{recipe.source}: key 'pipeline' must be 'file.py:ClassName' in the recipe's "
            f"folder, got {recipe.pipeline!r}"
        )
    module = _import_recipe_module(recipe.root, path.stem)
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
        raise ConfigError(f"{recipe.source}: {recipe.pipeline!r} is not a Pipeline subclass")
    return cls(oi)


def _import_recipe_module(root: Path, stem: str) -> ModuleType:
    """Import `root/stem.py` as a module of a package made of the recipe's folder, so a
    pipeline may import its sibling files (`from . import boxes`)."""
    package = f"inferchain_recipes.r{hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]}"
    if "inferchain_recipes" not in sys.modules:
        sys.modules["inferchain_recipes"] = ModuleType("inferchain_recipes")
    if package not in sys.modules:
        module = ModuleType(package)
        module.__path__ = [str(root)]
        sys.modules[package] = module
    return importlib.import_module(f"{package}.{stem}")


class _Task:
    """One item in flight: its generator and what it waits for."""

    __slots__ = ("ended", "gen", "index", "remaining", "step")

    def __init__(self, index: int, gen: Process) -> None:
        self.index = index
        self.gen = gen
        self.step: Step = []
        self.remaining = 0
        self.ended = False  # finished, failed or timed out: later events for it are stale


class PipelineDriver:
    """Runs `pipeline.process` over many items with at most `max_in_flight` at once (by
    default the pipeline's own `max_in_flight`); the batches of `batching: fill` models are
    cut at every multiple of the pipeline's `anchor` item positions (where `max_in_flight`
    holds a whole run of them; else they leave when no more items can start)."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        max_in_flight: int | None = None,
        on_error: Literal["raise", "return"] = "raise",
        on_idle: Callable[[bool, bool], None] | None = None,
        item_timeout: float | None = None,
    ) -> None:
        """`on_idle(ended, full)` is called each time every item in flight waits for the
        engine, just before the driver blocks: `ended` once the input has ended, `full` while
        `max_in_flight` items are in flight. By default the pipeline's `oi.flush` of the
        partial batches of `batching: fill` models: once the input has ended, or while full
        if nothing else is left to run (sequence steps leave on their own).

        `item_timeout` (seconds): an item not finished that long after it started ends
        with `RequestTimeout("timed out after S s")` in its place (its requests not yet
        running are cancelled, its generator closed) and the others go on."""
        if max_in_flight is None:
            max_in_flight = pipeline.max_in_flight
        if max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if item_timeout is not None and not item_timeout > 0:
            raise ConfigError(f"item_timeout must be > 0 seconds, got {item_timeout}")
        self._timeout = item_timeout
        self._deadlines: deque[tuple[float, _Task]] = deque()  # in start order = by deadline
        self._pipeline = pipeline
        self._limit = max_in_flight
        self._on_error = on_error
        anchor = pipeline.anchor
        if anchor is not None and max_in_flight < anchor:
            # a run of positions never fits: batches leave when no more items can start
            log.info("not_anchored", anchor=anchor, max_in_flight=max_in_flight)
            anchor = None
        self._anchor = anchor
        self._driver = new_driver()
        self._on_idle = on_idle if on_idle is not None else _flush(pipeline.oi, anchor)
        self._events: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        self._results: dict[int, tuple[bool, Any]] = {}  # index -> (ok, result or error)
        self._active: dict[int, _Task] = {}

    def run(self, items: Iterable[Any]) -> Iterator[Any]:
        source = enumerate(items)
        next_out = 0
        exhausted = False
        try:
            while True:
                while next_out in self._results:
                    ok, value = self._results.pop(next_out)
                    next_out += 1
                    if not ok and self._on_error == "raise":
                        raise value
                    yield value
                while not exhausted and len(self._active) + len(self._results) < self._limit:
                    nxt = next(source, None)
                    if nxt is None:
                        exhausted = True
                    else:
                        self._start(*nxt)
                if next_out in self._results:
                    continue  # an item that finished at its start
                if exhausted and not self._active and not self._results:
                    return
                if self._active:
                    events = self._events
                    if events.empty():
                        full = len(self._active) + len(self._results) >= self._limit
                        self._on_idle(exhausted, full)
                    task = self._next_event()
                    if task is not None:
                        self._resume(task)
        finally:
            for task in self._active.values():
                for r in _requests(task.step):
                    r.cancel()
                task.gen.close()

    def _start(self, index: int, item: Any) -> None:
        try:
            gen = self._pipeline.process(item)
        except Exception as e:
            self._results[index] = (False, e)
            return
        if not isinstance(gen, Generator):
            self._results[index] = (True, gen)
            return
        task = _Task(index, gen)
        self._active[index] = task
        if self._timeout is not None:
            self._deadlines.append((time.monotonic() + self._timeout, task))
        self._advance(task, lambda: gen.send(None))

    def _advance(self, task: _Task, step: Callable[[], Step]) -> None:
        """`_step` with the task's anchored run current (`inferchain.anchors`)."""
        if self._anchor is None:
            self._step(task, step)
            return
        token = current_run.set((self._driver, task.index // self._anchor))
        try:
            self._step(task, step)
        finally:
            current_run.reset(token)

    def _next_event(self) -> _Task | None:
        """The next task whose requests are done; None once an item's time is up (it has
        then ended with its timeout error). Blocks until one or the other."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].ended:
            deadlines.popleft()
        if not deadlines:
            return self._events.get()
        due, task = deadlines[0]
        try:
            return self._events.get(timeout=max(due - time.monotonic(), 0.0))
        except queue.Empty:
            deadlines.popleft()
            self._time_out(task)
            return None

    def _time_out(self, task: _Task) -> None:
        for r in _requests(task.step):
            r.cancel()  # those not yet running; a running one ends on its own, unheard
        try:
            task.gen.close()
        except Exception as e:  # the item's own clean-up failed: it has timed out anyway
            log.warning("item_close_failed", index=task.index, error=repr(e))
        self._finish(task, False, RequestTimeout(f"timed out after {self._timeout:g} s"))

    def _step(self, task: _Task, step: Callable[[], Step]) -> None:
        try:
            yielded = step()
        except StopIteration as stop:
            self._finish(task, True, stop.value)
            return
        except Exception as e:
            self._finish(task, False, e)
            return
        task.step = yielded
        requests = _requests(yielded)
        task.remaining = len(requests)
        if not requests:
            self._events.put(task)
        events = self._events
        for r in requests:
            r.add_done_listener(lambda _r: events.put(task))

    def _resume(self, task: _Task) -> None:
        if task.ended:
            return  # its time ran out before this request ended
        task.remaining -= 1
        if task.remaining > 0:
            return
        step = task.step
        errors = [r.error for r in _requests(step) if r.outputs is None]
        gen = task.gen
        if errors:
            error = errors[0]
            assert error is not None
            self._advance(task, lambda: gen.throw(error))
        elif isinstance(step, Request):
            outputs: Outputs | None = step.outputs
            self._advance(task, lambda: gen.send(outputs))
        else:
            self._advance(task, lambda: gen.send([r.outputs for r in step]))

    def _finish(self, task: _Task, ok: bool, value: Any) -> None:
        task.ended = True
        del self._active[task.index]
        self._results[task.index] = (ok, value)


def _flush(oi: OfflineInference, anchor: int | None) -> Callable[[bool, bool], None]:
    if not any(m.batching == "fill" for m in oi.recipe.models):
        return lambda ended, full: None  # no partial batches that wait for a flush

    def on_idle(ended: bool, full: bool) -> None:
        # anchored: a partial batch leaves at its run's end (`run`) or the input's, never
        # because of timing; every earlier batch has left, so the window frees on its own
        if ended or (full and anchor is None):
            oi.flush(steps=False, batches=True if ended else "if_stalled")

    return on_idle


def _requests(step: Step) -> list[Request]:
    return [step] if isinstance(step, Request) else list(step)
