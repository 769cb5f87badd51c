"""BuildBatch and the host buffers: same-shape groups cut into batches by row range, the
batching window, skipped cancelled rows, and feeding a batch's slices to a worker."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from inferchain.config import ModelConfig
from inferchain.core.batcher import ModelBatcher
from inferchain.core.buffers import HostBuffers
from inferchain.core.records import Batch, ShapeKey, Slice
from inferchain.core.request import Request, RequestState
from inferchain.core.work import Work
from inferchain.tensors import TensorDesc

S = RequestState
T0 = 100.0  # perf_counter seconds when the first work is admitted


# -- builders ---------------------------------------------------------------------------------


def create_batcher(
    max_batch: int = 4, delay_ms: float = 50.0, batching: str = "window"
) -> ModelBatcher:
    model = ModelConfig(
        name="m",
        path="unused",
        max_batch_size=max_batch,
        max_queue_delay_ms=delay_ms,
        batching=batching,
    )
    return ModelBatcher(model)


def create_work(
    id: int,
    rows: int = 1,
    *,
    width: int = 4,
    key: ShapeKey | None = None,
    admitted: float = T0,
    per_item: bool = False,
    batch_key: Hashable = None,
) -> Work:
    """A READY work of `rows` rows of float32[width] (row i holds id * 1000 + i), batched
    under `key` (default: its own shape) and `batch_key` (default: the shape key); with
    `per_item`, one READY Request a row."""
    x = np.arange(rows * width, dtype=np.float32).reshape(rows, width) // width + id * 1000
    exact = ((width,),)
    requests = None
    if per_item:
        requests = tuple(Request(id + i, "m", (x[i],)) for i in range(rows))
        for r in requests:
            r.transition(S.READY)
    work = Work(
        id,
        "m",
        (x,),
        shape_key=exact if key is None else key,
        exact=exact,
        names=("y",),
        submitted=admitted,
        requests=requests,
        batch_key=batch_key,
    )
    work.state = S.READY
    work.admitted = admitted
    return work


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
    assert eager.due(T0 + 0.001, all_idle=True) == (key, float("inf"))
    assert patient.due(T0 + 0.001, all_idle=True) == (None, T0 + 0.05)
    assert patient.due(T0 + 0.05, all_idle=True)[0] == key  # its window has passed
    patient.add(create_work(2, rows=2))
    assert patient.due(T0 + 0.001, all_idle=True)[0] == key  # a full batch goes at once


def test_a_flush_sends_a_waiting_partial_batch_until_the_batcher_is_empty() -> None:
    b = create_batcher(batching="wait")
    b.add(create_work(1))
    b.flushing = True
    key, _ = b.due(T0, all_idle=False)
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
    assert b.due(T0 + 0.01, all_idle=False) == (None, T0 + 0.05)
    assert b.due(T0 + 0.01, all_idle=True) == (work.shape_key, float("inf"))
    assert b.due(T0 + 0.05, all_idle=False)[0] == work.shape_key


def test_a_full_group_goes_at_once_inside_the_window() -> None:
    b = create_batcher(max_batch=2, delay_ms=50)
    b.add(create_work(1, admitted=T0))
    assert b.due(T0, all_idle=False)[0] is None
    b.add(create_work(2, admitted=T0))
    assert b.due(T0, all_idle=False)[0] == ((4,),)


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
    assert b.due(T0, all_idle=False) == (((6,),), T0 + 0.06)
    b.take(((6,),))
    assert b.due(T0, all_idle=False) == (None, T0 + 0.06)


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
    b.forget(dropped, 2)  # as the engine drops its untaken rows
    dropped.taken = dropped.rows
    assert b.num_ready == 2
    slices, rows = b.take(dropped.shape_key)
    assert spans(slices) == [(2, 0, 2, 0)] and rows == 2
    assert b.num_ready == 0


def test_forget_of_a_work_no_group_holds_changes_nothing() -> None:
    b = create_batcher()
    b.add(create_work(1, rows=3))
    b.forget(create_work(2, width=7), 1)
    assert b.num_ready == 3


def test_drain_hands_back_every_work_with_untaken_rows_and_empties_the_batcher() -> None:
    b = create_batcher(max_batch=4)
    works = [create_work(1, rows=6), create_work(2, width=5), create_work(3)]
    for w in works:
        b.add(w)
    b.take(((4,),))
    assert sorted(w.id for w in b.drain()) == [1, 2, 3]
    assert b.num_ready == 0 and not b.groups
    assert b.due(T0, all_idle=True) == (None, float("inf"))


# -- HostBuffers.feed -------------------------------------------------------------------------


def create_buffers(width: int = 4, rows: int = 4, pad_value: float = 0.0) -> HostBuffers:
    return HostBuffers([TensorDesc("x", (None, width), np.float32)], rows, pad_value)


def batch_of(*slices: Slice, key: ShapeKey = ((4,),)) -> Batch:
    return Batch("m", 0, 0, slices, sum(s.rows for s in slices), key, T0)


def test_one_exact_slice_is_fed_as_a_view_of_the_work_inputs() -> None:
    work = create_work(1, rows=6)
    (fed,) = create_buffers().feed(batch_of(Slice(work, 2, 5, 0)))
    assert np.shares_memory(fed, work.inputs[0])
    np.testing.assert_array_equal(fed, work.inputs[0][2:5])


def test_several_slices_are_copied_into_the_buffer_in_batch_order() -> None:
    buffers = create_buffers()
    first, second = create_work(1, rows=3), create_work(2, rows=3)
    (fed,) = buffers.feed(batch_of(Slice(first, 1, 3, 0), Slice(second, 0, 2, 2)))
    assert fed.shape == (4, 4)
    assert not np.shares_memory(fed, first.inputs[0])
    assert np.shares_memory(fed, buffers.get(0, ((4,),))[0])
    np.testing.assert_array_equal(fed, np.concatenate([first.inputs[0][1:3], second.inputs[0][:2]]))


def test_padded_rows_are_padded_with_pad_value_even_in_a_reused_buffer() -> None:
    buffers = create_buffers(width=4, pad_value=-1.0)
    full = create_work(1, rows=4, width=4)
    buffers.feed(batch_of(Slice(full, 0, 2, 0), Slice(full, 2, 4, 2)))  # fills the buffer
    short = create_work(2, rows=2, width=2, key=((4,),))
    (fed,) = buffers.feed(batch_of(Slice(short, 0, 2, 0)))
    assert not np.shares_memory(fed, short.inputs[0])
    np.testing.assert_array_equal(fed[:, :2], short.inputs[0])
    assert (fed[:, 2:] == -1.0).all()


def test_a_work_that_does_not_batch_is_fed_its_inputs_untouched() -> None:
    x = np.ones((3, 4), np.float32)
    work = Work(1, "m", (x,), shape_key=((3, 4),), exact=((3, 4),), names=("y",),
                submitted=T0, batched=False)  # fmt: skip
    (fed,) = create_buffers().feed(batch_of(Slice(work, 0, 1, 0), key=((3, 4),)))
    assert fed is x


# -- HostBuffers.feed with batch axes and unbatched inputs ------------------------------------

LAID_OUT = [
    TensorDesc("x", (None, 3), np.float32),  # rows on axis 0
    TensorDesc("state", (2, None, 3), np.float32),  # rows on axis 1
    TensorDesc("gain", (), np.float32),  # one value per batch
]


def create_state_work(id: int, rows: int, gain: float = 2.0, width: int = 3) -> Work:
    """A READY work of `rows` items (x [width], state [2, width], gain), rows on axis 0 as
    every Work keeps them; x row i holds id * 1000 + i, state row i that and its negation."""
    x = np.arange(rows, dtype=np.float32)[:, None] + id * 1000 + np.zeros(width, np.float32)
    state = np.stack([x, -x], axis=1)
    gains = np.broadcast_to(np.float32(gain), (rows,))
    exact = ((width,), (2, width), ())
    work = Work(id, "m", (x, state, gains), shape_key=exact, exact=exact, names=("y",),
                submitted=T0)  # fmt: skip
    work.state = S.READY
    return work


def test_rows_on_axis_1_are_copied_once_into_a_contiguous_buffer_in_the_model_layout() -> None:
    buffers = HostBuffers(LAID_OUT, 4, axes=(0, 1, None))
    first, second = create_state_work(1, rows=3), create_state_work(2, rows=3)
    key = first.shape_key
    x, state, gain = buffers.feed(batch_of(Slice(first, 1, 3, 0), Slice(second, 0, 1, 2), key=key))
    rows = np.concatenate([first.inputs[1][1:3], second.inputs[1][:1]])
    assert state.shape == (2, 3, 3) and state.flags.c_contiguous
    assert np.shares_memory(state, buffers.get(0, key)[1])
    np.testing.assert_array_equal(state, np.moveaxis(rows, 0, 1))
    np.testing.assert_array_equal(x, np.concatenate([first.inputs[0][1:3], second.inputs[0][:1]]))
    assert gain.shape == () and gain == np.float32(2.0)  # once, as the model declares it


def test_one_exact_slice_feeds_axis_0_as_a_view_and_axis_1_through_its_buffer() -> None:
    buffers = HostBuffers(LAID_OUT, 4, axes=(0, 1, None))
    work = create_state_work(1, rows=4)
    x, state, _ = buffers.feed(batch_of(Slice(work, 0, 4, 0), key=work.shape_key))
    assert np.shares_memory(x, work.inputs[0])
    assert not np.shares_memory(state, work.inputs[1]) and state.flags.c_contiguous
    np.testing.assert_array_equal(state, np.moveaxis(work.inputs[1], 0, 1))


def test_rows_on_axis_1_smaller_than_the_bucket_are_padded_in_the_model_layout() -> None:
    buffers = HostBuffers(LAID_OUT, 4, pad_value=-1.0, axes=(0, 1, None))
    short = create_state_work(1, rows=2, width=2)
    key = ((3,), (2, 3), ())
    _, state, _ = buffers.feed(batch_of(Slice(short, 0, 2, 0), key=key))
    assert state.shape == (2, 2, 3)
    np.testing.assert_array_equal(state[:, :, :2], np.moveaxis(short.inputs[1], 0, 1))
    assert (state[:, :, 2] == -1.0).all()


def test_warm_up_zeros_have_the_model_layout_at_the_max_batch() -> None:
    buffers = HostBuffers(LAID_OUT, 4, axes=(0, 1, None))
    x, state, gain = buffers.zeros(0, ((3,), (2, 3), ()))
    assert (x.shape, state.shape, gain.shape) == ((4, 3), (2, 4, 3), ())
    assert not (x.any() or state.any() or gain.any())
