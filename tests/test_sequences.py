"""Sequences of a stateful model: steps in order, state kept in lanes, batched across sequences."""

from __future__ import annotations

import threading
from pathlib import Path

import conftest
import numpy as np
import pytest
from conftest import ACC_WIDTH, recipe
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import inferchain as ic
from inferchain import RequestState as S
from inferchain.backends.onnxruntime import OnnxRuntimeBackend
from inferchain.testing.faults import FaultyBackend

W = ACC_WIDTH


def acc_recipe(path: Path, **model: object) -> ic.Recipe:
    return conftest.acc_recipe(path, **{"max_queue_delay_ms": 2, **model})


def test_a_sequence_carries_its_state_from_step_to_step(acc_path: Path) -> None:
    xs = np.random.default_rng(0).standard_normal((6, W)).astype(np.float32)
    with ic.OfflineInference(acc_recipe(acc_path)) as oi:
        with oi.sequence("acc") as seq:
            totals = [seq.step({"x": x}).result(timeout=10)["total"] for x in xs]
        start = np.full(W, 10, np.float32)
        with oi.sequence("acc", state={"state": start}) as seq:
            first = seq.step({"x": xs[0]}).result(timeout=10)["total"]
    np.testing.assert_allclose(np.stack(totals), np.cumsum(xs, axis=0), rtol=1e-6)
    np.testing.assert_allclose(first, start + xs[0], rtol=1e-6)


def test_steps_of_many_sequences_batch_together(acc_path: Path) -> None:
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((4, 5, W)).astype(np.float32)  # 4 sequences of 5 steps
    with ic.OfflineInference(acc_recipe(acc_path, max_queue_delay_ms=50)) as oi:
        seqs = [oi.sequence("acc") for _ in range(4)]
        totals = np.empty_like(xs)
        for k in range(5):  # every sequence's step k goes in before any result is read
            reqs = [s.step({"x": xs[i, k]}) for i, s in enumerate(seqs)]
            for i, r in enumerate(reqs):
                totals[i, k] = r.result(timeout=10)["total"]
        for s in seqs:
            s.close()
        sizes = oi.stats().models["acc"].batch_sizes
    np.testing.assert_allclose(totals, np.cumsum(xs, axis=1), rtol=1e-6)
    assert max(sizes) > 1  # steps of different sequences shared batches


LONG = 60_000  # ms: a batching window no test waits for


def test_live_sequences_step_in_cohorts_of_one_batch_each(acc_path: Path) -> None:
    """4 live sequences step in 2 Works of 2: a cohort of steps leaves as soon as it is
    complete, without waiting for the window (the engine may still run both as one batch)."""
    one = np.ones(W, np.float32)
    with ic.OfflineInference(acc_recipe(acc_path, max_queue_delay_ms=LONG)) as oi:
        seqs = [oi.sequence("acc") for _ in range(4)]
        reqs = [s.step({"x": one * (i + 1)}) for i, s in enumerate(seqs)]
        works = [r.work for r in reqs]
        totals = [r.result(timeout=10)["total"] for r in reqs]
        sizes = oi.stats().models["acc"].batch_sizes
        for s in seqs:
            s.close()
    assert works[0] is works[1] and works[2] is works[3] and works[1] is not works[2]
    assert sum(n * k for n, k in sizes.items()) == 4 and sum(sizes.values()) <= 2
    for i, total in enumerate(totals):
        np.testing.assert_array_equal(total, one * (i + 1))


def test_a_step_waiting_for_its_cohort_runs_at_wait_all_and_close(acc_path: Path) -> None:
    one = np.ones(W, np.float32)
    oi = ic.OfflineInference(acc_recipe(acc_path, max_queue_delay_ms=LONG)).init()
    seqs = [oi.sequence("acc") for _ in range(3)]  # a cohort is 2 steps
    first = seqs[0].step({"x": one})
    assert first.state is S.WAITING
    assert oi.wait_all(timeout=10)  # sends what is queued, then waits for it
    np.testing.assert_array_equal(first.result(timeout=0)["total"], one)
    second = seqs[0].step({"x": one})
    oi.close()  # the queued step runs before the drain
    assert second.state is S.DONE
    np.testing.assert_array_equal(second.outputs["total"], 2 * one)  # type: ignore[index]


