"""Intake: a call's inputs checked once and made into Works, by one model's `WorkSpec`.

A `WorkSpec` is built once per model at `init()` from what its session told (the item check,
the shape policy, the output names, the memory budget's room for requests) and the recipe's
defaults; each call then only adds what is its own (ids, priority, deadline, dependencies, a
callback). The facade (`OfflineInference`) hands the Works to the engine; nothing here calls
the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from inferchain.anchors import current_run
from inferchain.core.request import Callback, Request
from inferchain.core.work import Work
from inferchain.errors import InvalidInput
from inferchain.inputs import Item
from inferchain.registry import LoadedModel

TakeIds = Callable[[int], int]  # n -> the first of n new ids (raises once closed)
Listener = Callable[[Work], None]


class WorkSpec:
    """What every Work of one model shares, and the builders of a call's Works."""

    def __init__(
        self, loaded: LoadedModel, take_ids: TakeIds, on_cancel: Callable[[Any], None]
    ) -> None:
        config, spec, shapes = loaded.config, loaded.spec, loaded.shapes
        self.loaded = loaded
        self.model = config.name
        self.names = loaded.output_names  # in output order
        self.batched = spec.batching
        self.spec = spec  # the item check
        self.shapes = shapes  # which batch rows join
        self.priority = config.priority  # the recipe's defaults
        self.timeout = config.timeout_s
        self.room = loaded.memory.request_bytes  # input bytes one item may hold, or None
        self.anchored = config.batching == "fill"  # a pipeline's runs never share a batch
        # an item's key is its own shapes: every input batched on axis 0, no unbatched input
        # nor DeviceTensor, shapes kept as they come, no per-item memory limit
        self.plain = (
            spec.batching
            and not spec.unbatched
            and not spec.handed
            and shapes.keeps_shapes
            and all(a == 0 for a in shapes.layout.inputs)
            and self.room is None
            and not self.anchored
        )
        self._take_ids = take_ids
        self._on_cancel = on_cancel

    def item(self, inputs: Any, timeout: float | None) -> Work:
        """The Work of one item (`infer`), checked; raises `InvalidInput`."""
        if not self.plain:
            (work,) = self.works((inputs,), timeout=timeout)
            return work
        arrays = self.spec.normalize(inputs)
        exact = tuple([a.shape for a in arrays]) if len(arrays) > 1 else (arrays[0].shape,)
        timeout = self.timeout if timeout is None else timeout
        now = time.perf_counter()
        return Work(
            self._take_ids(1), self.model, tuple([a[None] for a in arrays]) if len(arrays) > 1
            else (arrays[0][None],), shape_key=exact, exact=exact, names=self.names,
            submitted=now, priority=self.priority,
            deadline=None if timeout is None else now + timeout, on_cancel=self._on_cancel,
        )  # fmt: skip

    def works(
        self,
        items: Iterable[Any] | np.ndarray,
        *,
        per_item: bool = False,
        priority: int | None = None,
        timeout: float | None = None,
        depends_on: tuple[Request, ...] = (),
        callback: Callback | None = None,
        listener: Listener | None = None,
    ) -> list[Work]:
        """Checked WAITING works for `items`, one per run of same-shape items; with
        `per_item`, a Request per row. Raises `InvalidInput` naming the item's problem."""
        spec, shapes = self.spec, self.shapes
        groups = spec.groups(items)
        if self.room is not None:
            self._check_room(groups)
        prio = self.priority if priority is None else priority
        timeout = self.timeout if timeout is None else timeout
        now = time.perf_counter()
        deadline = None if timeout is None else now + timeout
        run = current_run.get() if self.anchored else None
        works = []
        for inputs in groups:
            exact, key, joins = shapes.keys_of_rows(inputs, spec)
            if run is not None:
                joins = (run, joins)  # anchored: two runs never share a batch
            rows = len(inputs[0]) if spec.batching else 1
            work = Work.for_items(
                self._take_ids(rows if per_item else 1),
                self.model,
                inputs,
                per_item=per_item,
                callback=callback,
                created=now,
                shape_key=key,
                batch_key=joins,
                exact=exact,
                names=self.names,
                batched=spec.batching,
                priority=prio,
                deadline=deadline,
                depends_on=depends_on,
                on_cancel=self._on_cancel,
                listener=listener,
                run=run,
            )
            works.append(work)
        return works

    def works_apart(
        self,
        items: Sequence[Any] | np.ndarray,
        priority: int | None,
        listener: Listener | None,
    ) -> list[Work]:
        """`works` for a chunk where some item fails its input check: the runs of good
        items as Works, each failed item (or a whole array of rows) as a rejected Work."""

        def rejected(error: InvalidInput, rows: int) -> Work:
            return Work.rejected(self._take_ids(1), self.model, error, rows, self.names)

        if isinstance(items, np.ndarray) and self.spec.takes_rows:
            try:
                return self.works(items, priority=priority, listener=listener)
            except InvalidInput as e:  # the rows are checked as one array
                return [rejected(e, len(items))]
        works: list[Work] = []
        good: list[Any] = []
        for item in items:
            try:
                self.spec.groups((item,))  # the check alone: nothing is built
                if self.room is not None:
                    self._check_room(self.spec.groups((item,)))
            except InvalidInput as e:
                if good:
                    works += self.works(good, priority=priority, listener=listener)
                    good = []
                works.append(rejected(e, 1))
            else:
                good.append(item)
        if good:
            works += self.works(good, priority=priority, listener=listener)
        return works

    def _check_room(self, groups: Sequence[Item]) -> None:
        room = self.room
        assert room is not None
        for inputs in groups:
            rows = len(inputs[0]) if self.spec.batching and inputs[0].ndim else 1
            size = sum(a.nbytes for a in inputs) // max(rows, 1)
            if size > room:
                config = self.loaded.config
                raise InvalidInput(
                    f"model {config.name!r}: an item of {size} bytes does not fit what "
                    f"memory_budget_mb {config.memory_budget_mb} leaves for requests "
                    f"({room} bytes)"
                )
