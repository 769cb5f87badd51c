"""`oi.sequence(model)`: one live sequence of a stateful model, stepped from Python.

    with oi.sequence("vad") as seq:              # takes a state slot (zeros)
        for chunk in chunks:
            out = seq.step({"input": chunk, "sr": sr}).result()

Inside a recipe pipeline, `out = yield seq.step(...)` instead: the steps of many items'
sequences then batch together, step by step. The carried inputs (the recipe's `state:`
pairs) are never passed to `step()`: they come from the sequence's slot, and the model's
carried outputs go back into it after each step. Leaving the `with` block (or `close()`)
frees the slot, once the last step submitted has ended.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from inferchain.core.request import Request, RequestState
from inferchain.core.sequences import StatePool
from inferchain.errors import Closed, InvalidInput, RequestError

SubmitStep = Callable[[Mapping[str, Any], int, dict[str, Any]], Request]


class LiveSequence:
    """One sequence of `model`: its slot, and its steps in order (one at a time)."""

    def __init__(self, model: str, pool: StatePool, slot: int, submit: SubmitStep) -> None:
        self.model = model
        self.slot = slot  # its row in every carried-state array of the pool
        self.steps = 0  # steps submitted so far
        self._pool = pool
        self._submit = submit
        self._last: Request | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<LiveSequence {self.model} slot={self.slot} steps={self.steps}>"

    def step(self, inputs: Mapping[str, Any], **options: Any) -> Request:
        """Submit the next step (`inputs`: name -> array for the inputs that are not
        carried); returns its Request. `options` are `submit()`'s (priority, timeout,
        callback). The previous step must have ended DONE."""
        if self._closed:
            raise Closed(f"sequence of model {self.model!r} (slot {self.slot}) is closed")
        last = self._last
        if last is not None:
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
        if not isinstance(inputs, Mapping):
            raise InvalidInput(
                f"sequence of model {self.model!r}: a step takes a mapping name -> array, "
                f"got {type(inputs).__name__}"
            )
        pool = self._pool
        given = sorted(n for n in inputs if n in pool.inputs)
        if given:
            raise InvalidInput(
                f"sequence of model {self.model!r}: inputs {given} are carried by the "
                "sequence (the recipe's `state:`); pass only the others"
            )
        request = self._submit(inputs, self.slot, options)
        self._last = request
        self.steps += 1
        return request

    def close(self) -> None:
        """End the sequence; its slot is freed once its last step has ended."""
        if self._closed:
            return
        self._closed = True
        pool, slot = self._pool, self.slot
        if self._last is None:
            pool.release(slot)
        else:
            self._last.add_done_listener(lambda _: pool.release(slot))

    def __enter__(self) -> LiveSequence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
