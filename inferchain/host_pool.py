"""The pipeline driver's host threads: a step that never returns cannot hold the run's end.

`HostPool` runs host steps (callables) on `size` threads, in the order they were submitted.
Unlike a `ThreadPoolExecutor` (whose threads every exit joins), its threads are daemons and
each step can be left behind: `abandon(key)` (an item whose time is up while its step runs)
lets that thread go with its step and starts another in its place, so the steps after it
still run and the process can exit while it is stuck. `stop` drops the steps not yet
started and joins the threads, waiting at most until a deadline for the steps running.
`host_workers` says how many threads a pipeline's driver gets.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from inferchain.logs import get_logger

if TYPE_CHECKING:
    from inferchain.config import Recipe
    from inferchain.pipeline import Pipeline

log = get_logger(__name__)

Step = Callable[[], None]

MAX_HOST_WORKERS = 8  # the default pool never grows past this many threads


def default_host_workers(recipe: Recipe) -> int:
    """Host threads for `recipe` when neither it nor its pipeline says: 0 (the caller's
    thread, in input order) where a model batches `fill` (its batches follow the order
    items come in); else the cores the models' intra-op threads leave, at least 2."""
    if any(m.batching == "fill" for m in recipe.models):
        return 0
    threads = 0
    for m in recipe.models:
        options = m.session_options or recipe.session_options
        threads += m.instances * max(1, options.intra_op_num_threads or 1)
    cores = len(os.sched_getaffinity(0))
    return min(MAX_HOST_WORKERS, max(2, cores - threads))


def host_workers(pipeline: Pipeline) -> int:
    """The recipe's `host_workers`, else the pipeline class's, else the default."""
    recipe = pipeline.recipe
    if recipe.host_workers is not None:
        return recipe.host_workers
    if pipeline.host_workers is not None:
        return pipeline.host_workers
    return default_host_workers(recipe)


class HostPool:
    """Threads named `inferchain-host-N` running submitted steps, `size` at a time."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a step queued, ended, or stop
        self._queue: deque[tuple[Hashable, Step]] = deque()
        self._running: dict[Hashable, threading.Thread] = {}  # key -> the thread running it
        self._threads: list[threading.Thread] = []  # live and not abandoned
        self._stopped = False
        self._made = 0
        with self._lock:
            for _ in range(size):
                self._spawn()

    def submit(self, key: Hashable, step: Step) -> None:
        """Run `step()` on a host thread once those submitted before it have started;
        `key` names it for `abandon` (one step per key at a time)."""
        with self._lock:
            if self._stopped:
                raise RuntimeError("the host pool is stopped")
            self._queue.append((key, step))
            self._changed.notify()

    def abandon(self, key: Hashable) -> bool:
        """Leave the thread running step `key` to it (it ends once the step returns) and
        start another in its place; False when no step of `key` runs now."""
        with self._lock:
            thread = self._running.get(key)
            if thread is None or thread not in self._threads:
                return False
            self._threads.remove(thread)
            if not self._stopped:
                self._spawn()
        log.warning("host_step_abandoned", thread=thread.name)
        return True

    def stop(self, deadline: float | None = None) -> list[Hashable]:
        """Take no more steps; drop those not started (their keys are returned), let the
        running ones end and join their threads, until `deadline` (`time.monotonic()`;
        None: as long as they take). A thread still running a step then is left to it."""
        with self._lock:
            self._stopped = True
            dropped = [key for key, _ in self._queue]
            self._queue.clear()
            self._changed.notify_all()
            threads = list(self._threads)
        for thread in threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
        with self._lock:
            for thread in self._running.values():
                if thread in threads and thread.is_alive():
                    log.warning("host_step_left_running", thread=thread.name)
        return dropped

    def _spawn(self) -> None:
        """One more thread (under the lock)."""
        self._made += 1
        thread = threading.Thread(
            target=self._serve, name=f"inferchain-host-{self._made}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _serve(self) -> None:
        me = threading.current_thread()

        def wake() -> bool:
            return bool(self._queue) or self._stopped

        while True:
            with self._lock:
                self._changed.wait_for(wake)
                if self._stopped:
                    return
                key, step = self._queue.popleft()
                self._running[key] = me
            try:
                step()  # the driver's steps catch what they raise: this is a last guard
            except BaseException as e:
                log.error("host_step_failed", error=type(e).__name__, detail=str(e))
            with self._lock:
                if self._running.get(key) is me:  # the key's next step may run already
                    del self._running[key]
                if me not in self._threads:  # abandoned while it ran: it is done now
                    return
