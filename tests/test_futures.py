"""A Request composes with concurrent.futures and asyncio like any future."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import faulty, mlp_recipe, recipe, wait_until

import inferchain as ic
from inferchain import RequestState as S
from inferchain.backends.onnxruntime import OnnxRuntimeBackend
from inferchain.testing.faults import FaultyBackend

X = np.ones(64, np.float32)


def test_wait_and_as_completed_see_every_request(mlp_path: Path) -> None:
    xs = np.random.default_rng(1).standard_normal((60, 64)).astype(np.float32)
    (expected,) = ort.InferenceSession(str(mlp_path)).run(None, {"x": xs})
    oi, _ = faulty(mlp_recipe(mlp_path), fail_runs={3})
    with oi:
        reqs = oi.submit_many("m", list(xs))
        done, not_done = cf.wait(reqs, timeout=30)
        assert not not_done and done == set(reqs)
        seen = list(cf.as_completed(reqs, timeout=30))
    assert sorted(r.id for r in seen) == sorted(r.id for r in reqs)
    failed = [r for r in reqs if r.exception() is not None]
    assert failed and all(isinstance(r.exception(), ic.BackendError) for r in failed)
    for i, r in enumerate(reqs):
        if r.exception() is None:
            np.testing.assert_allclose(r.result()["y"], expected[i], rtol=1e-5, atol=1e-6)


def test_wait_returns_as_soon_as_one_finishes_or_fails(mlp_path: Path) -> None:
    oi, backend = faulty(mlp_recipe(mlp_path), fail_runs={2}, hold_runs={3})
    with oi:
        oi.infer("m", X)  # run 1
        first = oi.submit("m", X)  # run 2 fails
        first.wait(10)
        slow = oi.submit("m", X)  # run 3 is held
        done, pending = cf.wait([first, slow], return_when=cf.FIRST_EXCEPTION, timeout=10)
        assert done == {first} and pending == {slow}
        backend.runs.open(3)
        later = oi.submit("m", X)
        done, _ = cf.wait([slow, later], return_when=cf.FIRST_COMPLETED, timeout=10)
        assert done and done <= {slow, later}
        assert oi.wait_all(timeout=10)


def test_a_waiter_installed_before_the_end_is_woken(mlp_path: Path) -> None:
    oi, backend = faulty(mlp_recipe(mlp_path), hold_runs={1})
    with oi:
        reqs = oi.submit_many("m", [X] * 6)  # siblings share one lock: no self-deadlock
        waiting = threading.Thread(target=lambda: cf.wait(reqs, timeout=10))
        waiting.start()
        assert wait_until(lambda: all(r._waiters for r in reqs))  # cf.wait's, on each
        assert not any(r.done() for r in reqs)  # installed before any ended
        backend.runs.open(1)
        waiting.join(10)
        assert not waiting.is_alive()
        assert all(r.state is S.DONE for r in reqs)


def test_cancel_result_exception_and_done_callbacks(mlp_path: Path) -> None:
    calls: list[tuple[int, bool]] = []
    oi, backend = faulty(mlp_recipe(mlp_path, slots=1), hold_runs={1})
    with oi:
        blocker = oi.submit("m", X)
        queued = oi.submit_many("m", [X] * 8)  # waits: the blocker holds the one slot
        victim = queued[-1]
        victim.add_done_callback(lambda r: calls.append((r.id, r.cancelled())))
        victim.add_done_callback(lambda r: 1 / 0)  # logged and ignored
        assert victim.cancel() and victim.cancelled() and victim.done()
        with pytest.raises(cf.CancelledError):
            victim.result()
        with pytest.raises(ic.RequestCancelled):
            victim.exception()
        backend.runs.open(1)
        assert blocker.exception(timeout=10) is None
        assert oi.wait_all(timeout=10)
        late: list[int] = []
        blocker.add_done_callback(lambda r: late.append(r.id))  # already done: runs at once
    assert calls == [(victim.id, True)]
    assert late == [blocker.id]
    with pytest.raises(TimeoutError):
        ic.Request(1, "m", (X,)).exception(timeout=0.01)


def test_requests_are_awaitable(mlp_path: Path) -> None:
    xs = np.random.default_rng(2).standard_normal((12, 64)).astype(np.float32)
    (expected,) = ort.InferenceSession(str(mlp_path)).run(None, {"x": xs})

    r = recipe({"name": "m", "path": str(mlp_path), "max_batch_size": 4})
    backend = FaultyBackend(OnnxRuntimeBackend(r))

    async def main(oi: ic.OfflineInference) -> list[np.ndarray]:
        outs = await asyncio.gather(*(oi.submit("m", x) for x in xs))
        backend.fail_p = 1.0
        with pytest.raises(ic.BackendError, match="injected"):
            await oi.submit("m", X)
        return [o["y"] for o in outs]

    with ic.OfflineInference(r, backend=backend) as oi:
        got = asyncio.run(main(oi))
    np.testing.assert_allclose(np.stack(got), expected, rtol=1e-5, atol=1e-6)


def test_a_cancelled_task_cancels_its_request(mlp_path: Path) -> None:
    async def main(oi: ic.OfflineInference) -> ic.Request:
        oi.submit("m", X)  # run 1 is held: what follows waits
        req = oi.submit("m", X)
        task = asyncio.ensure_future(_await(req))
        await asyncio.sleep(0)  # the task runs up to its first wait: on the request
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return req

    async def _await(req: ic.Request) -> object:
        return await req

    oi, backend = faulty(mlp_recipe(mlp_path, slots=1), hold_runs={1})
    with oi:
        req = asyncio.run(main(oi))
        backend.runs.open(1)
        assert oi.wait_all(timeout=10)
    assert req.state is S.CANCELLED


def test_a_request_has_what_its_docstring_lists_and_is_no_future_subclass() -> None:
    """The documented surface (README, `Request`): Future's reading and waiting methods,
    not its setters, and no claim to be a `concurrent.futures.Future`."""
    req = ic.Request(1, "m", (X,))
    for name in ("result", "exception", "done", "running", "cancelled", "cancel"):
        assert callable(getattr(req, name)), name
    assert callable(req.add_done_callback) and callable(req.__await__)
    assert not isinstance(req, cf.Future)
    assert not hasattr(req, "set_result") and not hasattr(req, "set_exception")
    with pytest.raises(AssertionError, match=r"concurrent\.futures\.Future is expected"):
        asyncio.wrap_future(req)  # type: ignore[arg-type]
