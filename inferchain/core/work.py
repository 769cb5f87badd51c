"""Work: many rows of one model submitted together, the unit that travels through the layers.

`map`, `run`, `infer` and `submit_many` hand the engine one Work for all the rows of one
call (same shape key): the Scheduler admits it as a whole, the batcher cuts it into runs of
batches by row ranges (`Slice`), and the outputs come back as views of the batch outputs,
split only at the end. Per-item `Request`s ride along in `requests` where the caller asked
for them; a Work without them ("bulk") keeps its results per row range in `pieces`. A batch
of sequence steps is a Work too, whose `steps` record says which state lanes its rows read
and write.

A Work is built by one of its named constructors (`for_items`, `for_steps`, `rejected`) and
changes state only through its own methods (`admit`, `start`, `finish`). Who writes what
after submission:

| field | writer |
|---|---|
| `state`, `admitted` | `admit` (the Scheduler), `start` (the batcher), `finish` (the ledger) |
| `taken`, `held` | the model's `ModelBatcher`, its one writer (under the engine's lock) |
| `ended`, `pieces` | the engine's `Ledger`, as rows end (under the engine's lock) |
| `cancelled` | `cancel()`, any thread (the engine then drops the rows not yet taken) |

Everything else is set at construction and never changes.
"""

from __future__ import annotations

import inspect
import itertools
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from inferchain.core.request import Callback, Outputs, Request, RequestState
from inferchain.errors import RequestCancelled
from inferchain.shapes import ShapeKey
from inferchain.tensors import StateRows

# a Request's keyword defaults, read off its signature (one source of truth)
_REQUEST_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(Request.__init__).parameters.items()
    if p.default is not inspect.Parameter.empty
}

Piece = tuple[int, int, "tuple[np.ndarray, ...] | BaseException"]  # rows [start, stop)
_NO_REQUESTS = threading.RLock()  # the `lock` of every Work without Requests (never taken)
S = RequestState


@attrs.frozen(eq=False)
class StepRows:
    """What makes a Work a batch of sequence steps (set at construction, never changed)."""

    lanes: np.ndarray  # intp, per row: the state lane of the StatePool it reads and writes
    state_rows: StateRows | None = None  # where the session keeps the state on the device
    count: int = 1  # steps one batch runs (a multi-step batch); the Work's inputs: the first
    ahead: Mapping[int, np.ndarray] | None = None  # per fed input: [rows, count, *item]
    alone: bool = True  # runs as a batch of its own, never cut (a cohort of steps)
    queued: bool = False  # formed by a StepBatcher, which hears of its rows' ending
    cohort: Any = None  # the SequenceRunner's cohort whose step batch it is, if any
    worker: int | None = None  # the instance that must run it (its session holds the state)


def row_outputs(
    names: tuple[str, ...], pieces: tuple[np.ndarray, ...], batched: bool
) -> Iterator[Outputs]:
    """Each row's outputs (name -> a view of its row) of one range of output `pieces`; an
    unbatched Work's one result as it is. An iterator of its own (not a generator): a
    caller's `yield from` runs it without a frame of this function per row."""
    if not batched:
        return iter((dict(zip(names, pieces, strict=True)),))
    if len(names) == 1:
        name = names[0]
        return ({name: row} for row in pieces[0])
    return (dict(zip(names, row, strict=True)) for row in zip(*pieces, strict=True))


def _raising(error: BaseException) -> Iterator[Outputs]:
    """An iterator that raises `error` at its first item."""
    raise error
    yield  # a generator: it raises when iterated, not when made


