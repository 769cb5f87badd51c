"""StatePool: a stateful model's recurrent state, kept in pre-allocated lanes.

A model whose recipe names `state: {stateN: state}` carries an output of one step into an
input of the next. Each row of a live sequence holds one lane of the model's pool (one row
per carried input, rows first like every row inside the framework), opened with the initial
state (zeros, or values the caller gives). A step batch gathers its rows' carried inputs
from their lanes with one fancy-index per carried input; after the batch has run, the worker
writes the carried outputs back the same way. Steps of one sequence run one after the other
(the next is submitted once the previous has ended), so a lane is never read and written at
once, and a step never sees another sequence's state.

Where the model's session keeps the state on the device (`Session.open_state`: acl),
`on_device` is set and the host arrays hold only the initial values: each step batch then
carries `StateRows` (the lane each row reads, the lane it writes, whether it is a first
step), the session gathers and scatters on the device, and nothing is written back here.
A model with several instances keeps each one's state in its own session: the lanes are
split into one partition per instance (`partition`), a sequence's lanes are all in one, and
its steps run on that instance only (`worker_of`).

Who writes what (there is no lock but the one of the free list):
- the free list: `acquire` / `release`, any thread, under `_cond`;
- a lane's rows of `arrays`: its sequence's owner while no step of it is in flight
  (`acquire`, `move`), the worker running its step while one is (`write_back`);
- `_fresh`, `_read`, `_home` of a lane: its sequence's owner (`acquire`, `move`, and
  `state_rows` as it forms the next step);
- `_lost`: the worker thread (`lose`, `launching`), and `acquire` of a lane no step uses;
- `on_device`, `max_rows`, the partitions: `init()`, before any sequence opens.

A lane is owned by one party at a time: its sequence's (the caller of `oi.sequence`, or the
`SequenceRunner`) between steps, its step's worker while the step runs.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from inferchain.core.records import Run
from inferchain.errors import InvalidInput, QueueFull, StateLost
from inferchain.tensors import StateRows


class StatePool:
    """`size` lanes of carried state for one model (see the module docstring for who may
    write what)."""

    def __init__(
        self,
        model: str,
        carried: Sequence[tuple[int, int, str]],
        shapes: Sequence[tuple[int, ...]],
        dtypes: Sequence[np.dtype],
        size: int,
        constant: Sequence[int] = (),
    ) -> None:
        """`carried`: (output index, input index, input name) per state pair; `shapes`,
        `dtypes`: the item shape and dtype of each carried input, in the same order;
        `constant`: the inputs (indices) that keep one value over a sequence (recipe
        `constant:`), which a session may keep on the device (`StateRows.home`)."""
        self.model = model
        self.size = size
        self.carried = tuple(carried)
        self.constant = tuple(constant)
        self.inputs = {name: i for _, i, name in self.carried}  # carried input name -> index
        self.arrays = {
            i: np.zeros((size, *shape), dtype)
            for (_, i, _), shape, dtype in zip(self.carried, shapes, dtypes, strict=True)
        }
        self._free: list[list[int]] = [list(range(size - 1, -1, -1))]  # per partition
        self._num_free = size
        self._part = np.zeros(size, np.intp)  # each lane's partition
        self._cond = threading.Condition()
        # the state lives in the session's device lanes (set once at init); then, per
        # lane: still its initial value (here), the lane its next step reads (a reorder),
        # lost with a re-loaded session, the first lane of its sequence
        self.on_device = False
        self.max_rows = size  # rows of one sequence (on the device: of one batch) at most
        self._fresh = np.zeros(size, bool)
        self._read = np.arange(size, dtype=np.intp)
        self._lost = np.zeros(size, bool)
        self._home = np.arange(size, dtype=np.intp)

    def partition(self, parts: int) -> None:
        """Split the lanes into `parts` partitions of consecutive lanes, one per instance
        whose session keeps its sequences' state (`init()`, before any sequence opens)."""
        assert self._num_free == self.size and parts >= 1
        bounds = [self.size * p // parts for p in range(parts + 1)]
        self._free = [list(range(bounds[p + 1] - 1, bounds[p] - 1, -1)) for p in range(parts)]
        for p in range(parts):
            self._part[bounds[p] : bounds[p + 1]] = p
        self.max_rows = min(self.max_rows, min(b - a for a, b in itertools.pairwise(bounds)))

    @property
    def partitions(self) -> int:
        return len(self._free)

    def worker_of(self, lanes: np.ndarray) -> int | None:
        """The instance whose session holds the state of `lanes` (one sequence's, or a step
        batch's: all in one partition); None when any instance may run them."""
        if len(self._free) == 1:
            return None
        return int(self._part[lanes[0]])

    def partition_of(self, lane: int) -> int:
        return int(self._part[lane])

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_open(self) -> int:
        """Lanes in use: rows of the sequences open now (each may have a step on its way)."""
        return self.size - self._num_free

    def _room(self, rows: int) -> list[int] | None:
        """The free list of the partition with the most free lanes, if it has `rows`."""
        free = max(self._free, key=len)
        return free if len(free) >= rows else None

    def acquire(
        self, initial: Mapping[str, np.ndarray], timeout: float | None = None, rows: int = 1
    ) -> np.ndarray:
        """`rows` free lanes (one sequence's rows), set to `initial` (carried input name ->
        one item for every row, or `rows` items) and zeros for the rest; waits up to
        `timeout` seconds for them (`QueueFull` after that)."""
        if rows > self.size:
            raise InvalidInput(
                f"model {self.model!r}: a sequence of {rows} rows needs more lanes than the "
                f"{self.size} there are (max_sequences)"
            )
        if rows > self.max_rows:  # its steps would be split over batches
            raise InvalidInput(
                f"model {self.model!r}: a sequence of {rows} rows does not fit one batch of "
                f"{self.max_rows} (max_batch_size, and one instance's share of max_sequences), "
                "as its state on the device needs"
            )
        with self._cond:
            if not self._cond.wait_for(lambda: self._room(rows) is not None, timeout):
                raise QueueFull(
                    f"model {self.model!r}: all {self.size} sequence lanes are in use "
                    f"(max_sequences) after {timeout}s"
                )
            free = self._room(rows)
            assert free is not None
            lanes = np.array([free.pop() for _ in range(rows)], dtype=np.intp)
            self._num_free -= rows
        try:
            for name, i in self.inputs.items():
                value = initial.get(name)
                self.arrays[i][lanes] = 0 if value is None else self._checked(name, i, value, rows)
        except BaseException:
            self.release(lanes)
            raise
        if self.on_device:
            self._fresh[lanes] = True
            self._read[lanes] = lanes
            self._lost[lanes] = False
            self._home[lanes] = lanes[0]
        return lanes

    def try_acquire(
        self, initial: Mapping[str, np.ndarray] | None, rows: int = 1
    ) -> np.ndarray | None:
        """`acquire` without waiting: None when fewer than `rows` lanes are free."""
        with self._cond:
            if self._room(rows) is None:
                return None
        try:
            return self.acquire(initial or {}, 0, rows)
        except QueueFull:  # taken by another thread meanwhile
            return None

    def release(self, lanes: np.ndarray) -> None:
        """Give `lanes` back (their sequence ended and no step of theirs is in flight)."""
        with self._cond:
            for lane in lanes.tolist():
                self._free[self._part[lane]].append(lane)
            self._num_free += len(lanes)
            self._cond.notify_all()

    def move(self, to: np.ndarray, source: np.ndarray) -> None:
        """Lanes `to` take the carried state lanes `source` hold (one gather per carried
        input; `source` may repeat and overlap `to`). On the device, their next step reads
        the lanes `source` reads instead."""
        for array in self.arrays.values():
            array[to] = array[source]
        if self.on_device:
            self._fresh[to] = self._fresh[source]
            self._read[to] = self._read[source]
            self._lost[to] = self._lost[source]

    def gather(self, i: int, lanes: np.ndarray) -> np.ndarray:
        """Carried input `i` of the rows on `lanes`, rows first (a copy)."""
        column: np.ndarray = self.arrays[i][lanes]
        return column

    def state_rows(self, lanes: np.ndarray) -> StateRows | None:
        """Where the next step of the rows on `lanes` reads and writes its state on the
        device (None where the state is on the host); after this, those lanes are no
        longer first steps."""
        if not self.on_device:
            return None
        home = self._home[lanes] if self.constant else None
        rows = StateRows(self._read[lanes], lanes, self._fresh[lanes], home)
        self._fresh[lanes] = False
        self._read[lanes] = lanes
        return rows

    def lose(self, worker: int = 0) -> None:
        """The device lanes of instance `worker` were made anew (its re-loaded session, on
        its thread): every lane of its partition past its first step has lost its state."""
        mine = self._part == worker if len(self._free) > 1 else True
        self._lost |= ~self._fresh & mine

    def lost(self, lanes: np.ndarray) -> bool:
        """Some of `lanes` lost their state (their next step cannot run)."""
        return self.on_device and bool(self._lost[lanes].any())

    def lost_mask(self, lanes: Sequence[int]) -> list[bool]:
        """Per lane: it lost its state."""
        return [bool(x) for x in self._lost[np.asarray(lanes, dtype=np.intp)]]

    def lost_error(self) -> StateLost:
        return StateLost(
            f"model {self.model!r}: the carried state of a sequence was lost when the model "
            "was re-loaded after failures (it lived in the old session's device memory); "
            "the sequence cannot go on"
        )

    def launching(self, rows: StateRows) -> bool:
        """The worker launches `rows` (its thread, so after any `lose`): True when a row
        reads state the session never wrote (the step was formed before the re-load);
        otherwise their lanes hold this session's state from now on."""
        if (self._lost[rows.read] & ~rows.fresh).any():
            return True
        self._lost[rows.write] = False
        return False

    def write_back(self, batch: Run, outputs: Sequence[np.ndarray]) -> None:
        """Store the carried outputs of the batch's step rows into their lanes (worker
        thread, after the run): one fancy-index assignment per carried input. Rows of
        works that are not steps are left alone."""
        slices = batch.slices
        first = slices[0].work.lanes if len(slices) == 1 else None
        if first is not None:  # one work: its rows in order, a slice of the outputs
            s = slices[0]
            to = first[s.start : s.stop]
            for out, i, _ in self.carried:
                self.arrays[i][to] = outputs[out][s.offset : s.offset + s.rows]
            return
        rows: list[np.ndarray] = []  # positions in the batch
        lanes: list[np.ndarray] = []  # their lanes
        for s in slices:
            work_lanes = s.work.lanes
            if work_lanes is not None:
                rows.append(np.arange(s.offset, s.offset + s.rows))
                lanes.append(work_lanes[s.start : s.stop])
        if not rows:
            return
        at = rows[0] if len(rows) == 1 else np.concatenate(rows)
        to = lanes[0] if len(lanes) == 1 else np.concatenate(lanes)
        for out, i, _ in self.carried:
            self.arrays[i][to] = outputs[out][at]

    def _checked(self, name: str, i: int, value: np.ndarray, rows: int) -> np.ndarray:
        expected = self.arrays[i].shape[1:]
        array = np.asarray(value)
        if array.shape != expected and array.shape != (rows, *expected):
            each = f" or {(rows, *expected)} (one per row)" if rows > 1 else ""
            raise InvalidInput(
                f"model {self.model!r} state {name!r}: expected an initial value of shape "
                f"{expected}{each}, got {array.shape}"
            )
        return array
