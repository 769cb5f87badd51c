"""StatePool: lanes of carried state, taken and given back, moved, on the device and in
partitions of instances; driven without threads."""

from __future__ import annotations

import numpy as np
import pytest

from inferchain.core.state_pool import StatePool
from inferchain.errors import InvalidInput, QueueFull

F32 = np.float32


def pool(size: int = 4) -> StatePool:
    """Lanes of a model whose output 1 is carried into input 1 ("state")."""
    return StatePool("m", [(1, 1, "state")], [(4,)], [np.dtype(F32)], size)


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
