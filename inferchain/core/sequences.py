"""Sequences: a stateful model's recurrent state, kept in pre-allocated slots.

A model whose recipe names `state: {stateN: state}` carries an output of one step into an
input of the next. Each live sequence holds one slot of the model's `StatePool` (one row per
carried input, rows first like every row inside the framework), opened with the initial state
(zeros, or values the caller gives). A step is an ordinary one-row Work whose carried inputs
are read from its slot; after its batch has run, the worker writes the batch's carried
outputs back into the slots of its rows with one fancy-index assignment per carried input.
Steps of one sequence run one after the other (the next is submitted once the previous has
ended), so a slot is never read and written at once, and a step never sees another
sequence's state.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from inferchain.core.records import Batch
from inferchain.errors import InvalidInput, QueueFull


class StatePool:
    """`size` slots of carried state for one model (thread-safe: any caller opens and closes
    sequences; a worker thread writes the slots of the rows it ran)."""

    def __init__(
        self,
        model: str,
        carried: Sequence[tuple[int, int, str]],
        shapes: Sequence[tuple[int, ...]],
        dtypes: Sequence[np.dtype],
        size: int,
    ) -> None:
        """`carried`: (output index, input index, input name) per state pair; `shapes`,
        `dtypes`: the item shape and dtype of each carried input, in the same order."""
        self.model = model
        self.size = size
        self.carried = tuple(carried)
        self.inputs = {name: i for _, i, name in self.carried}  # carried input name -> index
        self.arrays = {
            i: np.zeros((size, *shape), dtype)
            for (_, i, _), shape, dtype in zip(self.carried, shapes, dtypes, strict=True)
        }
        self._free = list(range(size - 1, -1, -1))
        self._cond = threading.Condition()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_live(self) -> int:
        """Sequences open now (each may have a step on its way)."""
        return self.size - len(self._free)

    def acquire(self, initial: dict[str, np.ndarray], timeout: float | None = None) -> int:
        """A free slot, set to `initial` (carried input name -> item array) and zeros for
        the rest; waits up to `timeout` seconds for one (`QueueFull` after that)."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._free), timeout):
                raise QueueFull(
                    f"model {self.model!r}: all {self.size} sequence slots are in use "
                    f"(max_sequences) after {timeout}s"
                )
            slot = self._free.pop()
        try:
            for name, i in self.inputs.items():
                value = initial.get(name)
                self.arrays[i][slot] = 0 if value is None else self._checked(name, i, value)
        except BaseException:
            self.release(slot)
            raise
        return slot

    def release(self, slot: int) -> None:
        with self._cond:
            self._free.append(slot)
            self._cond.notify()

    def row(self, input_index: int, slot: int) -> np.ndarray:
        """The slot's current value of a carried input (a view, item-shaped)."""
        row: np.ndarray = self.arrays[input_index][slot]
        return row

    def write_back(self, batch: Batch, outputs: Sequence[np.ndarray]) -> None:
        """Store the carried outputs of the batch's sequence rows into their slots (worker
        thread, after the run). Rows of works that are not steps are left alone."""
        rows: list[int] = []  # positions in the batch
        slots: list[int] = []  # their slots
        for s in batch.slices:
            if s.work.slot is not None:
                rows.append(s.offset)
                slots.append(s.work.slot)
        if not rows:
            return
        for out, i, _ in self.carried:
            self.arrays[i][slots] = outputs[out][rows]

    def _checked(self, name: str, i: int, value: np.ndarray) -> np.ndarray:
        expected = self.arrays[i].shape[1:]
        array = np.asarray(value)
        if array.shape != expected:
            raise InvalidInput(
                f"model {self.model!r} state {name!r}: expected an initial value of shape "
                f"{expected}, got {array.shape}"
            )
        return array
