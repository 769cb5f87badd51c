"""`oi.sequence(model)`: one live sequence of a stateful model, stepped from Python.

    with oi.sequence("vad") as seq:              # takes a state slot (zeros)
        for chunk in chunks:
            out = seq.step({"input": chunk, "sr": sr}).result()

Inside a recipe pipeline, `out = yield seq.step(...)` instead: the steps of many items'
sequences then batch together, step by step. The carried inputs (the recipe's `state:`
pairs) are never passed to `step()`: they come from the sequence's slot, and the model's
carried outputs go back into it after each step. Leaving the `with` block (or `close()`)
frees the slot, once the last step submitted has ended.

A sequence of several rows (`oi.sequence(model, rows=k)`, e.g. the k beams of a beam
search) holds k slots; `step_rows(inputs, reorder=...)` submits one step of all its rows
(row j of each input is row j's) and may first reorder their carried state.

Where the host logic of a step can be written for many sequences at once with numpy, a
`Stepper` (`oi.run_sequence(model, stepper, item)`) runs it once per step batch instead of
once per sequence and step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from inferchain.closing import Closing
from inferchain.core.request import Request, RequestState
from inferchain.core.runner import Stepper
from inferchain.core.sequences import StatePool
from inferchain.errors import Closed, InvalidInput, RequestError

# (inputs, slots, options, rows, before): the step's requests; see OfflineInference._step
__all__ = ["LiveSequence", "Stepper"]

SubmitStep = Callable[
    [Mapping[str, Any], np.ndarray, dict[str, Any], bool, Callable[[], None] | None],
    list[Request],
]
StepOne = Callable[[Mapping[str, Any], int, Any], Request]  # (inputs, slot, callback)


class LiveSequence(Closing):
    """One sequence of `model`: its slots, and its steps in order (one at a time)."""

    def __init__(
        self,
        model: str,
        pool: StatePool,
        slots: np.ndarray,
        submit: SubmitStep,
        step_one: StepOne | None = None,
    ) -> None:
        """`submit` takes any step; `step_one`, a plain step of a one-row sequence (the
        fast path of `step()`, with no option but a callback)."""
        self.model = model
        self.slots = slots  # its rows in every carried-state array of the pool
        self.rows = len(slots)
        self.steps = 0  # steps submitted so far
        self._pool = pool
        self._submit = submit
        self._one = step_one
        self._slot = int(slots[0])
        self._last: list[Request] = []
        self._closed = False

    @property
    def slot(self) -> int:
        """The one slot of a one-row sequence."""
        if self.rows != 1:
            raise InvalidInput(f"{self!r} has {self.rows} rows: see `slots`")
        return self._slot

    def __repr__(self) -> str:
        return f"<LiveSequence {self.model} slots={self.slots.tolist()} steps={self.steps}>"

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
            self._one is not None
            and not self._closed
            and (not last or last[0].state is RequestState.DONE)
            and isinstance(inputs, dict)
            and options.keys() <= {"callback"}
            and self._pool.inputs.keys().isdisjoint(inputs)
            and not self._pool.lost(self.slots)
        ):
            request = self._one(inputs, self._slot, options.get("callback"))
            self._last = [request]
        else:
            self._check(inputs)
            self._last = self._submit(inputs, self.slots, options, False, None)
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
        pool, slots = self._pool, self.slots
        # row j goes on from the state of its row order[j]: a gather within its own slots
        before = None if reorder is None else lambda: pool.move(slots, slots[order])
        requests = self._submit(inputs, slots, options, True, before)  # reorders once checked
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
        if self._pool.lost(self.slots):
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
        """End the sequence; its slots are freed once its last step has ended."""
        if self._closed:
            return
        self._closed = True
        pool, slots, last = self._pool, self.slots, self._last
        if not last:
            pool.release(slots)
            return
        left = [len(last)]

        def ended(_: Request) -> None:
            left[0] -= 1
            if left[0] == 0:
                pool.release(slots)

        for r in last:
            r.add_done_listener(ended)
