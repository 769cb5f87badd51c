"""The framework's work counted, not timed: calls made inside inferchain and objects it keeps.

A count does not depend on the machine, its load or the hour, so it can gate close to today's
figures; a timed figure on a shared 2-core machine moves by 2x between machines and hours.

`CallCounter` installs a profile hook (`sys.setprofile` on this thread, `threading.setprofile`
for every thread started while it is installed: build the OfflineInference inside it, so its
engine, worker and callback threads are counted too) and, while armed, counts
- Python calls: `call` events of code under the counted roots (a generator's resumption is a
  call too);
- C calls: `c_call` events made *from* such code (`len`, a lock's `acquire`, a numpy function).

Everything else the process runs (the benchmark's own loop, the standard library's Python,
onnxruntime's native threads) is left out.
"""

from __future__ import annotations

import gc
import itertools
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from typing import Any, NamedTuple

import inferchain

FRAMEWORK = str(Path(inferchain.__file__).resolve().parent)  # inferchain's own code


class Calls(NamedTuple):
    """Calls counted over some units of work (items, batches, calls), per unit."""

    python: float  # Python calls of the framework's code, per unit
    c: float  # C calls made from the framework's code, per unit


class CallCounter:
    """Counts the framework's calls on every thread while armed (see the module docstring).

    `also`: code objects counted as the framework's wherever they live (a deliberate
    regression that a benchmark injects)."""

    def __init__(self, roots: Iterable[str] = (FRAMEWORK,), also: Iterable[CodeType] = ()) -> None:
        self._roots = tuple(roots)
        self._also = frozenset(also)
        self._armed = False
        self._python = itertools.count()  # `next` on a count is atomic under the GIL
        self._c = itertools.count()
        self._ours: dict[CodeType, bool] = {}

    def __enter__(self) -> CallCounter:
        sys.setprofile(self._hook)
        threading.setprofile(self._hook)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self._armed or (event != "call" and event != "c_call"):
            return
        code = frame.f_code
        ours = self._ours.get(code)
        if ours is None:
            ours = self._ours[code] = code in self._also or code.co_filename.startswith(self._roots)
        if ours:
            next(self._python if event == "call" else self._c)

    def count(self, units: float, fn: Callable[[], object]) -> Calls:
        """Run `fn` armed; the framework's calls in it, per unit of its `units`."""
        python, c = next(self._python), next(self._c)
        self._armed = True
        try:
            fn()
        finally:
            self._armed = False
        # each `next` above and here takes one of the count's own
        return Calls((next(self._python) - python - 1) / units, (next(self._c) - c - 1) / units)


def objects_kept(units: float, fn: Callable[[], object]) -> float:
    """GC-tracked objects alive after `fn()` that were not before, per unit, while what `fn`
    returned is still held: what the cyclic GC walks in every full collection from then on."""
    gc.collect()
    before = len(gc.get_objects())
    held = fn()
    gc.collect()
    after = len(gc.get_objects())
    del held
    return (after - before - 1) / units  # `held` itself is one of them
