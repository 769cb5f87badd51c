"""Processes for a pipeline's host code that holds the GIL, beside the host threads.

Threads serve host work that releases the GIL (numpy, OpenCV, PIL). Pure-Python host code
(tokenising, parsing, per-pixel loops in Python) holds it, and only processes run it side by
side. `HostProcesses` is a pool of such processes, started on first use (spawned, so no
thread of this process is copied into them), each with the recipe's folder importable as
`import_recipe_module` imports it; a pipeline step hands it a function of its recipe's
module and receives the result:

    tensor = yield self.in_process(preprocess, image)   # preprocess: a module-level function

The function and its arguments travel by pickle: a function defined at the top level of the
recipe's module (or any importable module) and plain values (arrays, strings) do; a bound
method of the pipeline does not (it holds the OfflineInference). `close()` (from
`OfflineInference.close()`) cancels what has not started and joins the processes.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from inferchain.config import import_recipe_module
from inferchain.errors import Closed

MAX_PROCESSES = 8  # the default pool never grows past this


def _child(recipe: str) -> None:
    """In each process: make the recipe's folder importable under the package name this
    process gave it, so its functions unpickle there (a recipe built in memory has none)."""
    if Path(recipe).is_file() and (Path(recipe).parent / "pipeline.py").is_file():
        import_recipe_module(recipe)


class HostProcesses:
    """A pool of `workers` processes (default: the cores, at most 8), started on first use."""

    def __init__(self, recipe: Path, workers: int | None = None) -> None:
        self._recipe = recipe  # its YAML file: each process imports its folder
        cores = len(os.sched_getaffinity(0))
        self.workers = workers if workers is not None else min(MAX_PROCESSES, cores)
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run `fn(*args)` in one of the processes (any thread); its Future."""
        with self._lock:
            if self._closed:
                raise Closed("the host processes are closed")
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_child,
                    initargs=(str(self._recipe),),
                )
            pool = self._pool
        return pool.submit(fn, *args)

    @property
    def started(self) -> bool:
        return self._pool is not None

    def close(self) -> None:
        """Cancel what has not started, wait for what runs, join the processes."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
