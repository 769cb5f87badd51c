"""Work: its named constructors, its own state changes, and one way to turn output pieces
into each row's result."""

from __future__ import annotations

import numpy as np
import pytest

from inferchain.core.request import Request, RequestState
from inferchain.core.work import StepRows, Work, row_outputs
from inferchain.errors import InvalidInput
from inferchain.testing.builders import create_work

S = RequestState


def test_for_items_numbers_one_request_per_row_tied_to_its_row_and_the_work_lock() -> None:
    cancels: list[object] = []
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    work = Work.for_items(
        7, "m", (x,), per_item=True, created=1.0, shape_key=((4,),), exact=((4,),),
        names=("y",), priority=2, on_cancel=cancels.append,
    )  # fmt: skip
    assert work.requests is not None
    assert [r.id for r in work.requests] == [7, 8, 9]
    assert [r.row for r in work.requests] == [0, 1, 2]
    assert all(r.work is work and r.priority == 2 for r in work.requests)
    np.testing.assert_array_equal(work.requests[1].inputs[0], x[1])  # a view of its row
    assert work.requests[2].cancel() and cancels == [work.requests[2]]
    bulk = Work.for_items(7, "m", (x,), created=1.0, shape_key=((4,),), exact=((4,),),
                          names=("y",))  # fmt: skip
    assert bulk.requests is None and bulk.rows == 3 and bulk.steps is None


def test_for_steps_ties_the_steps_requests_and_counts_every_step_of_a_multi_step_batch() -> None:
    x = np.zeros((2, 4), np.float32)
    ahead = {0: np.zeros((2, 3, 4), np.float32)}  # 3 steps of input 0
    steps = StepRows(np.array([5, 1], np.intp), count=3, ahead=ahead)
    requests = [Request(10, "m"), Request(12, "m")]
    work = Work.for_steps(10, "m", (x,), steps, requests=requests, shape_key=((4,),),
                          exact=((4,),), names=("y",), submitted=0.0)  # fmt: skip
    assert work.alone and work.lanes is not None and work.lanes.tolist() == [5, 1]
    assert [(r.work, r.row) for r in requests] == [(work, 0), (work, 1)]
    assert work.nbytes == ahead[0].nbytes  # all three steps' rows, not the first only
    assert work.state_rows is None


def test_admit_start_and_finish_are_the_works_own_state_changes() -> None:
    work = create_work(1, rows=2, submitted=5.0)
    work.arm()
    work.admit(4.0)  # stamped no earlier than its submission
    assert work.state is S.READY and work.admitted == 5.0
    work.start()
    assert work.state is S.RUNNING
    work.start()  # once RUNNING, it stays so
    assert work.state is S.RUNNING
    with pytest.raises(AssertionError):
        work.admit(6.0)  # only a WAITING work is admitted
    assert not work.wait(0)
    work.pieces += [(1, 2, InvalidInput("bad")), (0, 1, (np.ones((1, 4)),))]
    work.finish()
    assert work.state is S.ERROR and work.wait(0)
    assert [p[0] for p in work.pieces] == [0, 1]  # in row order
    assert work.inputs == ()  # the rows' memory is freed


def test_rejected_is_finished_with_its_error_in_every_row() -> None:
    error = InvalidInput("no")
    work = Work.rejected(3, "m", error, 4, ("y",))
    assert work.done and work.state is S.ERROR and work.rows == 4
    assert list(work.items()) == [error] * 4


@pytest.mark.parametrize("names", [("y",), ("y", "z")])
def test_row_outputs_gives_each_row_a_view_of_its_rows_of_every_output(
    names: tuple[str, ...],
) -> None:
    pieces = tuple(np.arange(6).reshape(3, 2) + 10 * k for k in range(len(names)))
    rows = list(row_outputs(names, pieces, batched=True))
    assert len(rows) == 3
    for i, row in enumerate(rows):
        assert list(row) == list(names)
        for k, name in enumerate(names):
            np.testing.assert_array_equal(row[name], pieces[k][i])
            assert np.shares_memory(row[name], pieces[k])
    whole = list(row_outputs(names, pieces, batched=False))  # an unbatched work: as it is
    assert len(whole) == 1 and all(whole[0][n] is p for n, p in zip(names, pieces, strict=True))


def test_items_and_item_agree_with_row_outputs() -> None:
    work = create_work(1, rows=3)
    y = np.arange(12, dtype=np.float32).reshape(3, 4)
    work.pieces = [(0, 3, (y,))]
    work.finish()
    items = list(work.items())
    assert [r["y"].tolist() for r in items] == y.tolist()  # type: ignore[index]
    item = work.item(2)
    assert isinstance(item, dict) and item["y"].tolist() == y[2].tolist()
