"""One path for every batch: whatever the call (`infer`, `map`, `map_batches`,
`submit_many`, a failing batch) and whatever the log level, a Work is admitted once (the
Scheduler's one door) and released once, each run is settled once at one place
(`ExecutionEngine._on_result`) with one metrics call (`ModelMetrics.record_run`), and the
records are the same with info logging on and off."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import faulty
from conftest import mlp_recipe as mlp

import inferchain as ic
from inferchain.core.engine import ExecutionEngine
from inferchain.core.records import RunResult
from inferchain.core.scheduler import Scheduler
from inferchain.core.worker import ModelWorker
from inferchain.metrics import ModelMetrics

Event = tuple[Any, ...]


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """What the core did, in order: admissions, releases, runs handed to an executor,
    settles and metrics calls (with what each record says, times left out)."""
    seen: list[Event] = []

    def spy(cls: type, name: str, note: Callable[..., Event]) -> None:
        original = getattr(cls, name)

        def wrapper(self: Any, *args: Any) -> Any:
            seen.append(note(*args))
            return original(self, *args)

        monkeypatch.setattr(cls, name, wrapper)

    spy(Scheduler, "admit", lambda work, now: ("door", work.id))
    spy(Scheduler, "add", lambda work: ("door", work.id))
    spy(Scheduler, "release", lambda work: ("release", work.id))
    spy(ModelWorker, "dispatch", lambda run: ("thread", run.rows))
    spy(ModelWorker, "execute", lambda run: ("inline", run.rows))

    def settled(result: RunResult) -> Event:
        t = result.timing
        return ("settle", t.rows, t.size, t.failed, t.elements, t.padded, len(t.ends))

    spy(ExecutionEngine, "_on_result", settled)
    spy(ModelMetrics, "record_run", lambda timing, run: ("metrics", timing.rows))
    return seen


@pytest.fixture(params=[logging.WARNING, logging.INFO], ids=["quiet", "info"])
def level(request: pytest.FixtureRequest) -> Iterator[int]:
    logger = logging.getLogger("inferchain")
    saved = logger.level
    logger.setLevel(request.param)
    yield request.param
    logger.setLevel(saved)


XS = np.random.default_rng(3).standard_normal((22, 64)).astype(np.float32)


def calls(oi: ic.OfflineInference) -> dict[str, Callable[[], object]]:
    return {
        "infer": lambda: oi.infer("m", XS[0]),
        "map": lambda: list(oi.map("m", XS)),
        "map_batches": lambda: list(oi.map_batches("m", XS)),
        "submit_many": lambda: (oi.submit_many("m", XS), oi.wait_all()),
    }


def run_each(path: Path, events: list[Event]) -> dict[str, list[Event]]:
    found = {}
    with ic.OfflineInference(mlp(path, warmup=True)) as oi:
        for name, call in calls(oi).items():
            call()  # once to settle the model, then the one recorded
            assert oi.wait_all(timeout=10)
            events.clear()
            call()
            assert oi.wait_all(timeout=10)
            found[name] = list(events)
    return found


def check_one_path(seen: list[Event]) -> None:
    """Every work admitted through the one door and released once; every run handed to an
    executor settled once, each with one metrics call of its rows."""
    doors = [e[1] for e in seen if e[0] == "door"]
    releases = [e[1] for e in seen if e[0] == "release"]
    assert sorted(doors) == sorted(releases) and len(set(doors)) == len(doors)
    handed = [e for e in seen if e[0] in ("thread", "inline")]
    settles = [i for i, e in enumerate(seen) if e[0] == "settle"]
    assert len(handed) == len(settles) > 0
    for i in settles:  # the metrics call is the settle's own, of the same rows
        assert seen[i + 1] == ("metrics", seen[i][1])


def test_every_call_takes_the_one_path_with_the_same_records_at_any_log_level(
    mlp_path: Path, events: list[Event], level: int
) -> None:
    found = run_each(mlp_path, events)
    for seen in found.values():
        check_one_path(seen)
    assert {e[0] for e in found["infer"]} >= {"inline"}  # an idle model: the caller's thread
    assert {e[0] for e in found["submit_many"]} >= {"thread"}  # Requests: the worker's


def test_the_records_do_not_depend_on_the_log_level(mlp_path: Path, events: list[Event]) -> None:
    runs = {}
    logger = logging.getLogger("inferchain")
    saved = logger.level
    try:
        for level in (logging.WARNING, logging.INFO):
            logger.setLevel(level)
            runs[level] = run_each(mlp_path, events)
    finally:
        logger.setLevel(saved)
    assert runs[logging.WARNING] == runs[logging.INFO]


def test_a_failing_batch_takes_the_same_path_at_any_log_level(
    mlp_path: Path, events: list[Event], level: int
) -> None:
    oi, _ = faulty(mlp(mlp_path, warmup=False), fail_runs={2})
    with oi:
        oi.infer("m", XS[0])
        events.clear()
        with pytest.raises(ic.BackendError, match="injected failure"):
            oi.infer("m", XS[1])
        assert oi.wait_all(timeout=10)
    check_one_path(events)
    (settle,) = [e for e in events if e[0] == "settle"]
    assert settle[3] == (0,)  # its one batch failed, and was settled like any other
