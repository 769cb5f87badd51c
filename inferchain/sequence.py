"""`oi.sequence(model)`: one live sequence of a stateful model, stepped from Python.

    with oi.sequence("vad") as seq:              # takes a state lane (zeros)
        for chunk in chunks:
            out = seq.step({"input": chunk, "sr": sr}).result()

Inside a recipe pipeline, `out = yield seq.step(...)` instead: the steps of many items'
sequences then batch together, step by step. The carried inputs (the recipe's `state:`
pairs) are never passed to `step()`: they come from the sequence's lane of the model's
StatePool, and the model's carried outputs go back into it after each step. Leaving the
`with` block (or `close()`) frees the lane, once the last step submitted has ended.

A sequence of several rows (`oi.sequence(model, rows=k)`, e.g. the k beams of a beam
search) holds k lanes; `step_rows(inputs, reorder=...)` submits one step of all its rows
(row j of each input is row j's) and may first reorder their carried state.

Where the host logic of a step can be written for many sequences at once with numpy, a
`Stepper` (`oi.run_sequence(model, stepper, item)`) runs it once per step batch instead of
once per sequence and step.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from inferchain.closing import Closing
from inferchain.core.request import Request, RequestState
from inferchain.core.sequences import Sequences
from inferchain.core.state_pool import StatePool
from inferchain.core.step_batcher import STEP_COHORTS
from inferchain.errors import Closed, InvalidInput, RequestError

__all__ = ["LiveSequence", "Stepper", "groups_sequences"]


class Stepper:
    """The host logic of many sequences of one model at once (`oi.run_sequence`).

    Where a pipeline's generator steps one sequence, a stepper steps every sequence of a
    batch together, with numpy over all their rows: the framework calls it once per step
    batch, not once per sequence, so the host's cost per step is a few numpy calls shared by
    the batch. A sequence has `rows` rows of carried state (e.g. one per beam).

    - `start(item)`: one sequence's host state, when it is submitted (the caller's thread);
    - `group(state)`: its group, asked once after `start` (default None: one group for
      all): only sequences of one group share a step batch. A stepper that would pad its
      sequences' inputs to each other's shape (the widest `memory` of a batch) gives that
      shape: every step batch is then of one shape, fed unpadded, and a model whose outputs
      do not depend on a batch's row count gives each row the same bytes whatever shares its
      batch (`inferchain compare --batch-invariance` checks such a model's step rows in
      batches of one shape);
    - `initial(state)`: its initial carried state, or None for zeros;
    - `feed(states)`: the next step's inputs that are not carried, for the sequences
      `states` in order: name -> array of `len(states) * rows` rows (the rows of
      `states[0]` first); an unbatched input (`batched: false`) gets its one value;
    - `take(states, outputs)`: the step's outputs (name -> rows, carried ones included,
      except where the state stays in device memory: acl) for those sequences; update
      the states and return a bool per sequence, True where it has ended, and optionally
      `reorder`, ints [len(states), rows]: row j of a sequence goes on from the carried
      state its row `reorder[i, j]` had (a beam search);
    - `result(state)`: an ended sequence's result.

    `start` runs on the caller's thread; `initial`, `feed`, `take` and `result` run one call
    at a time, on the caller's thread or the engine's loop thread outside the engine's lock:
    they must not block. An exception fails the sequences of that call only.

    `cohorts`: step batches of this stepper's sequences on their way at once. While one is
    on a worker, `take` and `feed` of another run on the host; take more where the host
    step is long next to the model's, or the model has more instances.

    `steps_per_batch` K > 1 (multi-step batches): where the inputs of a sequence's next
    steps do not depend on the outputs of the previous ones (a stream's next chunks), one
    batch runs K steps of its sequences on the worker, the state carried from one to the
    next there, and the host logic runs once per K steps. `feed` then gives each batched
    input as [len(states) * rows, K, *item] (the K steps of each row, at the shape the
    model runs them; a sequence with fewer steps left pads them with any values the model
    accepts and ends in this `take`),
    and `take` gets every output as [len(states) * rows, K, *item]. A cancel or a deadline
    takes effect between batches, so after at most K steps.
    """

    rows: int = 1
    cohorts: int = STEP_COHORTS
    steps_per_batch: int = 1

    def start(self, item: Any) -> Any:
        return item

    def group(self, state: Any) -> Hashable:
        """The sequence's group: only sequences of one group share a step batch (None: one
        group for every sequence)."""
        return None

    def initial(self, state: Any) -> Mapping[str, np.ndarray] | None:
        """The sequence's initial carried state (input name -> one item for every row, or
        `rows` items), when it gets its lanes; None: the recipe's `state_init` (zeros)."""
        return None

    def feed(self, states: Sequence[Any]) -> Mapping[str, np.ndarray]:
        raise NotImplementedError

    def take(
        self, states: Sequence[Any], outputs: Mapping[str, np.ndarray]
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError

    def result(self, state: Any) -> Any:
        return state


def groups_sequences(stepper: object) -> bool:
    """Whether `stepper` gives its sequences groups of their own (its class overrides
    `Stepper.group`), which keep them apart in step batches."""
    group = getattr(type(stepper), "group", None)
    return group is not None and group is not Stepper.group


class LiveSequence(Closing):
    """One sequence of `model`: its lanes, and its steps in order (one at a time)."""

    def __init__(
        self, model: str, pool: StatePool, lanes: np.ndarray, sequences: Sequences
    ) -> None:
        """The sequence of `model` on `lanes` of its `pool`; its steps go through the
        sequence layer (`sequences`), which frees the lanes once it is closed and its last
        step has ended."""
        self.model = model
        self.lanes = lanes  # its rows in every carried-state array of the pool
        self.rows = len(lanes)
        self.steps = 0  # steps submitted so far
        self._pool = pool
        self._sequences = sequences
        self._lane = int(lanes[0])
        self._last: list[Request] = []
        self._closed = False

    @property
    def lane(self) -> int:
        """The one lane of a one-row sequence."""
        if self.rows != 1:
            raise InvalidInput(f"{self!r} has {self.rows} rows: see `lanes`")
        return self._lane

    def __repr__(self) -> str:
        return f"<LiveSequence {self.model} lanes={self.lanes.tolist()} steps={self.steps}>"

    def step(self, inputs: Mapping[str, Any], **options: Any) -> Request:
        """Submit the next step of a one-row sequence (`inputs`: name -> array for the
        inputs that are not carried); returns its Request. `options` are `submit()`'s
        (priority, timeout, callback). The previous step must have ended DONE."""
        if self.rows != 1:
            raise InvalidInput(
                f"sequence of model {self.model!r} has {self.rows} rows: use step_rows()"
            )
        last = self._last
        if (
            not self._closed
            and (not last or last[0].state is RequestState.DONE)
            and isinstance(inputs, dict)
            and options.keys() <= {"callback"}
            and self._pool.inputs.keys().isdisjoint(inputs)
            and not self._pool.lost(self.lanes)
        ):
            request = self._sequences.step_one(
                self.model, inputs, self._lane, options.get("callback")
            )
            self._last = [request]
        else:
            self._check(inputs)
            self._last = self._sequences.step(self.model, inputs, self.lanes, options, False)
        self.steps += 1
        return self._last[0]

    def step_rows(
        self, inputs: Mapping[str, Any], *, reorder: Any = None, **options: Any
    ) -> list[Request]:
        """Submit the next step of every row: `inputs` maps each input that is not carried
        to `rows` items (row j's first). `reorder` (ints, one per row): row j goes on from
        the carried state row `reorder[j]` had after the previous step. One Request per row."""
        self._check(inputs)
        k = self.rows
        if reorder is not None:
            order = np.asarray(reorder)
            if (
                order.shape != (k,)
                or order.dtype.kind not in "iu"
                or not ((order >= 0) & (order < k)).all()
            ):
                raise InvalidInput(
                    f"sequence of model {self.model!r}: reorder must be {k} row numbers in "
                    f"[0, {k}), got {order!r}"
                )
        pool, lanes = self._pool, self.lanes
        # row j goes on from the state of its row order[j]: a gather within its own lanes
        before = None if reorder is None else lambda: pool.move(lanes, lanes[order])
        # reorders once checked
        requests = self._sequences.step(self.model, inputs, lanes, options, True, before)
        self._last = requests
        self.steps += 1
        return requests

    def _check(self, inputs: Mapping[str, Any]) -> None:
        """The sequence can take another step, and `inputs` leaves the carried ones out."""
        if self._closed:
            raise Closed(f"{self!r} is closed")
        for last in self._last:
            if not last.done():
                raise InvalidInput(
                    f"sequence of model {self.model!r}: step {self.steps + 1} submitted "
                    f"before step {self.steps} ended (steps run one after the other)"
                )
            if last.state is not RequestState.DONE:
                raise RequestError(
                    f"sequence of model {self.model!r}: step {self.steps} ended "
                    f"{last.state.name} ({last.error}); its state is lost, the sequence "
                    "cannot go on"
                )
        if self._pool.lost(self.lanes):
            raise self._pool.lost_error()
        if not isinstance(inputs, Mapping):
            raise InvalidInput(
                f"sequence of model {self.model!r}: a step takes a mapping name -> array, "
                f"got {type(inputs).__name__}"
            )
        given = sorted(n for n in inputs if n in self._pool.inputs)
        if given:
            raise InvalidInput(
                f"sequence of model {self.model!r}: inputs {given} are carried by the "
                "sequence (the recipe's `state:`); pass only the others"
            )

    def close(self) -> None:
        """End the sequence; its lanes are freed once its last step has ended."""
        if self._closed:
            return
        self._closed = True
        lanes, last = self.lanes, self._last
        model, sequences = self.model, self._sequences

        def release(lanes: np.ndarray) -> None:
            sequences.release(model, lanes)

        if not last:
            release(lanes)
            return
        left = [len(last)]

        def ended(_: Request) -> None:
            left[0] -= 1
            if left[0] == 0:
                release(lanes)

        for r in last:
            r.add_done_listener(ended)