def test_a_step_alone_leaves_after_the_batching_window(acc_path: Path) -> None:
    one = np.ones(W, np.float32)
    with ic.OfflineInference(acc_recipe(acc_path, max_queue_delay_ms=20)) as oi:
        seqs = [oi.sequence("acc") for _ in range(3)]
        out = seqs[1].step({"x": one}).result(timeout=10)["total"]
        for s in seqs:
            s.close()
    np.testing.assert_array_equal(out, one)


def test_a_cancelled_step_leaves_its_cohort_and_the_rest_run(acc_path: Path) -> None:
    one = np.ones(W, np.float32)
    with ic.OfflineInference(acc_recipe(acc_path, max_queue_delay_ms=LONG)) as oi:
        seqs = [oi.sequence("acc") for _ in range(4)]
        doomed = seqs[0].step({"x": one})
        assert doomed.cancel()
        with pytest.raises(ic.RequestError, match="CANCELLED"):
            seqs[0].step({"x": one})  # its sequence cannot go on
        seqs[0].close()  # 3 live: a cohort is 2 steps
        a, b = seqs[1].step({"x": one}), seqs[2].step({"x": 2 * one})
        np.testing.assert_array_equal(a.result(timeout=10)["total"], one)
        np.testing.assert_array_equal(b.result(timeout=10)["total"], 2 * one)
        assert doomed.state is S.CANCELLED
        assert oi.stats().models["acc"].batch_sizes == {2: 1}
        for s in seqs[1:]:
            s.close()
        assert oi.wait_all(timeout=10)


def test_lanes_are_reused_and_bounded(acc_path: Path) -> None:
    with ic.OfflineInference(acc_recipe(acc_path, max_sequences=2)) as oi:
        a, b = oi.sequence("acc"), oi.sequence("acc")
        with pytest.raises(ic.QueueFull, match="all 2 sequence lanes"):
            oi.sequence("acc", timeout=0.01)
        a.step({"x": np.ones(W, np.float32)}).result(timeout=10)
        a.close()
        c = oi.sequence("acc", timeout=1)  # a's lane, back to zeros
        assert c.lane == a.lane
        out = c.step({"x": np.ones(W, np.float32)}).result(timeout=10)["total"]
        np.testing.assert_array_equal(out, np.ones(W, np.float32))
        b.close()
        c.close()


def test_bad_steps_fail_at_submit_and_nothing_else(acc_path: Path) -> None:
    with ic.OfflineInference(acc_recipe(acc_path)) as oi:
        seq = oi.sequence("acc")
        with pytest.raises(ic.InvalidInput, match="carried by the sequence"):
            seq.step({"x": np.ones(W, np.float32), "state": np.ones(W, np.float32)})
        with pytest.raises(ic.InvalidInput, match=r"'x'.*shape"):
            seq.step({"x": np.ones(W + 1, np.float32)})
        with pytest.raises(ic.InvalidInput, match="a mapping"):
            seq.step(np.ones(W, np.float32))  # type: ignore[arg-type]
        with pytest.raises(ic.InvalidInput, match=r"\['hidden'\] are not carried"):
            oi.sequence("acc", state={"hidden": np.ones(W)})
        with pytest.raises(ic.InvalidInput, match="initial value of shape"):
            oi.sequence("acc", state={"state": np.ones(W + 2)})
        first = seq.step({"x": np.ones(W, np.float32)})
        first.wait(10)
        out = seq.step({"x": np.ones(W, np.float32)}).result(timeout=10)["total"]
        np.testing.assert_array_equal(out, np.full(W, 2, np.float32))  # the bad ones left no trace
        seq.close()
        with pytest.raises(ic.Closed):
            seq.step({"x": np.ones(W, np.float32)})
        assert oi.stats().models["acc"].requests == 2


def test_steps_run_one_after_the_other(acc_path: Path) -> None:
    r = acc_recipe(acc_path)
    backend = FaultyBackend(OnnxRuntimeBackend(r), hold_runs={1})
    with ic.OfflineInference(r, backend=backend) as oi, oi.sequence("acc") as seq:
        first = seq.step({"x": np.ones(W, np.float32)})
        assert backend.runs.wait_arrived(1)  # step 1 runs, and cannot end before it is let go
        with pytest.raises(ic.InvalidInput, match="before step 1 ended"):
            seq.step({"x": np.ones(W, np.float32)})
        backend.runs.open(1)
        first.result(timeout=10)


