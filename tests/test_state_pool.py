"""StatePool (lanes of carried state) and StepBatcher (steps until they make a batch), driven
without threads: they call nobody, and return what the engine is to run."""

from __future__ import annotations

import numpy as np
import pytest

from inferchain.config import ModelConfig
from inferchain.core.request import Request
from inferchain.core.state_pool import StatePool
from inferchain.core.step_batcher import StepBatcher, cohort_size
from inferchain.errors import InvalidInput, QueueFull
from inferchain.inputs import InputSpec
from inferchain.shapes import ShapePolicy
from inferchain.tensors import TensorDesc

F32 = np.float32
INPUTS = [TensorDesc("x", (None, 4), F32), TensorDesc("state", (None, 4), F32)]
OUTPUTS = [TensorDesc("y", (None, 4), F32), TensorDesc("state_out", (None, 4), F32)]


def pool(size: int = 4) -> StatePool:
    """Lanes of a model whose output 1 is carried into input 1 ("state")."""
    return StatePool("m", [(1, 1, "state")], [(4,)], [np.dtype(F32)], size)


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


def test_lanes_are_taken_set_to_their_initial_state_and_given_back() -> None:
    p = pool(2)
    a = p.acquire({"state": np.full(4, 3, F32)})
    b = p.acquire({})
    assert sorted([int(a[0]), int(b[0])]) == [0, 1] and p.num_open == 2
    assert p.arrays[1][a[0]].tolist() == [3] * 4 and p.arrays[1][b[0]].tolist() == [0] * 4
    with pytest.raises(QueueFull, match="all 2 sequence lanes are in use"):
        p.acquire({}, timeout=0)
    assert p.try_acquire(None) is None
    p.release(a)
    assert p.num_free == 1 and p.try_acquire(None) is not None


def test_a_wrong_initial_state_names_the_state_and_frees_the_lanes() -> None:
    p = pool(2)
    with pytest.raises(InvalidInput, match=r"state 'state': expected .* \(4,\).* got \(3,\)"):
        p.acquire({"state": np.zeros(3, F32)})
    assert p.num_free == 2


def test_move_gives_lanes_the_state_of_others_and_state_rows_live_only_on_the_device() -> None:
    p = pool(3)
    lanes = p.acquire({"state": np.arange(12, dtype=F32).reshape(3, 4)}, rows=3)
    p.move(lanes, lanes[[2, 2, 0]])  # a reorder: row j goes on from row order[j]'s state
    assert p.arrays[1][lanes][:, 0].tolist() == [8, 8, 8 - 8]
    assert p.state_rows(lanes) is None  # on the host: the rows are gathered from the arrays
    p.on_device = True
    p.release(lanes)
    lanes = p.acquire({}, rows=2)
    first = p.state_rows(lanes)
    assert first is not None and first.fresh.tolist() == [True, True]
    again = p.state_rows(lanes)  # no longer first steps
    assert again is not None and again.fresh.tolist() == [False, False]
    assert again.read.tolist() == lanes.tolist() == again.write.tolist()


def test_a_lane_past_its_first_step_loses_its_state_with_a_reloaded_session() -> None:
    p = pool(2)
    p.on_device = True
    stepped, fresh = p.acquire({}), p.acquire({})
    rows = p.state_rows(stepped)  # `stepped` takes a step, `fresh` not yet
    assert rows is not None and not p.launching(rows)
    p.lose()
    assert p.lost(stepped) and not p.lost(fresh)
    assert p.launching(p.state_rows(stepped))  # type: ignore[arg-type]


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


def test_partitions_keep_a_sequence_on_one_instance_and_a_reload_loses_only_its_own() -> None:
    p = pool(4)
    p.on_device = True
    p.partition(2)  # lanes 0-1: instance 0, lanes 2-3: instance 1
    a = p.acquire({}, rows=2)  # the partition with the most free lanes
    b = p.acquire({}, rows=2)
    assert {p.worker_of(a), p.worker_of(b)} == {0, 1}
    assert len({p.partition_of(int(lane)) for lane in a}) == 1  # one sequence, one instance
    with pytest.raises(QueueFull):
        p.acquire({}, timeout=0)
    p.state_rows(a), p.state_rows(b)  # both past their first step
    p.lose(worker=p.worker_of(a) or 0)
    assert p.lost(a) and not p.lost(b)
    p.release(b)
    assert p.try_acquire(None, rows=2) is not None  # its partition is free again
    assert p.try_acquire(None, rows=1) is None


def test_a_sequence_larger_than_a_partition_is_refused() -> None:
    p = pool(4)
    p.on_device = True
    p.partition(2)
    with pytest.raises(InvalidInput, match="does not fit one batch of 2"):
        p.acquire({}, rows=3)
