"""WorkerSet: one model's workers as the engine dispatches to them: streams, capacity, load.

The engine's loop is the one writer of every field; `run_now` writes them under the
engine's lock too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from inferchain.config import ModelConfig
from inferchain.core.batcher import ModelBatcher
from inferchain.core.records import BatchResult
from inferchain.shapes import ShapePolicy

if TYPE_CHECKING:  # the engine reads a worker's surface only: no backend is imported
    from inferchain.core.worker import ModelWorker

QUEUE_S = 0.002  # seconds of batches a one-stream worker may hold at once ...
QUEUE_MAX = 32  # ... up to this many batches


class WorkerSet:
    """One model as the engine sees it: its batcher, its workers and their free streams.

    A worker with several streams holds one batch per stream. A worker with one stream takes
    several batches at once on it, as many as run in about QUEUE_S (at least 2): the next
    ones wait in its queue while one runs, so short batches leave no idle gap of a thread
    hand-off between them.
    """

    def __init__(
        self, config: ModelConfig, workers: Sequence[ModelWorker], shapes: ShapePolicy
    ) -> None:
        self.config = config
        self.name = config.name
        self.batcher = ModelBatcher(config)
        self.workers = workers
        self.crops = shapes.crops
        self.longest = shapes.longest  # a batch is padded to its rows' envelope
        self.fail_fast = config.health.while_unhealthy == "fail"
        self.free: list[list[int]] = [list(range(w.num_streams)) for w in workers]
        self.in_flight = [0] * len(workers)  # batches dispatched and not yet back
        self.batch_s = [0.0] * len(workers)  # moving average of a batch's wall time

    def capacity(self, w: ModelWorker) -> int:
        """Batches `w` may hold at once."""
        if w.num_streams > 1:
            return w.num_streams
        avg = self.batch_s[w.index]
        return QUEUE_MAX if avg <= 0 else max(2, min(QUEUE_MAX, int(QUEUE_S / avg)))

    def idle(self, w: ModelWorker) -> bool:
        """Nothing of `w` is in flight."""
        return self.in_flight[w.index] == 0

    @property
    def busy(self) -> bool:
        """Some worker has a batch in flight."""
        return any(self.in_flight)

    def take_stream(self, w: ModelWorker) -> int:
        self.in_flight[w.index] += 1
        return self.free[w.index].pop() if w.num_streams > 1 else 0

    def give_back(self, result: BatchResult) -> None:
        t = result.timing
        self.give_back_stream(result.batch.worker, result.batch.stream, t.end - t.picked)

    def give_back_stream(self, i: int, stream: int, wall: float) -> None:
        """Worker `i`'s `stream` is free again after a batch of `wall` seconds."""
        self.in_flight[i] -= 1
        if self.workers[i].num_streams > 1:
            self.free[i].append(stream)
        self.batch_s[i] = wall if self.batch_s[i] <= 0 else 0.8 * self.batch_s[i] + 0.2 * wall

    def idle_worker(self) -> ModelWorker | None:
        """A healthy worker with nothing in flight."""
        for w in self.workers:
            if w.healthy and self.idle(w):
                return w
        return None

    def healthy(self) -> list[ModelWorker]:
        return [w for w in self.workers if w.healthy]

    def unusable(self) -> str | None:
        """Why no batch can run on this model ("dead", "unhealthy" with `fail` health), or
        None."""
        if all(w.dead for w in self.workers):
            return "dead"
        if self.fail_fast and not any(w.healthy for w in self.workers):
            return "unhealthy"
        return None

    def open_room(self) -> dict[int, int]:
        """Per healthy worker (index), the batches it may still take."""
        return {w.index: self.capacity(w) - self.in_flight[w.index] for w in self.healthy()}