def test_a_failed_step_ends_only_its_sequence(acc_path: Path) -> None:
    r = acc_recipe(acc_path, max_batch_size=1)
    backend = FaultyBackend(OnnxRuntimeBackend(r), fail_runs={2})
    with ic.OfflineInference(r, backend=backend) as oi:
        a, b = oi.sequence("acc"), oi.sequence("acc")
        one = np.ones(W, np.float32)
        a.step({"x": one}).result(timeout=10)  # run 1
        failed = b.step({"x": one})  # run 2 fails
        assert failed.exception(timeout=10) is not None
        with pytest.raises(ic.RequestError, match="its state is lost"):
            b.step({"x": one})
        out = a.step({"x": one}).result(timeout=10)["total"]
        np.testing.assert_array_equal(out, np.full(W, 2, np.float32))
        a.close()
        b.close()


def test_a_model_without_state_has_no_sequences(mlp_path: Path) -> None:
    r = recipe({"name": "m", "path": str(mlp_path), "max_batch_size": 4})
    with ic.OfflineInference(r) as oi, pytest.raises(ic.ConfigError, match="carries no state"):
        oi.sequence("m")


def test_a_state_pair_must_name_the_models_own_output_and_input(acc_path: Path) -> None:
    with pytest.raises(ic.ConfigError, match="'stateX' is not an output"):
        ic.OfflineInference(acc_recipe(acc_path, state={"stateX": "state"})).init()
    with pytest.raises(ic.ConfigError, match="'hidden' is not an input"):
        ic.OfflineInference(acc_recipe(acc_path, state={"stateN": "hidden"})).init()


class SequenceMachine(RuleBasedStateMachine):
    """Sequences open, step (from one thread or several at once), fail and close at random
    against a model of running sums: each step's total is its sequence's own running sum
    (a step never sees another sequence's state), a closed sequence's lane is reused, and
    every step ends exactly once."""

    path: Path

    def __init__(self) -> None:
        super().__init__()
        r = acc_recipe(self.path, max_sequences=3, max_batch_size=4)
        self.backend = FaultyBackend(OnnxRuntimeBackend(r))
        self.oi = ic.OfflineInference(r, backend=self.backend).init()
        self.live: dict[
            int, tuple[ic.LiveSequence, np.ndarray, bool]
        ] = {}  # lane -> (seq, sum, ok)
        self.steps: list[ic.Request] = []
        self.rng = np.random.default_rng(0)

    @precondition(lambda self: len(self.live) < 3)
    @rule(start=st.floats(-4, 4, width=32))
    def open(self, start: float) -> None:
        initial = np.full(W, start, np.float32)
        seq = self.oi.sequence("acc", state={"state": initial}, timeout=5)
        assert seq.lane not in self.live
        self.live[seq.lane] = (seq, initial, True)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def step_all(self, data: st.DataObject) -> None:
        """The next step of every healthy live sequence at once, so they share batches."""
        fail = data.draw(st.booleans())
        if fail:
            self.backend.fail_runs.add(self.backend.counts["run"] + 1)
        pending = []
        for lane, (seq, _, ok) in self.live.items():
            if ok:
                x = self.rng.standard_normal(W).astype(np.float32)
                pending.append((lane, x, seq.step({"x": x})))
        for lane, x, req in pending:
            seq, total, _ = self.live[lane]
            self.steps.append(req)
            if req.exception(timeout=10) is None:
                expected = total + x
                np.testing.assert_allclose(req.result()["total"], expected, rtol=1e-5, atol=1e-5)
                self.live[lane] = (seq, expected, True)
            else:
                self.live[lane] = (seq, total, False)
        self.backend.fail_runs.clear()

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(sorted(self.live)))
        seq, _, _ = self.live.pop(lane)
        seq.close()

    @invariant()
    def lanes_add_up(self) -> None:
        pool = self.oi._models["acc"].pool
        assert pool is not None and pool.num_free == 3 - len(self.live)

    def teardown(self) -> None:
        for seq, _, _ in self.live.values():
            seq.close()
        self.oi.close()
        assert all(r.done() for r in self.steps)
        assert not [t for t in threading.enumerate() if t.name.startswith("inferchain-")]


def test_sequence_state_machine(acc_path: Path) -> None:
    SequenceMachine.path = acc_path
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        SequenceMachine, settings=settings(max_examples=15, stateful_step_count=20, deadline=None)
    )
