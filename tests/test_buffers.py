"""The host buffers: feeding a batch's slices to a worker, as views where they can be, padded
and laid out as the model wants them."""

from __future__ import annotations

from functools import partial

import numpy as np

from inferchain.core.buffers import HostBuffers
from inferchain.core.records import Run, ShapeKey, Slice
from inferchain.core.request import RequestState
from inferchain.core.work import Work
from inferchain.tensors import TensorDesc
from inferchain.testing import builders

S = RequestState
T0 = 100.0  # perf_counter seconds when the first work is admitted
create_work = partial(builders.create_work, admitted=T0)  # READY, as the Scheduler leaves it


# -- HostBuffers.feed -------------------------------------------------------------------------


def create_buffers(width: int = 4, rows: int = 4, pad_value: float = 0.0) -> HostBuffers:
    return HostBuffers([TensorDesc("x", (None, width), np.float32)], rows, pad_value)


def batch_of(*slices: Slice, key: ShapeKey = ((4,),)) -> Run:
    """A run of one batch of `slices` (of at most 4 rows)."""
    return Run("m", 0, 0, slices, sum(s.rows for s in slices), 4, key, T0)


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
