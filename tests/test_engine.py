"""BuildBatch: same-shape grouping, full batches, the window, and the idle-worker rule."""

from __future__ import annotations

import numpy as np

from inferchain.config import ModelConfig
from inferchain.engine import Batch, ModelBatcher
from inferchain.request import Request, RequestState

S = RequestState


class Sink:
    def __init__(self) -> None:
        self.busy = False
        self.healthy = True
        self.dead = False
        self.batches: list[Batch] = []

    def dispatch(self, batch: Batch) -> None:
        self.batches.append(batch)


def ready(i: int, shape: tuple[int, ...] = (4,)) -> Request:
    r = Request(i, "m", (np.zeros(shape, np.float32),))
    r.transition(S.READY)
    return r


def batcher(workers: list[Sink], max_batch: int = 4, delay_ms: float = 50) -> ModelBatcher:
    model = ModelConfig(name="m", path="-", max_batch_size=max_batch, max_queue_delay_ms=delay_ms)
    return ModelBatcher(model, workers)


def test_groups_by_shape_and_caps_at_max_batch() -> None:
    w = Sink()
    b = batcher([w])
    b.add([ready(i, (4,)) for i in range(6)] + [ready(10, (5,))])
    b.step(0.0)  # all workers idle: the oldest group goes at once, full
    assert [r.id for r in w.batches[0].requests] == [0, 1, 2, 3]
    assert w.batches[0].shape_key == ((4,),)
    assert all(r.state is S.RUNNING for r in w.batches[0].requests)
    assert w.busy


def test_busy_worker_gets_nothing_and_window_holds_partial_batches() -> None:
    busy, idle = Sink(), Sink()
    busy.busy = True
    b = batcher([busy, idle], delay_ms=50)
    first = ready(1)
    b.add([first])
    now = first.stamp(S.READY)
    assert now is not None
    due = b.step(now)  # one worker busy: wait for more or for the window
    assert idle.batches == [] and due == now + 0.05
    b.step(now + 0.06)  # window expired
    assert [r.id for r in idle.batches[0].requests] == [1]
    assert busy.batches == []


def test_full_group_goes_even_inside_the_window() -> None:
    busy, idle = Sink(), Sink()
    busy.busy = True
    b = batcher([busy, idle], max_batch=2)
    reqs = [ready(i) for i in range(2)]
    b.add(reqs)
    b.step(reqs[0].stamp(S.READY))  # type: ignore[arg-type]
    assert [r.id for r in idle.batches[0].requests] == [0, 1]


def test_cancelled_ready_requests_are_skipped() -> None:
    w = Sink()
    b = batcher([w])
    reqs = [ready(i) for i in range(3)]
    reqs[1].cancel()
    b.add(reqs)
    b.step(0.0)
    assert [r.id for r in w.batches[0].requests] == [0, 2]
    assert b.num_ready == 0
