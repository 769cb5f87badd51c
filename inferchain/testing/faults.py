"""Fault injection around any real backend, for tests of what happens when things fail.

`FaultyBackend(inner)` loads real sessions through `inner` (e.g. ONNX Runtime) and makes
them fail on demand: a `BackendError` on chosen runs or with a probability, a load failure,
or a `WorkerKilled` (a BaseException, like a crash of the worker thread). It also orders
things for a test without sleeps: a run or a load it holds waits at a `Gates` gate until the
test opens it (`inferchain.testing.gates`), and the test can wait until that run has begun.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Collection, Sequence

import numpy as np

from inferchain.backends.base import Backend, Session
from inferchain.config import ModelConfig
from inferchain.errors import BackendError, LoadError
from inferchain.testing.gates import Gates


class WorkerKilled(BaseException):
    """Raised inside a worker thread to kill it, as a crash of the runtime would."""


class FaultySession(Session):
    """A real session whose `run` fails as its backend says."""

    def __init__(self, inner: Session, owner: FaultyBackend) -> None:
        self._inner = inner
        self._owner = owner
        self.inputs = inner.inputs
        self.outputs = inner.outputs
        self.max_batch_size = inner.max_batch_size
        self.reuses_outputs = inner.reuses_outputs
        self.metadata = inner.metadata

    def run(self, inputs: Sequence[np.ndarray], batch_size: int) -> list[np.ndarray]:
        self._owner.before_run()
        return self._inner.run(inputs, batch_size)

    def padded_rows(self, rows: int) -> int:
        return self._inner.padded_rows(rows)

    def close(self) -> None:
        self._owner.count("close")
        self._inner.close()


class FaultyBackend(Backend):
    """Wraps `inner`; counts calls and injects faults (all settable while running).

    - `fail_runs`: 1-based numbers of `run` calls (across all sessions) that raise
      `BackendError(code=500000, name="INJECTED")`;
    - `fail_p`: probability that any run raises it (seeded by `seed`);
    - `kill_runs`: run numbers that raise `WorkerKilled` instead;
    - `fail_loads`: 1-based numbers of `load` calls that raise `LoadError`;
    - `hold_runs`: run numbers that wait at a gate until the test opens it (a long batch):
      `runs.wait_arrived(n)` waits until run n has begun, `runs.open(n)` lets it go on;
    - `hold_loads`: the same for loads (`loads`; e.g. a re-initialisation in progress).

    A held run or load not opened within `HOLD_TIMEOUT_S` fails (`BackendError` named
    "HELD", `LoadError`), so a test that forgets one ends instead of hanging.
    """

    def __init__(
        self,
        inner: Backend,
        *,
        fail_runs: Collection[int] = (),
        fail_p: float = 0.0,
        kill_runs: Collection[int] = (),
        fail_loads: Collection[int] = (),
        hold_runs: Collection[int] = (),
        hold_loads: Collection[int] = (),
        seed: int = 0,
    ) -> None:
        self.name = f"faulty-{inner.name}"
        self.inner = inner
        self.thread_affine = inner.thread_affine
        self.fail_runs = set(fail_runs)
        self.fail_p = fail_p
        self.kill_runs = set(kill_runs)
        self.fail_loads = set(fail_loads)
        self.runs = Gates(hold_runs)  # every run passes here, in run order
        self.loads = Gates(hold_loads)  # every load passes here, in load order
        self.counts: dict[str, int] = {"load": 0, "run": 0, "close": 0, "failed": 0}
        self.run_threads: list[str] = []  # the thread each run was called on, in run order
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def count(self, what: str) -> int:
        with self._lock:
            self.counts[what] += 1
            return self.counts[what]

    def before_run(self) -> None:
        with self._lock:
            self.counts["run"] += 1
            n = self.counts["run"]
            self.run_threads.append(threading.current_thread().name)
        if not self.runs.arrive(n):
            raise BackendError(f"run {n} was held and never let go", code=500000, name="HELD")
        if n in self.kill_runs:
            raise WorkerKilled(f"injected crash on run {n}")
        with self._lock:
            fail = n in self.fail_runs or (self.fail_p > 0 and self._rng.random() < self.fail_p)
        if fail:
            self.count("failed")
            raise BackendError(f"injected failure on run {n}", code=500000, name="INJECTED")

    def load(self, model: ModelConfig, device: int) -> Session:
        n = self.count("load")
        if not self.loads.arrive(n):
            raise LoadError(f"load {n} was held and never let go", code=500000, name="HELD")
        if n in self.fail_loads:
            raise LoadError(f"injected load failure on load {n}", code=500000, name="INJECTED")
        return FaultySession(self.inner.load(model, device), self)

    def close(self) -> None:
        self.inner.close()
