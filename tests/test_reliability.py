"""Nothing is lost under faults, bad input and shutdown; every request ends exactly once."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from conftest import faulty, recipe, wait_until
from conftest import mlp_recipe as mlp
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

import inferchain as ic
from inferchain import RequestState as S
from inferchain.backends.onnxruntime import OnnxRuntimeBackend
from inferchain.testing.faults import FaultyBackend
from inferchain.testing.onnx_models import write_mlp64

X = np.ones(64, np.float32)


def test_execute_error_fails_only_its_batch(mlp_path: Path) -> None:
    oi, _ = faulty(mlp(mlp_path, slots=4), fail_runs={2})
    with oi:
        oi.infer("m", X)  # run 1
        batch = oi.submit_many("m", [X] * 4)
        oi.wait_all()
        after = oi.submit_many("m", [X] * 8)
        oi.wait_all()
    assert {r.state for r in batch} == {S.ERROR}
    assert all(isinstance(r.error, ic.BackendError) and r.error.name == "INJECTED" for r in batch)
    assert {r.state for r in after} == {S.DONE}


def test_unhealthy_worker_is_reinitialised_and_recovers(mlp_path: Path) -> None:
    oi, backend = faulty(
        mlp(mlp_path, max_batch_size=1, health={"max_failures": 2}), fail_runs={2, 3}
    )
    with oi:
        oi.infer("m", X)
        failed = [oi.submit("m", X) for _ in range(2)]
        oi.wait_all()
        assert backend.counts["load"] == 2  # re-initialised after two failures in a row
        assert oi.infer("m", X)["y"].shape == (10,)
    assert all(r.state is S.ERROR for r in failed)


def test_fail_fast_while_unhealthy(mlp_path: Path) -> None:
    r = mlp(mlp_path, max_batch_size=1, health={"max_failures": 1, "while_unhealthy": "fail"})
    oi, backend = faulty(r, fail_runs={1}, hold_loads={2})
    with oi:
        doomed = oi.submit("m", X)
        assert doomed.wait(10)
        assert backend.loads.wait_arrived(2)  # the worker re-initialises, held there
        try:
            during = oi.submit_many("m", [X] * 5)
            assert all(r.wait(10) for r in during)  # failed at once, not queued for the worker
        finally:
            backend.loads.open(2)
        assert oi.wait_all(timeout=10)  # no worker re-initialising any more
        assert oi.infer("m", X)["y"].shape == (10,)  # recovered
    assert doomed.state is S.ERROR
    assert all(r.state is S.ERROR and "unhealthy" in str(r.error) for r in during)


def test_a_dying_worker_strands_nothing(mlp_path: Path, no_thread_leak: None) -> None:
    oi, _ = faulty(mlp(mlp_path, instances=2), kill_runs={3})
    with oi:
        reqs = oi.submit_many("m", [X] * 200)
        oi.wait_all(timeout=30)
        assert all(r.done() for r in reqs)
        killed = [r for r in reqs if r.state is S.ERROR]
        assert killed and all(
            "died" in str(r.error) or "INJECTED" not in str(r.error) for r in killed
        )
        assert oi.infer("m", X)["y"].shape == (10,)  # the other instance carries on


def test_when_every_worker_died_requests_fail_fast(mlp_path: Path) -> None:
    oi, _ = faulty(mlp(mlp_path), kill_runs={1})
    with oi:
        first = oi.submit("m", X)
        first.wait(10)
        later = oi.submit_many("m", [X] * 10)
        assert oi.wait_all(timeout=10)
    assert isinstance(first.error, ic.BackendError) and "WorkerKilled" in str(first.error)
    assert all(r.state is S.ERROR and "dead" in str(r.error) for r in later)


def test_load_failure_is_an_init_error(mlp_path: Path, no_thread_leak: None) -> None:
    oi, _ = faulty(mlp(mlp_path, instances=2), fail_loads={2})
    with pytest.raises(ic.LoadError, match="injected load failure"):
        oi.init()


def test_nonfinite_policy(mlp_path: Path) -> None:
    bad = X.copy()
    bad[3] = np.nan
    with (
        ic.OfflineInference(mlp(mlp_path, nonfinite="reject")) as oi,
        pytest.raises(ic.InvalidInput, match="1 NaN or infinite values"),
    ):
        oi.submit("m", bad)
    with ic.OfflineInference(mlp(mlp_path)) as oi:  # the default lets them through
        assert np.isnan(oi.infer("m", bad)["y"]).any()


def test_non_contiguous_inputs_are_fine(mlp_path: Path) -> None:
    wide = np.arange(128, dtype=np.float32)
    with ic.OfflineInference(mlp(mlp_path)) as oi:
        a = oi.infer("m", wide[::2])
        b = oi.infer("m", np.ascontiguousarray(wide[::2]))
    np.testing.assert_array_equal(a["y"], b["y"])


def test_priority_order_end_to_end(mlp_path: Path) -> None:
    """Requests that wait behind a running one are admitted by priority, then by id."""
    oi, backend = faulty(mlp(mlp_path, slots=1, max_batch_size=1), hold_runs={1})
    with oi:
        blocker = oi.submit("m", X)
        assert backend.runs.wait_arrived(1)  # the blocker runs and holds the one slot
        reqs = [oi.submit("m", X, priority=p) for p in (0, 2, 1, 2, 0)]
        backend.runs.open(1)
        assert oi.wait_all(timeout=10)
    assert blocker.state is S.DONE
    order = sorted(reqs, key=lambda q: q.stamp(S.READY) or 0.0)
    assert [(q.priority, q.id) for q in order] == sorted(
        ((q.priority, q.id) for q in reqs), key=lambda t: (-t[0], t[1])
    )


def test_cancelling_the_last_ready_rows_settles_their_work_once(mlp_path: Path) -> None:
    # the worker holds two runs (here batches) at most
    r = mlp(mlp_path, max_batch_size=1, max_queue_delay_ms=1000)
    oi, backend = faulty(r, hold_runs={1})
    with oi:
        busy = oi.submit_many("m", [X, X])  # runs 1 and 2: all the worker takes
        assert backend.runs.wait_arrived(1)
        pair = oi.submit_many("m", [X, X])  # admitted, READY behind the busy ones
        assert wait_until(lambda: pair[1].state is S.READY)
        assert [q.cancel() for q in pair] == [True, True]
        backend.runs.open(1)
        assert oi.wait_all(timeout=10)
        assert backend.counts["run"] == 2  # the cancelled rows never ran
        assert oi.infer("m", X)["y"].shape == (10,)
    assert [q.state for q in busy] == [S.DONE, S.DONE]
    assert [q.state for q in pair] == [S.CANCELLED, S.CANCELLED]


def test_a_failure_fails_a_whole_chain_of_dependents(mlp_path: Path) -> None:
    """Dependents that wait while their dependency runs fail in turn once it fails."""
    oi, backend = faulty(mlp(mlp_path, max_batch_size=1), fail_runs={1}, hold_runs={1})
    with oi:
        first = oi.submit("m", X)
        assert backend.runs.wait_arrived(1)
        chain = [first]
        for _ in range(3):
            chain.append(oi.submit("m", X, depends_on=[chain[-1]]))
        backend.runs.open(1)  # run 1 fails only now: every dependent waits for it
        assert oi.wait_all(timeout=10)  # each failure ends the next dependent in turn
    assert backend.counts["run"] == 1
    assert [q.state for q in chain] == [S.ERROR] * 4
    assert all(isinstance(q.error, ic.DependencyFailed) for q in chain[1:])


def test_queue_full_and_blocking_submit(mlp_path: Path) -> None:
    r = recipe(
        {"name": "m", "path": str(mlp_path), "max_batch_size": 1, "slots": 1, "warmup": False},
        scheduler={"max_queue_size": 2},
    )
    oi, backend = faulty(r, hold_runs={1})
    with oi:
        oi.submit("m", X)
        assert backend.runs.wait_arrived(1)  # admitted and running: it holds the one slot
        oi.submit_many("m", [X, X])  # two rows wait: the queue is full
        with pytest.raises(ic.QueueFull):
            oi.submit("m", X, block=False)
        blocked: list[ic.Request] = []
        submitter = threading.Thread(target=lambda: blocked.append(oi.submit("m", X)))
        submitter.start()  # blocks: no row can leave the queue while run 1 is held
        assert not blocked
        backend.runs.open(1)
        submitter.join(10)
        assert blocked and blocked[0].result(timeout=10)["y"].shape == (10,)  # then it runs


def test_close_under_load_from_another_thread(mlp_path: Path, no_thread_leak: None) -> None:
    oi = ic.OfflineInference(mlp(mlp_path)).init()
    reqs: list[ic.Request] = []
    stop = threading.Event()

    def producer() -> None:
        while not stop.is_set():
            try:
                reqs.extend(oi.submit_many("m", [X] * 50))
            except ic.Closed:
                return

    t = threading.Thread(target=producer)
    t.start()
    while len(reqs) < 2000:
        threading.Event().wait(0.001)
    oi.close(drain_timeout=0.05)
    stop.set()
    t.join(10)
    assert all(r.done() for r in reqs)
    assert {r.state for r in reqs} <= {S.DONE, S.CANCELLED}


class SystemMachine(RuleBasedStateMachine):
    """The whole OfflineInference against a simple model of it: every request ends exactly
    once, a DONE request's outputs are those of its own inputs, injected faults fail only
    the batches they hit, and close() leaves nothing behind."""

    requests = Bundle("requests")
    path: Path

    def __init__(self) -> None:
        super().__init__()
        r = recipe(
            {"name": "a", "path": str(self.path), "max_batch_size": 4, "slots": 6, "warmup": False},
            {"name": "b", "path": str(self.path), "max_batch_size": 2, "instances": 2},
        )
        self.backend = FaultyBackend(OnnxRuntimeBackend(r))
        self.oi = ic.OfflineInference(r, backend=self.backend).init()
        self.reference = ort.InferenceSession(str(self.path))
        self.submitted: dict[int, tuple[ic.Request, np.ndarray]] = {}
        self.checked: set[int] = set()
        self.callbacks: Counter[int] = Counter()
        self.lock = threading.Lock()
        self.rng = np.random.default_rng(0)

    def _callback(self, request: ic.Request) -> None:
        with self.lock:
            self.callbacks[request.id] += 1

    @rule(
        target=requests,
        model=st.sampled_from(["a", "b"]),
        priority=st.integers(-1, 1),
        deps=st.lists(st.integers(0, 50), max_size=2),
        timeout=st.sampled_from([None, None, 0.0005, 5.0]),
    )
    def submit(self, model: str, priority: int, deps: list[int], timeout: float | None) -> Any:
        x = self.rng.standard_normal(64).astype(np.float32)
        known = [r for r, _ in self.submitted.values()]
        depends_on = [known[d % len(known)] for d in deps] if known else []
        req = self.oi.submit(
            model,
            x,
            priority=priority,
            timeout=timeout,
            depends_on=depends_on,
            callback=self._callback,
        )
        self.submitted[req.id] = (req, x)
        return req

    @rule(r=consumes(requests))
    def cancel(self, r: ic.Request) -> None:
        if r.cancel():
            assert r.state is S.CANCELLED and r.outputs is None

    @rule(n=st.integers(1, 3))
    def inject_faults(self, n: int) -> None:
        start = self.backend.counts["run"] + 1
        self.backend.fail_runs.update(range(start, start + n))

    @rule()
    def wait(self) -> None:
        assert self.oi.wait_all(timeout=30)
        assert all(r.done() for r, _ in self.submitted.values())

    @invariant()
    def finished_requests_are_consistent(self) -> None:
        for rid, (r, x) in list(self.submitted.items()):
            if rid in self.checked or not r.done():
                continue
            self.checked.add(rid)
            if r.state is S.DONE:
                assert r.error is None
                (expected,) = self.reference.run(None, {"x": x[None]})
                np.testing.assert_allclose(r.outputs["y"], expected[0], rtol=1e-5, atol=1e-6)
            else:
                assert r.outputs is None and isinstance(r.error, ic.RequestError)
                if r.state is S.ERROR and isinstance(r.error, ic.DependencyFailed):
                    assert any(d.state is not S.DONE for d in r.depends_on)

    def teardown(self) -> None:
        self.oi.close()
        self.finished_requests_are_consistent()
        for rid, (r, _) in self.submitted.items():
            assert r.done()
            assert self.callbacks[rid] == 1, f"request {rid} finished {self.callbacks[rid]} times"
        assert not [t for t in threading.enumerate() if t.name.startswith("inferchain-")]


@pytest.fixture(scope="module")
def machine_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mlp64(tmp_path_factory.mktemp("machine") / "m.onnx")


def test_system_state_machine(machine_model: Path) -> None:
    SystemMachine.path = machine_model
    run_state_machine_as_test(
        SystemMachine, settings=settings(max_examples=20, stateful_step_count=30, deadline=None)
    )


class BrokenSink:
    """A log sink that fails on every write, like a closed or full stream."""

    def msg(self, *args: Any, **kwargs: Any) -> None:
        raise OSError("log sink is gone")

    log = debug = info = warning = error = critical = exception = msg


def test_a_failing_logger_strands_nothing(mlp_path: Path) -> None:
    import structlog

    saved = structlog.get_config()
    structlog.configure(logger_factory=lambda *a: BrokenSink(), cache_logger_on_first_use=False)
    try:
        oi, _ = faulty(mlp(mlp_path, max_batch_size=1), fail_runs={1, 2, 3, 4}, kill_runs={6})
        with oi:
            reqs = oi.submit_many("m", [X] * 10, callback=lambda r: 1 / 0)
            assert oi.wait_all(timeout=20)
        assert all(r.done() for r in reqs)
        states = [r.state for r in reqs]  # failed x4 (re-init after 3), one ran, then died
        assert states.count(S.DONE) == 1 and states.count(S.ERROR) == 9
    finally:
        structlog.configure(**saved)


# -- streams on the caller's thread ------------------------------------------------------


def test_a_stream_on_an_idle_model_runs_on_the_callers_thread(mlp_path: Path) -> None:
    xs = np.random.default_rng(5).standard_normal((40, 64)).astype(np.float32)
    (expected,) = ort.InferenceSession(str(mlp_path)).run(None, {"x": xs})
    oi, backend = faulty(mlp(mlp_path))
    with oi:
        got = np.concatenate([b["y"] for b in oi.map_batches("m", xs)])
        stats = oi.stats().models["m"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert backend.run_threads == ["MainThread"] * 10  # batches of 4, no thread hand-off
    assert stats.requests == 40 and stats.batch_sizes == {4: 10}


def test_a_stream_over_two_instances_runs_on_the_callers_thread_and_a_workers_at_once(
    mlp_path: Path,
) -> None:
    xs = np.random.default_rng(6).standard_normal((40, 64)).astype(np.float32)
    (expected,) = ort.InferenceSession(str(mlp_path)).run(None, {"x": xs})
    oi, backend = faulty(mlp(mlp_path, instances=2))
    with oi:
        got = np.stack([m["y"] for m in oi.map("m", xs)])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    threads = backend.run_threads
    assert threads[0] == "MainThread"  # the caller runs one instance's runs ...
    assert "inferchain-worker-m#1" in threads  # ... while the other's thread runs beside it
    assert "inferchain-worker-m#0" not in threads and len(threads) == 10


def test_a_stream_yields_to_work_that_arrives_meanwhile(mlp_path: Path) -> None:
    xs = np.random.default_rng(7).standard_normal((400, 64)).astype(np.float32)
    (expected,) = ort.InferenceSession(str(mlp_path)).run(None, {"x": xs})
    oi, _ = faulty(mlp(mlp_path, max_queue_delay_ms=0))
    with oi:
        other: list[ic.Request] = []
        for i, out in enumerate(oi.map("m", xs, max_in_flight=400)):
            np.testing.assert_allclose(out["y"], expected[i], rtol=1e-5, atol=1e-6)
            if i == 0:  # from another thread while the stream's work may still run
                t = threading.Thread(target=lambda: other.extend(oi.submit_many("m", xs[:8])))
                t.start()
                t.join()
        assert oi.wait_all(timeout=10)
    assert [r.state for r in other] == [S.DONE] * 8
    for r, want in zip(other, expected[:8], strict=True):
        np.testing.assert_allclose(r.outputs["y"], want, rtol=1e-5, atol=1e-6)


def test_cancel_all_stops_a_stream_running_on_the_callers_thread(mlp_path: Path) -> None:
    xs = np.ones((100_000, 64), np.float32)  # 25,000 short batches, in four works
    oi, backend = faulty(mlp(mlp_path))
    with oi:
        timer = threading.Timer(0.05, oi.cancel_all)
        timer.start()
        results = list(oi.map("m", xs, max_in_flight=100_000, on_error="return"))
        timer.join()
        assert oi.wait_all(timeout=10)
        assert oi.infer("m", X)["y"].shape == (10,)
    assert len(results) == 100_000
    cancelled = np.flatnonzero([isinstance(r, ic.RequestCancelled) for r in results])
    assert len(cancelled) > 0  # the rest of the work running then; later works still ran
    assert (np.diff(cancelled) == 1).all() and (cancelled[-1] + 1) % 25_000 == 0
    assert backend.counts["run"] == (100_000 - len(cancelled)) // 4 + 1  # those never ran
