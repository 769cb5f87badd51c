"""StepBatcher: the steps of `oi.sequence()` until they make a batch, driven without threads.
It calls nobody: `add`, `due` and `flush` return the Works the engine is to run."""

from __future__ import annotations

import numpy as np
import pytest
from test_state_pool import pool

from inferchain.config import ModelConfig
from inferchain.core.request import Request
from inferchain.core.state_pool import StatePool
from inferchain.core.step_batcher import StepBatcher, cohort_size
from inferchain.inputs import InputSpec
from inferchain.shapes import ShapePolicy
from inferchain.tensors import TensorDesc

F32 = np.float32
INPUTS = [TensorDesc("x", (None, 4), F32), TensorDesc("state", (None, 4), F32)]
OUTPUTS = [TensorDesc("y", (None, 4), F32), TensorDesc("state_out", (None, 4), F32)]


def batcher(p: StatePool, *, batch: int = 4, delay_s: float = 0.05) -> StepBatcher:
    model = ModelConfig(name="m", path="unused", max_batch_size=batch)
    return StepBatcher(
        p,
        InputSpec("m", INPUTS, batching=True),
        names=("y", "state_out"),
        shapes=ShapePolicy(model, INPUTS, OUTPUTS),
        batch_rows=batch,
        delay_s=delay_s,
        cohorts=2,
    )


def test_cohort_size_is_an_equal_share_of_the_open_rows_bounded_by_a_batch() -> None:
    assert [cohort_size(n, 2, 4) for n in (0, 1, 3, 4, 7, 20)] == [1, 1, 2, 2, 4, 4]


def step(b: StepBatcher, lane: int, rid: int, value: float) -> tuple[list, bool, Request]:
    item, key = b.item({"x": np.full(4, value, F32)}, lane)
    request = b.request(rid, item, None, lambda r: None)
    formed, new_group = b.add([request], [lane], [item], [key])
    return formed, new_group, request


def test_a_group_leaves_as_one_work_once_it_holds_a_cohort() -> None:
    p = pool(4)
    b = batcher(p)
    lanes = [int(p.acquire({})[0]) for _ in range(4)]  # 4 open rows: cohorts of 2
    formed, new_group, first = step(b, lanes[0], 1, 1.0)
    assert formed == [] and new_group and b.num_pending == 1
    formed, new_group, second = step(b, lanes[1], 2, 2.0)
    assert not new_group and b.num_pending == 0
    (work,) = formed
    assert work.steps is not None and work.steps.queued and work.alone
    assert work.lanes is not None and work.lanes.tolist() == lanes[:2]
    assert [r.work for r in (first, second)] == [work, work]
    assert work.inputs[0][:, 0].tolist() == [1.0, 2.0]  # the steps' rows, stacked
    assert work.inputs[1].tolist() == [[0.0] * 4] * 2  # the lanes' carried state
    assert work.lock is b.lock and first._lock is b.lock


def test_steps_whose_window_passed_leave_from_due_and_every_open_row_in_flushes_all() -> None:
    p = pool(4)
    b = batcher(p, delay_s=0.05)
    lanes = [int(p.acquire({})[0]) for _ in range(3)]
    step(b, lanes[0], 1, 1.0)
    since = b._groups[next(iter(b._groups))].since
    works, next_due = b.due(since + 0.01)
    assert works == [] and next_due == pytest.approx(since + 0.05)
    works, _ = b.due(since + 0.06)
    assert [w.rows for w in works] == [1]
    b.landed(1)  # that step ended
    formed, _, _ = step(b, lanes[1], 2, 2.0)
    assert formed == []  # 1 of a cohort of 2
    p.release(np.array([lanes[0], lanes[2]]))  # the others close: every open row has stepped
    works, _ = b.due(0.0)
    assert [w.rows for w in works] == [1]


def test_a_cancelled_step_leaves_its_group_or_tells_the_caller_the_engine_must_hear() -> None:
    p = pool(4)
    b = batcher(p)
    lanes = [int(p.acquire({})[0]) for _ in range(4)]
    _, _, queued = step(b, lanes[0], 1, 1.0)
    assert b.cancelled(queued) and b.num_pending == 0
    step(b, lanes[1], 2, 2.0)
    formed, _, in_work = step(b, lanes[2], 3, 3.0)
    assert formed and not b.cancelled(in_work)  # in a Work: the engine ends it
