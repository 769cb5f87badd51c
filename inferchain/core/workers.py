"""WorkerSet: one model's workers as the engine dispatches to them: streams, room, run length.

The engine's step is the one writer of every field (under the engine's lock, whichever
thread steps it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from inferchain.config import ModelConfig
from inferchain.core.batcher import ModelBatcher
from inferchain.shapes import ShapePolicy

if TYPE_CHECKING:  # the engine reads a worker's surface only: no backend is imported
    from inferchain.core.worker import ModelWorker

RUN_S = 0.002  # seconds of batches one run holds, at most ...
RUN_MAX = 32  # ... and this many batches


def stop_all(workers: Iterable[ModelWorker]) -> None:
    """Let each worker finish its queue and release its session, then join the threads."""
    workers = list(workers)
    for w in workers:
        w.stop()
    for w in workers:
        w.join()


def run_batches(batch_s: float | None) -> int:
    """Batches in one run of a worker whose max batch took `batch_s` seconds at warm-up:
    as many as run in about RUN_S, so that a run of short batches costs one hand-off and
    one record, while a long batch stays a run of its own; 1 where it was never timed.
    Chosen once, at start: the same work is cut the same way however busy the machine."""
    if batch_s is None or batch_s <= 0:
        return 1
    return max(1, min(RUN_MAX, int(RUN_S / batch_s)))


class WorkerSet:
    """One model as the engine sees it: its batcher, its workers and their free streams.

    A worker with several streams holds one run per stream. A worker with one stream holds
    two runs: the next one waits in its queue while one runs, so no hand-off gap is left
    between them, and rows that come meanwhile wait in the batcher, where they can fill a
    batch together. A worker that runs a run inline (on the thread stepping the engine) takes
    nothing else until it is back.
    """

    def __init__(
        self,
        config: ModelConfig,
        workers: Sequence[ModelWorker],
        shapes: ShapePolicy,
        inline: bool = False,
    ) -> None:
        """`inline`: its sessions may run on any thread (the inline executor may run them)."""
        self.config = config
        self.name = config.name
        self.batcher = ModelBatcher(config)
        self.workers = workers
        self.crops = shapes.crops
        self.longest = shapes.longest  # a batch is padded to its rows' envelope
        self.fail_fast = config.health.while_unhealthy == "fail"
        self.inline = inline
        self.free: list[list[int]] = [list(range(w.num_streams)) for w in workers]
        self.in_flight = [0] * len(workers)  # runs dispatched and not yet back
        self.held = [False] * len(workers)  # running a run inline
        self.batches = [run_batches(w.batch_s) if w.num_streams == 1 else 1 for w in workers]
        self._held_max = [max(2, w.num_streams) for w in workers]  # runs each holds at once

    def capacity(self, w: ModelWorker) -> int:
        """Runs `w` may hold at once."""
        return 0 if self.held[w.index] else self._held_max[w.index]

    def idle(self, w: ModelWorker) -> bool:
        """Nothing of `w` is in flight."""
        return self.in_flight[w.index] == 0

    @property
    def busy(self) -> bool:
        """Some worker has a run in flight."""
        return any(self.in_flight)

    @property
    def stalled(self) -> bool:
        """Nothing of the model runs, and nothing is ready but partial batches that wait
        for a flush (`batching: fill` / `wait`)."""
        b = self.batcher
        return not self.busy and not (b.num_ready and not (b.fill or b.wait))

    def take_stream(self, w: ModelWorker, inline: bool = False) -> int:
        """A free stream of `w` for a run (held by an inline run with `inline`)."""
        self.in_flight[w.index] += 1
        self.held[w.index] = inline
        return self.free[w.index].pop() if w.num_streams > 1 else 0

    def give_back_stream(self, i: int, stream: int) -> None:
        """Worker `i`'s `stream` is free again after a run."""
        self.in_flight[i] -= 1
        self.held[i] = False
        if self.workers[i].num_streams > 1:
            self.free[i].append(stream)

    def healthy(self) -> list[ModelWorker]:
        return [w for w in self.workers if w.healthy]

    def unusable(self) -> str | None:
        """Why no run can go to this model ("dead", "unhealthy" with `fail` health), or
        None."""
        if all(w.dead for w in self.workers):
            return "dead"
        if self.fail_fast and not any(w.healthy for w in self.workers):
            return "unhealthy"
        return None

    def open_room(self) -> dict[int, int]:
        """Per healthy worker (index) that may take a run, how many it may still take."""
        room = {}
        held, held_max, in_flight = self.held, self._held_max, self.in_flight
        for w in self.workers:
            if w.healthy:
                i = w.index
                n = (0 if held[i] else held_max[i]) - in_flight[i]
                if n > 0:
                    room[i] = n
        return room
