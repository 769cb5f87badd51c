"""Work: many rows of one model submitted together, the unit that travels through the layers.

`map`, `run`, `infer` and `submit_many` hand the engine one Work for all the rows of one
call (same shape key): the Scheduler admits it as a whole, the engine cuts it into batches by
row ranges (`Slice`), and the outputs come back as views of the batch outputs, split only at
the end. Per-item `Request`s ride along in `requests` where the caller asked for them; a Work
without them ("bulk") keeps its results per row range in `pieces`.

The engine's loop thread is the one writer of every field after submission, except
`cancelled`, which any thread may set (the engine then drops the rows not yet taken).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Sequence

import numpy as np

from inferchain.backends.base import StateRows
from inferchain.core.request import Outputs, Request, RequestState
from inferchain.errors import RequestCancelled

Piece = tuple[int, int, "tuple[np.ndarray, ...] | BaseException"]  # rows [start, stop)


class Work:
    """`rows` items of one model with one shape key; see the module docstring."""

    __slots__ = (
        "_done",
        "admitted",
        "ahead",
        "batch_key",
        "batched",
        "cancelled",
        "deadline",
        "depends_on",
        "exact",
        "formed",
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
        "settled",
        "shape_key",
        "slots",
        "state",
        "state_rows",
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
        shape_key: tuple[tuple[int, ...], ...],
        exact: tuple[tuple[int, ...], ...],
        names: tuple[str, ...],
        submitted: float,
        batch_key: Hashable = None,
        batched: bool = True,
        priority: int = 0,
        deadline: float | None = None,
        depends_on: tuple[Request, ...] = (),
        requests: tuple[Request, ...] | None = None,
        on_cancel: Callable[[Work], None] | None = None,
        listener: Callable[[Work], None] | None = None,
        lock: threading.RLock | None = None,
        run: tuple[int, int] | None = None,
    ) -> None:
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
        self.nbytes = sum(a.nbytes for a in inputs)  # host bytes of all rows' inputs
        self.priority = priority  # higher runs first
        self.deadline = deadline  # perf_counter seconds before which rows must start; or None
        self.depends_on = depends_on  # requests that must end DONE before any row runs
        self.requests = requests  # one per row where the caller asked for Request objects
        # shared by those requests: their transitions batch (a stateful model's step works
        # share one lock for all of them)
        self.lock = threading.RLock() if lock is None else lock
        self.submitted = submitted  # perf_counter at submit
        self.admitted: float | None = None  # perf_counter when the Scheduler admitted it
        self.state = RequestState.WAITING  # of the work as a whole; terminal once settled
        self.taken = 0  # rows handed to batches (or dropped), in row order
        self.held = False  # a ModelBatcher holds it (rows not yet taken into batches)
        self.slots: np.ndarray | None = None  # sequence steps: each row's StatePool slot
        self.state_rows: StateRows | None = None  # ... and their device slots (acl)
        self.formed = False  # a batch already (sequence steps): the batcher sends it at once
        # a multi-step batch of sequence steps: the steps it runs, and per fed input its rows
        # for every step ([rows, steps, *item]; `inputs` holds the first step's)
        self.steps = 1
        self.ahead: dict[int, np.ndarray] | None = None
        self.settled = 0  # rows that ended (outputs, error, cancelled, timed out)
        self.pieces: list[Piece] = []  # results by row range, for works without requests
        self.cancelled = False  # set by `cancel()` (any thread); rows not taken are dropped
        self.on_cancel = on_cancel  # tells the engine of `cancel()` (any thread)
        self.listener = listener  # called once settled, on the engine's thread; must not block
        self._done: threading.Lock | None = None  # held until settled; see wait()

    @classmethod
    def rejected(
        cls, id: int, model: str, error: BaseException, rows: int, names: tuple[str, ...]
    ) -> Work:
        """`rows` items that failed their input check: settled at once, `error` in every
        row (`oi.map(..., on_error="return")` yields it in their place)."""
        work = cls(id, model, (), shape_key=(), exact=(), names=names, submitted=0.0)
        work.rows = rows
        work.taken = work.settled = rows
        work.pieces = [(0, rows, error)]
        work.state = RequestState.ERROR
        return work

    def __repr__(self) -> str:
        return f"<Work {self.id} {self.model} rows={self.rows} {self.state.name}>"

    @property
    def done(self) -> bool:
        return self.state >= RequestState.DONE

    # -- the engine's side ----------------------------------------------------------------

    def arm(self) -> None:
        """Make `wait()` block until `finish()`; called before the work is submitted."""
        self._done = threading.Lock()
        self._done.acquire()

    def finish(self) -> None:
        """Every row has ended: order the pieces and wake the waiter (engine thread)."""
        if len(self.pieces) > 1:
            self.pieces.sort(key=lambda p: p[0])
        failed = any(isinstance(p[2], BaseException) for p in self.pieces)
        self.state = RequestState.ERROR if failed else RequestState.DONE
        self.inputs = ()  # free the rows' memory as soon as they are finished
        self.ahead = None
        self.requests = None  # a request kept by its caller no longer keeps its siblings
        if self._done is not None:
            self._done.release()
        if self.listener is not None:
            self.listener(self)

    # -- the caller's side ----------------------------------------------------------------

    def cancel(self) -> None:
        """Drop the rows not yet running (any thread); the others still finish."""
        if self.cancelled or self.state >= RequestState.DONE:
            return
        self.cancelled = True
        if self.on_cancel is not None:
            self.on_cancel(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every row has ended; False if `timeout` seconds passed first."""
        done = self._done
        if done is None or self.state >= RequestState.DONE:
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
                if not self.batched:
                    return dict(zip(self.names, value, strict=True))
                i = row - start
                return {n: a[i] for n, a in zip(self.names, value, strict=True)}
        return RequestCancelled(f"row {row} of work {self.id} ({self.model}) never ran")

    def items(self) -> Iterator[Outputs | BaseException]:
        """Every row's outputs or error, in row order (after wait)."""
        names = self.names
        for start, stop, value in self.pieces:
            if isinstance(value, BaseException):
                for _ in range(start, stop):
                    yield value
            elif not self.batched:
                yield dict(zip(names, value, strict=True))
            elif len(names) == 1:
                name = names[0]
                for row in value[0]:
                    yield {name: row}
            else:
                for row in zip(*value, strict=True):
                    yield dict(zip(names, row, strict=True))

    def arrays(self) -> Sequence[tuple[int, int, dict[str, np.ndarray] | BaseException]]:
        """Results by row range (start, stop, name -> rows or error), in row order."""
        return [
            (
                start,
                stop,
                v if isinstance(v, BaseException) else dict(zip(self.names, v, strict=True)),
            )
            for start, stop, v in self.pieces
        ]