class Work:
    """`rows` items of one model with one shape key; see the module docstring."""

    __slots__ = (
        "_done",
        "admitted",
        "alone",
        "batch_key",
        "batched",
        "cancelled",
        "deadline",
        "depends_on",
        "ended",
        "exact",
        "held",
        "id",
        "inputs",
        "listener",
        "lock",
        "model",
        "names",
        "nbytes",
        "on_cancel",
        "pieces",
        "priority",
        "requests",
        "rows",
        "run",
        "shape_key",
        "state",
        "steps",
        "submitted",
        "taken",
    )

    def __init__(
        self,
        id: int,
        model: str,
        inputs: tuple[np.ndarray, ...],
        *,
        shape_key: ShapeKey,
        exact: ShapeKey,
        names: tuple[str, ...],
        submitted: float,
        batch_key: Hashable = None,
        batched: bool = True,
        priority: int = 0,
        deadline: float | None = None,
        depends_on: tuple[Request, ...] = (),
        on_cancel: Callable[[Any], None] | None = None,
        listener: Callable[[Work], None] | None = None,
        lock: threading.RLock | None = None,
        run: tuple[int, int] | None = None,
        steps: StepRows | None = None,
    ) -> None:
        """The fields every Work has; build one with `for_items`, `for_steps` or `rejected`."""
        self.id = id  # unique per OfflineInference; orders equal priorities (FIFO)
        self.model = model
        # batched: one array per model input, `rows` rows each (row i = item i; an unbatched
        # input's one value is seen in every row); else the model's whole inputs, passed
        # through untouched (max_batch_size 0; rows is 1)
        self.inputs = inputs
        self.batched = batched
        self.rows = len(inputs[0]) if batched and inputs else 1
        self.shape_key = shape_key  # item shapes of the batch this work's rows join
        # what rows must share to run in one batch (the batcher's group): the shape key,
        # and the values of the model's unbatched inputs where it has any
        self.batch_key = shape_key if batch_key is None else batch_key
        # the anchored run of input positions its rows belong to (`inferchain.anchors`):
        # (driver, run index); a batch never mixes two; None = not anchored
        self.run = run
        self.exact = exact  # item shapes of the rows themselves (differ when padded)
        self.names = names  # the model's output names, in output order
        self.steps = steps  # a batch of sequence steps: its lanes; None for items
        # its rows run as one batch of their own (a cohort of sequence steps)
        self.alone = steps is not None and steps.alone
        # host bytes of all rows' inputs
        self.nbytes = inputs[0].nbytes if len(inputs) == 1 else sum(a.nbytes for a in inputs)
        if steps is not None and steps.ahead:  # every step of a multi-step batch
            self.nbytes += sum(a.nbytes - inputs[i].nbytes for i, a in steps.ahead.items())
        self.priority = priority  # higher runs first
        self.deadline = deadline  # perf_counter seconds before which rows must start; or None
        self.depends_on = depends_on  # requests that must end DONE before any row runs
        self.requests: tuple[Request, ...] | None = None  # one per row, where asked for
        # shared by those requests: their transitions batch (a stateful model's step works
        # share one lock for all of them); a Work without Requests takes none
        self.lock = _NO_REQUESTS if lock is None else lock
        self.submitted = submitted  # perf_counter at submit
        self.admitted: float | None = None  # perf_counter when the Scheduler admitted it
        self.state = S.WAITING  # of the work as a whole; terminal once finished
        self.taken = 0  # rows handed to batches (or dropped), in row order
        self.held = False  # a ModelBatcher holds it (rows not yet taken into batches)
        self.ended = 0  # rows that ended (outputs, error, cancelled, timed out)
        self.pieces: list[Piece] = []  # results by row range, for works without requests
        self.cancelled = False  # set by `cancel()` (any thread); rows not taken are dropped
        self.on_cancel = on_cancel  # tells the engine of `cancel()` (any thread)
        # called once finished, on the engine's thread under its lock: framework code only
        # (e.g. a queue's put), never the user's; must not block
        self.listener = listener
        self._done: threading.Lock | None = None  # held until finished; see wait()

    # -- named constructors ---------------------------------------------------------------

    @classmethod
    def for_items(
        cls,
        first_id: int,
        model: str,
        inputs: tuple[np.ndarray, ...],
        *,
        shape_key: ShapeKey,
        exact: ShapeKey,
        names: tuple[str, ...],
        created: float,
        per_item: bool = False,
        callback: Callback | None = None,
        batch_key: Hashable = None,
        batched: bool = True,
        priority: int = 0,
        deadline: float | None = None,
        depends_on: tuple[Request, ...] = (),
        on_cancel: Callable[[Any], None] | None = None,
        listener: Callable[[Work], None] | None = None,
        run: tuple[int, int] | None = None,
    ) -> Work:
        """The rows of one call's items (ids from `first_id`, submitted at `created`); with
        `per_item`, one WAITING Request per row, numbered from `first_id`, tied to its row
        (its inputs a view made when asked for); `on_cancel` hears of a cancel of either."""
        work = cls(first_id, model, inputs, shape_key=shape_key, exact=exact, names=names,
                   submitted=created, batch_key=batch_key, batched=batched, priority=priority,
                   deadline=deadline, depends_on=depends_on, on_cancel=on_cancel,
                   listener=listener, run=run)  # fmt: skip
        if per_item:
            lock = work.lock = threading.RLock()
            # only the fields that differ from a Request's defaults: a keyword costs per row
            given: dict[str, Any] = {"priority": priority, "deadline": deadline,
                                     "depends_on": depends_on, "callback": callback,
                                     "on_cancel": on_cancel}  # fmt: skip
            extra = {k: v for k, v in given.items() if v is not _REQUEST_DEFAULTS[k]}
            rows = [
                Request(first_id + i, model, work=work, row=i, lock=lock, created=created, **extra)
                for i in range(work.rows)
            ]
            work.requests = tuple(rows)
        return work

    @classmethod
    def for_steps(
        cls,
        id: int,
        model: str,
        inputs: tuple[np.ndarray, ...],
        steps: StepRows,
        *,
        requests: Sequence[Request] | None = None,
        **fields: Any,
    ) -> Work:
        """A batch of sequence steps: row i is the next step of lane `steps.lanes[i]`; with
        `requests` (one per row, WAITING, made by their StepBatcher), each is tied to its
        row. `fields`: `Work`'s keyword arguments."""
        work = cls(id, model, inputs, steps=steps, **fields)
        if requests is not None:
            work.requests = tuple(requests)
            for j, r in enumerate(work.requests):
                r.work = work
                r.row = j
        return work

    @classmethod
    def rejected(
        cls, id: int, model: str, error: BaseException, rows: int, names: tuple[str, ...]
    ) -> Work:
        """`rows` items that failed their input check: finished at once, `error` in every
        row (`oi.map(..., on_error="return")` yields it in their place)."""
        work = cls(id, model, (), shape_key=(), exact=(), names=names, submitted=0.0)
        work.rows = rows
        work.taken = work.ended = rows
        work.pieces = [(0, rows, error)]
        work.state = S.ERROR
        return work

    def __repr__(self) -> str:
        return f"<Work {self.id} {self.model} rows={self.rows} {self.state.name}>"

    @property
    def done(self) -> bool:
        return self.state >= S.DONE

    @property
    def lanes(self) -> np.ndarray | None:
        """Sequence steps: each row's state lane; None for items."""
        return None if self.steps is None else self.steps.lanes

    @property
    def state_rows(self) -> StateRows | None:
        """Sequence steps whose state the session keeps on the device: where it lives."""
        return None if self.steps is None else self.steps.state_rows

    # -- state changes --------------------------------------------------------------------

    def admit(self, now: float) -> None:
        """WAITING -> READY: the Scheduler admitted it (not stamped before its submission)."""
        assert self.state is S.WAITING, self
        self.state = S.READY
        self.admitted = max(now, self.submitted)

    def start(self) -> None:
        """READY -> RUNNING: its first rows went into a batch (the batcher)."""
        if self.state is S.READY:
            self.state = S.RUNNING

    def arm(self) -> None:
        """Make `wait()` block until `finish()`; called before the work is submitted."""
        self._done = threading.Lock()
        self._done.acquire()

    def finish(self) -> None:
        """Every row has ended: order the pieces, end in DONE or ERROR, free the rows'
        inputs and wake the waiter (the engine's loop)."""
        pieces = self.pieces
        if len(pieces) > 1:
            pieces.sort(key=lambda p: p[0])
            failed = any(isinstance(p[2], BaseException) for p in pieces)
        else:
            failed = bool(pieces) and isinstance(pieces[0][2], BaseException)
        self.state = S.ERROR if failed else S.DONE
        self.inputs = ()  # free the rows' memory as soon as they are finished
        self.requests = None  # a request kept by its caller no longer keeps its siblings
        if self._done is not None:
            self._done.release()
        if self.listener is not None:
            self.listener(self)

    # -- the caller's side ----------------------------------------------------------------

    def cancel(self) -> None:
        """Drop the rows not yet running (any thread); the others still finish."""
        if self.cancelled or self.state >= S.DONE:
            return
        self.cancelled = True
        if self.on_cancel is not None:
            self.on_cancel(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every row has ended; False if `timeout` seconds passed first."""
        done = self._done
        if done is None or self.state >= S.DONE:
            return True
        if done.acquire(timeout=-1 if timeout is None else timeout):
            done.release()
            return True
        return False

    def item(self, row: int) -> Outputs | BaseException:
        """Row `row`'s outputs (views into the batch outputs), or its error (after wait)."""
        for start, stop, value in self.pieces:
            if start <= row < stop:
                if isinstance(value, BaseException):
                    return value
                names = self.names
                if not self.batched:
                    return dict(zip(names, value, strict=True))
                i = row - start
                if len(names) == 1:  # the common case, without a comprehension
                    return {names[0]: value[0][i]}
                return {n: a[i] for n, a in zip(names, value, strict=True)}
        return RequestCancelled(f"row {row} of work {self.id} ({self.model}) never ran")

    def items(self, raising: bool = False) -> Iterator[Outputs | BaseException]:
        """Every row's outputs or error, in row order (after wait); with `raising`, a
        failed row's error is raised at its turn instead. Chained iterators: no frame of
        this method's per row."""
        return itertools.chain.from_iterable(self._range(p, raising) for p in self.pieces)

    def _range(self, piece: Piece, raising: bool) -> Iterator[Outputs | BaseException]:
        start, stop, value = piece
        if not isinstance(value, BaseException):
            return row_outputs(self.names, value, self.batched)
        if raising:
            return _raising(value)
        return itertools.repeat(value, stop - start)

    def arrays(self) -> Sequence[tuple[int, int, dict[str, np.ndarray] | BaseException]]:
        """Results by row range (start, stop, name -> rows or error), in row order."""
        names = self.names
        return [
            (start, stop, v if isinstance(v, BaseException) else dict(zip(names, v, strict=True)))
            for start, stop, v in self.pieces
        ]
