"""BuildBatch: same-shape groups cut into batches by row range, the batching window, skipped
cancelled rows."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from hypothesis import given
from hypothesis import strategies as st

from inferchain.core.records import Slice
from inferchain.core.request import RequestState
from inferchain.core.work import Work
from inferchain.testing import builders
from inferchain.testing.builders import create_batcher

S = RequestState
T0 = 100.0  # perf_counter seconds when the first work is admitted


# -- builders ---------------------------------------------------------------------------------

create_work = partial(builders.create_work, admitted=T0)  # READY, as the Scheduler leaves it


def spans(slices: Sequence[Slice]) -> list[tuple[int, int, int, int]]:
    """(work id, start, stop, offset) of each slice."""
    return [(s.work.id, s.start, s.stop, s.offset) for s in slices]


def untaken(works: Sequence[Work]) -> int:
    return sum(w.rows - w.taken for w in works)


# -- when a group is due ----------------------------------------------------------------------


def test_window_sends_at_once_when_idle_and_wait_waits_for_the_window() -> None:
    eager, patient = create_batcher(batching="window"), create_batcher(batching="wait")
    for b in (eager, patient):
        b.add(create_work(1, rows=2))
    key = ((4,),)
    assert eager.due(T0 + 0.001, all_idle=True) == (key, True, None, float("inf"))  # partial
    assert patient.due(T0 + 0.001, all_idle=True) == (None, False, None, T0 + 0.05)
    assert patient.due(T0 + 0.05, all_idle=True)[0] == key  # its window has passed
    patient.add(create_work(2, rows=2))
    assert patient.due(T0 + 0.001, all_idle=True)[:2] == (key, False)  # a full batch at once


def test_a_flush_sends_a_waiting_partial_batch_until_the_batcher_is_empty() -> None:
    b = create_batcher(batching="wait")
    b.add(create_work(1))
    b.flushing = True
    key, partial, _, _ = b.due(T0, all_idle=False)
    assert partial
    assert key == ((4,),)
    b.take(key)
    assert not b.flushing
    b.add(create_work(2))
    assert b.due(T0, all_idle=True)[0] is None


# -- grouping and cutting ---------------------------------------------------------------------


def test_rows_are_grouped_by_shape_key() -> None:
    b = create_batcher()
    b.add(create_work(1, width=4))
    b.add(create_work(2, width=5))
    b.add(create_work(3, width=4))
    assert sorted(b.groups) == [((4,),), ((5,),)]
    slices, rows = b.take(((4,),))
    assert spans(slices) == [(1, 0, 1, 0), (3, 0, 1, 1)] and rows == 2
    assert b.num_ready == 1
    assert sorted(b.groups) == [((5,),)]


def test_rows_of_one_shape_with_other_unbatched_values_never_share_a_batch() -> None:
    b = create_batcher()
    works = [create_work(i, batch_key=(((4,),), (((), bytes([i % 2])),))) for i in range(1, 5)]
    for w in works:
        b.add(w)
    assert len(b.groups) == 2
    for key in list(b.groups):
        slices, rows = b.take(key)
        assert rows == 2 and len({s.work.batch_key for s in slices}) == 1
    assert not b.groups and b.num_ready == 0


def test_a_work_spans_several_batches_of_at_most_max_batch_rows() -> None:
    b = create_batcher(max_batch=4)
    work = create_work(1, rows=10)
    b.add(work)
    key = work.shape_key
    cut = []
    while key in b.groups:
        slices, rows = b.take(key)
        assert rows <= 4
        cut.extend(spans(slices))
    assert cut == [(1, 0, 4, 0), (1, 4, 8, 0), (1, 8, 10, 0)]
    assert work.taken == 10 and b.num_ready == 0
    assert work.state is S.RUNNING


def test_several_works_share_one_batch_at_consecutive_offsets() -> None:
    b = create_batcher(max_batch=4)
    first, second = create_work(1, rows=2), create_work(2, rows=3)
    b.add(first)
    b.add(second)
    slices, rows = b.take(first.shape_key)
    assert spans(slices) == [(1, 0, 2, 0), (2, 0, 2, 2)] and rows == 4
    assert first.state is S.RUNNING and second.state is S.RUNNING
    slices, rows = b.take(first.shape_key)
    assert spans(slices) == [(2, 2, 3, 0)] and rows == 1
    assert not b.groups


def test_a_model_that_does_not_batch_takes_one_row_at_a_time() -> None:
    b = create_batcher(max_batch=0)
    b.add(create_work(1))
    b.add(create_work(2))
    slices, rows = b.take(((4,),))
    assert spans(slices) == [(1, 0, 1, 0)] and rows == 1


@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    max_batch=st.integers(1, 5),
)
def test_batches_cover_every_row_once_in_order_and_num_ready_follows(
    sizes: list[int], max_batch: int
) -> None:
    b = create_batcher(max_batch=max_batch)
    works = [create_work(i, rows=n) for i, n in enumerate(sizes, 1)]
    for w in works:
        b.add(w)
    assert b.num_ready == sum(sizes)
    taken: list[tuple[int, int]] = []  # (work id, row), in the order rows were batched
    while b.groups:
        slices, rows = b.take(((4,),))
        assert 0 < rows <= max_batch
        offset = 0
        for s in slices:
            assert s.offset == offset and s.rows > 0
            offset += s.rows
            taken.extend((s.work.id, r) for r in range(s.start, s.stop))
        assert offset == rows
        assert b.num_ready == untaken(works)
    assert taken == [(w.id, r) for w in works for r in range(w.rows)]


# -- the batching window ----------------------------------------------------------------------


def test_a_partial_group_waits_for_the_window_unless_every_worker_is_idle() -> None:
    b = create_batcher(max_batch=4, delay_ms=50)
    work = create_work(1, rows=1, admitted=T0)
    b.add(work)
    assert b.due(T0 + 0.01, all_idle=False) == (None, False, None, T0 + 0.05)
    assert b.due(T0 + 0.01, all_idle=True) == (work.shape_key, True, None, float("inf"))
    assert b.due(T0 + 0.05, all_idle=False)[0] == work.shape_key


def test_a_full_group_goes_at_once_inside_the_window() -> None:
    b = create_batcher(max_batch=2, delay_ms=50)
    b.add(create_work(1, admitted=T0))
    assert b.due(T0, all_idle=False)[0] is None
    b.add(create_work(2, admitted=T0))
    assert b.due(T0, all_idle=False)[:2] == (((4,),), False)  # full batches only


def test_the_group_whose_oldest_work_waited_longest_goes_first() -> None:
    b = create_batcher(max_batch=4, delay_ms=50)
    b.add(create_work(1, width=4, admitted=T0 + 1.0))
    b.add(create_work(2, width=5, admitted=T0))
    assert b.due(T0 + 2.0, all_idle=False)[0] == ((5,),)
    assert b.due(T0 + 2.0, all_idle=True)[0] == ((5,),)


def test_a_due_group_goes_first_and_next_due_is_the_earliest_window_of_the_others() -> None:
    b = create_batcher(max_batch=4, delay_ms=50)
    b.add(create_work(1, width=4, admitted=T0 + 0.02))
    b.add(create_work(2, width=5, admitted=T0 + 0.01))
    b.add(create_work(3, width=6, admitted=T0 - 1.0))
    assert b.due(T0, all_idle=False) == (((6,),), True, None, T0 + 0.06)
    b.take(((6,),))
    assert b.due(T0, all_idle=False) == (None, False, None, T0 + 0.06)


# -- cancelled rows, forget, drain ------------------------------------------------------------


def test_rows_whose_request_was_cancelled_are_skipped_and_the_rest_move_to_running() -> None:
    b = create_batcher(max_batch=8)
    work = create_work(10, rows=5, per_item=True)
    requests = work.requests
    assert requests is not None
    requests[1].cancel()
    requests[3].cancel()
    b.add(work)
    slices, rows = b.take(work.shape_key)
    assert spans(slices) == [(10, 0, 1, 0), (10, 2, 3, 1), (10, 4, 5, 2)] and rows == 3
    assert [r.state for r in requests] == [
        S.RUNNING,
        S.CANCELLED,
        S.RUNNING,
        S.CANCELLED,
        S.RUNNING,
    ]
    assert work.taken == 5 and b.num_ready == 0 and not b.groups


def test_a_batch_with_skipped_rows_is_filled_from_the_rows_after_them() -> None:
    b = create_batcher(max_batch=4)
    work = create_work(10, rows=6, per_item=True)
    assert work.requests is not None
    work.requests[0].cancel()
    b.add(work)
    slices, rows = b.take(work.shape_key)
    assert spans(slices) == [(10, 1, 4, 0), (10, 4, 5, 3)] and rows == 4
    assert b.num_ready == 1


def test_a_work_whose_every_row_was_cancelled_yields_no_slices_and_leaves() -> None:
    b = create_batcher()
    work = create_work(10, rows=2, per_item=True)
    assert work.requests is not None
    for r in work.requests:
        r.cancel()
    b.add(work)
    assert b.take(work.shape_key) == ([], 0)
    assert b.num_ready == 0 and not b.groups


def test_forget_removes_dropped_rows_from_num_ready_and_take_skips_the_work() -> None:
    b = create_batcher(max_batch=4)
    dropped, kept = create_work(1, rows=6), create_work(2, rows=2)
    b.add(dropped)
    b.add(kept)
    b.take(dropped.shape_key)  # rows 0-4 of `dropped`
    assert b.forget(dropped) == 2  # as the engine drops its untaken rows
    assert dropped.taken == dropped.rows and b.num_ready == 2
    slices, rows = b.take(dropped.shape_key)
    assert spans(slices) == [(2, 0, 2, 0)] and rows == 2
    assert b.num_ready == 0


def test_forget_of_a_work_no_group_holds_changes_nothing() -> None:
    b = create_batcher()
    b.add(create_work(1, rows=3))
    other = create_work(2, width=7)
    assert b.forget(other) == 1 and other.taken == 1
    assert b.num_ready == 3


def test_drain_hands_back_every_work_with_untaken_rows_and_empties_the_batcher() -> None:
    b = create_batcher(max_batch=4)
    works = [create_work(1, rows=6), create_work(2, width=5), create_work(3)]
    for w in works:
        b.add(w)
    b.take(((4,),))
    assert sorted(w.id for w in b.drain()) == [1, 2, 3]
    assert b.num_ready == 0 and not b.groups
    assert b.due(T0, all_idle=True) == (None, False, None, float("inf"))


def test_a_run_takes_several_batches_of_a_work_and_its_partial_tail_only_when_due() -> None:
    b = create_batcher(max_batch=4, delay_ms=50)
    b.add(create_work(1, rows=10, admitted=T0))
    slices, rows = b.take(((4,),), batches=4, partial=False)  # full batches only
    assert [(s.start, s.stop, s.offset) for s in slices] == [(0, 8, 0)] and rows == 8
    b.add(create_work(2, rows=3, admitted=T0))
    slices, rows = b.take(((4,),), batches=4, partial=True)  # the tail joins work 2's rows
    assert [(s.work.id, s.start, s.stop, s.offset) for s in slices] == [(1, 8, 10, 0), (2, 0, 3, 2)]
    assert rows == 5 and b.num_ready == 0
