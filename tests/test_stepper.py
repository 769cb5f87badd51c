"""`oi.run_sequence` with a `Stepper`: the host logic of many sequences at once, one call per
step batch; lanes, cancels, failures and close."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import conftest
import numpy as np
import pytest
from conftest import ACC_WIDTH
from hypothesis import given, settings
from hypothesis import strategies as st

import inferchain as ic
from inferchain import RequestState as S
from inferchain.backends.onnxruntime import OnnxRuntimeBackend
from inferchain.pipeline import Pipeline, Process
from inferchain.testing.faults import FaultyBackend

W = ACC_WIDTH  # total = x + state, carried as stateN -> state


def acc_recipe(path: Path, **model: object) -> ic.Recipe:
    return conftest.acc_recipe(path, **{"max_sequences": 6, **model})


class Sums:
    """One sequence: the rows to add, one per step, and the totals seen."""

    def __init__(self, xs: np.ndarray) -> None:
        self.xs = xs  # f32[steps, rows, W]
        self.k = 0
        self.totals: list[np.ndarray] = []
        self.batches = 0  # take() calls that had this sequence (AheadSteps)


class SumSteps(ic.Stepper):
    """Feeds each sequence's next rows; ends it after its last."""

    def __init__(self, rows: int = 1, fail_at: int | None = None) -> None:
        self.rows = rows
        self.fail_at = fail_at  # a take() when this many steps ran in all: raises
        self.calls = 0  # take() calls
        self.steps = 0

    def start(self, item: np.ndarray) -> Sums:
        return Sums(item)

    def feed(self, states: Sequence[Sums]) -> Mapping[str, np.ndarray]:
        return {"x": np.concatenate([s.xs[s.k] for s in states])}

    def take(self, states: Sequence[Sums], outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        self.calls += 1
        if self.fail_at is not None and self.steps >= self.fail_at:
            raise ValueError("the host step failed")
        totals = outputs["total"].reshape(len(states), self.rows, W)
        for s, t in zip(states, totals, strict=True):
            s.totals.append(t.copy())
            s.k += 1
        self.steps += len(states)
        return np.array([s.k == len(s.xs) for s in states])

    def result(self, state: Sums) -> np.ndarray:
        return np.stack(state.totals)


def sequences(n: int, seed: int = 0, rows: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(1, 12)), rows, W)).astype(np.float32)
            for _ in range(n)]  # fmt: skip


def test_sequences_step_together_and_give_each_its_running_sums(acc_path: Path) -> None:
    xs = sequences(20)
    stepper = SumSteps()
    with ic.OfflineInference(acc_recipe(acc_path)) as oi:
        reqs = [oi.run_sequence("acc", stepper, x) for x in xs]  # 20 sequences, 6 lanes
        outs = [r.result(timeout=10) for r in reqs]
        stats = oi.stats().models["acc"]
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_allclose(out, np.cumsum(x, axis=0), rtol=1e-5)
    steps = sum(len(x) for x in xs)
    assert stats.requests == steps and stats.sequences is not None
    assert stats.sequences.live_max <= 6  # the lanes bound the live sequences
    assert stepper.calls < steps  # one host call per step batch, not per step
    assert stats.mean_batch_size > 1


def test_sequences_of_different_groups_never_share_a_step_batch(acc_path: Path) -> None:
    """`Stepper.group`: every step batch holds sequences of one group only (here: the
    parity of their length), while each still gets its own running sums; without groups
    the same sequences do share batches."""

    class ByParity(SumSteps):
        def __init__(self, grouped: bool) -> None:
            super().__init__()
            self.grouped = grouped
            self.batches: list[set[int]] = []  # the groups of each step batch fed

        def group(self, state: Sums) -> int | None:
            return len(state.xs) % 2 if self.grouped else None

        def feed(self, states: Sequence[Sums]) -> Mapping[str, np.ndarray]:
            self.batches.append({len(s.xs) % 2 for s in states})
            return super().feed(states)

    xs = sequences(24, seed=4)
    for grouped in (True, False):
        stepper = ByParity(grouped)
        with ic.OfflineInference(acc_recipe(acc_path, max_sequences=12)) as oi:
            outs = [r.result(timeout=10) for r in [oi.run_sequence("acc", stepper, x) for x in xs]]
        for x, out in zip(xs, outs, strict=True):
            np.testing.assert_allclose(out, np.cumsum(x, axis=0), rtol=1e-5)
        kinds = {frozenset(b) for b in stepper.batches}
        if grouped:
            assert kinds == {frozenset({0}), frozenset({1})}
        else:
            assert frozenset({0, 1}) in kinds


def test_a_stepper_runs_inside_a_pipeline(acc_path: Path) -> None:
    stepper = SumSteps()

    class Totals(Pipeline):
        def process(self, item: np.ndarray) -> Process:
            sums = yield self.oi.run_sequence("acc", stepper, item)
            return float(sums[-1].sum())

    xs = sequences(15, seed=1)
    with ic.OfflineInference(acc_recipe(acc_path)) as oi:
        oi._pipeline = Totals(oi)
        got = list(oi.run(xs))
    assert got == pytest.approx([float(x.sum()) for x in xs], rel=1e-4)


def test_rows_and_reorder_move_state_within_a_sequence(acc_path: Path) -> None:
    """Two rows per sequence; after each step the rows swap their states."""

    class Swap(SumSteps):
        def take(self, states: Sequence[Sums], outputs: Mapping[str, np.ndarray]) -> Any:
            ended = super().take(states, outputs)
            return ended, np.tile([1, 0], (len(states), 1))

    xs = sequences(5, seed=2, rows=2)
    with ic.OfflineInference(acc_recipe(acc_path, max_sequences=4)) as oi:
        outs = [r.result(timeout=10) for r in [oi.run_sequence("acc", Swap(rows=2), x) for x in xs]]
    for x, out in zip(xs, outs, strict=True):
        state = np.zeros((2, W), np.float32)
        for k in range(len(x)):
            total = x[k] + state
            np.testing.assert_allclose(out[k], total, rtol=1e-5)
            state = total[::-1]


def test_a_cancelled_sequence_frees_its_lane_and_the_others_finish(acc_path: Path) -> None:
    long = np.ones((400, 1, W), np.float32)
    with ic.OfflineInference(acc_recipe(acc_path, max_sequences=2)) as oi:
        stepper = SumSteps()
        doomed = oi.run_sequence("acc", stepper, long)
        other = oi.run_sequence("acc", stepper, long[:3])
        waiting = oi.run_sequence("acc", stepper, long[:2])  # no lane until one is freed
        assert doomed.cancel()
        assert doomed.state is S.CANCELLED
        np.testing.assert_allclose(waiting.result(timeout=10)[-1], 2 * long[0])
        np.testing.assert_allclose(other.result(timeout=10)[-1], 3 * long[0])
        assert oi.wait_all(timeout=10)


def test_a_sequence_times_out_between_steps_and_frees_its_lane(acc_path: Path) -> None:
    endless = np.ones((100_000, 1, W), np.float32)
    with ic.OfflineInference(acc_recipe(acc_path, max_sequences=2)) as oi:
        stepper = SumSteps()
        late = oi.run_sequence("acc", stepper, endless, timeout=0.2)
        other = oi.run_sequence("acc", stepper, endless[:5], timeout=30)
        waiting = oi.run_sequence("acc", stepper, endless[:4])  # a lane once `other` ends
        assert late.wait(10) and late.state is S.TIMED_OUT
        assert isinstance(late.error, ic.RequestTimeout) and "deadline" in str(late.error)
        assert 0 < stepper.steps < len(endless)  # it ran some steps, then timed out
        np.testing.assert_allclose(other.result(timeout=10)[-1], 5 * endless[0])
        np.testing.assert_allclose(waiting.result(timeout=10)[-1], 4 * endless[0])
        assert oi.wait_all(timeout=10)
        assert oi._model("acc").pool.num_free == 2  # type: ignore[union-attr]


def test_a_waiting_sequence_times_out_before_it_starts(acc_path: Path) -> None:
    with ic.OfflineInference(acc_recipe(acc_path, max_sequences=1)) as oi:
        stepper = SumSteps()
        first = oi.run_sequence("acc", stepper, np.ones((300, 1, W), np.float32))
        behind = oi.run_sequence("acc", stepper, np.ones((2, 1, W), np.float32))  # no timeout
        never = oi.run_sequence("acc", stepper, np.ones((3, 1, W), np.float32), timeout=0.0)
        assert never.wait(10) and never.state is S.TIMED_OUT  # behind another in line
        assert not first.done()
        assert first.result(timeout=30)[-1][0][0] == 300
        assert behind.result(timeout=30)[-1][0][0] == 2


def test_a_failure_ends_the_sequences_of_its_batch_only(acc_path: Path) -> None:
    r = acc_recipe(acc_path, max_batch_size=1, max_sequences=1)
    backend = FaultyBackend(OnnxRuntimeBackend(r), fail_runs={3})
    xs = sequences(3, seed=3)
    with ic.OfflineInference(r, backend=backend) as oi:
        stepper = SumSteps()
        reqs = [oi.run_sequence("acc", stepper, x) for x in xs]
        errors = [r.exception(timeout=10) for r in reqs]
    assert sum(e is not None for e in errors) == 1  # the run that failed had one sequence
    assert isinstance(next(e for e in errors if e is not None), ic.BackendError)


def test_a_host_step_that_raises_fails_its_sequences_and_the_rest_go_on(acc_path: Path) -> None:
    xs = [np.ones((5, 1, W), np.float32)] * 2
    with ic.OfflineInference(acc_recipe(acc_path, max_sequences=1)) as oi:
        stepper = SumSteps(fail_at=2)
        first = oi.run_sequence("acc", stepper, xs[0])
        second = oi.run_sequence("acc", stepper, xs[1])
        with pytest.raises(ValueError, match="host step failed"):
            first.result(timeout=10)
        with pytest.raises(ValueError, match="host step failed"):
            second.result(timeout=10)  # the same stepper fails it too, alone
        fine = oi.run_sequence("acc", SumSteps(), xs[0][:2])
        np.testing.assert_allclose(fine.result(timeout=10)[-1], 2 * xs[0][0])


def test_a_bad_feed_is_an_error_naming_the_inputs(acc_path: Path) -> None:
    class Bad(SumSteps):
        def feed(self, states: Sequence[Sums]) -> Mapping[str, np.ndarray]:
            return {"y": np.zeros((len(states), W), np.float32)}

    with (
        ic.OfflineInference(acc_recipe(acc_path)) as oi,
        pytest.raises(ic.InvalidInput, match=r"feed\(\) gave \['y'\].*not carried are \['x'\]"),
    ):
        oi.run_sequence("acc", Bad(), np.ones((2, 1, W), np.float32)).result(timeout=10)


class AheadSteps(ic.Stepper):
    """SumSteps with `k` steps per batch: feeds each sequence's next k steps (zeros past
    its end) and keeps the totals of its own steps."""

    def __init__(self, k: int, rows: int = 1) -> None:
        self.steps_per_batch = k
        self.rows = rows
        self.shapes: list[tuple[tuple[int, ...], ...]] = []  # per take: its outputs' shapes
        self.started: dict[int, Sums] = {}  # id of each item -> its state

    def start(self, item: np.ndarray) -> Sums:
        state = self.started[id(item)] = Sums(item)
        return state

    def feed(self, states: Sequence[Sums]) -> Mapping[str, np.ndarray]:
        k, rows = self.steps_per_batch, self.rows
        x = np.zeros((len(states), rows, k, W), np.float32)
        for j, s in enumerate(states):
            part = s.xs[s.k : s.k + k]  # [steps, rows, W]
            x[j, :, : len(part)] = part.transpose(1, 0, 2)
        return {"x": x.reshape(len(states) * rows, k, W)}

    def take(self, states: Sequence[Sums], outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        k, rows = self.steps_per_batch, self.rows
        self.shapes.append((outputs["total"].shape, outputs["stateN"].shape))
        totals = outputs["total"].reshape(len(states), rows, k, W)
        for s, t in zip(states, totals, strict=True):
            s.batches += 1
            m = min(k, len(s.xs) - s.k)
            s.totals += [t[:, j].copy() for j in range(m)]
            s.k += m
        return np.array([s.k == len(s.xs) for s in states])

    def result(self, state: Sums) -> np.ndarray:
        return np.stack(state.totals)


@pytest.mark.parametrize("rows", [1, 2])
def test_a_multi_step_batch_runs_k_steps_with_the_state_carried_between_them(
    acc_path: Path, rows: int
) -> None:
    xs = sequences(20, seed=5, rows=rows)
    stepper = AheadSteps(3, rows=rows)
    with ic.OfflineInference(acc_recipe(acc_path)) as oi:
        reqs = [oi.run_sequence("acc", stepper, x) for x in xs]
        states = [stepper.started[id(x)] for x in xs]
        outs = [r.result(timeout=10) for r in reqs]
        stats = oi.stats().models["acc"].sequences
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_allclose(out, np.cumsum(x, axis=0), rtol=1e-5)
    assert all(total[1:] == state[1:] == (3, W) for total, state in stepper.shapes)
    # one host call per 3 steps of each sequence (its last batch padded)
    assert [s.batches for s in states] == [-(-len(x) // 3) for x in xs]
    assert stats is not None and stats.steps == 3 * rows * sum(s.batches for s in states)


def test_multi_step_batches_carry_state_on_its_batch_axis_with_a_fixed_batch(
    tmp_path: Path,
) -> None:
    """write_stateful: state [2, N, H] (rows on axis 1), `gain` one scalar per batch, a model
    compiled for a batch of 8 (rows padded); each batch sets `gain` in place."""
    from inferchain.testing.onnx_models import write_stateful

    path = write_stateful(tmp_path / "stateful.onnx", hidden=3, batch=8)
    k = 4
    gains: list[float] = []  # per batch of this single sequence

    class Gained(ic.Stepper):
        steps_per_batch = k

        def __init__(self) -> None:
            self.gain = np.zeros((), np.float16)  # cast to the model's float32

        def start(self, item: np.ndarray) -> dict[str, Any]:
            return {"xs": item, "k": 0, "ys": []}

        def feed(self, states: Sequence[dict[str, Any]]) -> Mapping[str, np.ndarray]:
            self.gain[...] = 0.5 + len(gains)
            gains.append(float(self.gain))
            x = np.stack([s["xs"][s["k"] : s["k"] + k] for s in states])
            return {"x": x, "gain": self.gain}

        def take(self, states: Sequence[dict[str, Any]], outputs: Mapping[str, Any]) -> Any:
            assert outputs["stateN"].shape == (len(states), k, 2, 3)  # rows first
            for s, y in zip(states, outputs["y"], strict=True):
                s["ys"] += list(y)
                s["k"] += k
            return [s["k"] >= len(s["xs"]) for s in states]

        def result(self, state: dict[str, Any]) -> np.ndarray:
            return np.stack(state["ys"])

    xs = np.random.default_rng(6).standard_normal((3 * k, 3)).astype(np.float32)
    model = {"inputs": {"state": {"batch_axis": 1}, "gain": {"batched": False}}}
    with ic.OfflineInference(
        conftest.recipe(
            {
                "name": "s",
                "path": str(path),
                "max_batch_size": 8,
                "state": {"stateN": "state"},
                "max_sequences": 2,
                "warmup": False,
                **model,
            }
        )
    ) as oi:
        got = oi.run_sequence("s", Gained(), xs).result(timeout=10)
    state = np.zeros((2, 3), np.float32)
    expected = []
    for j, x in enumerate(xs):
        state = state * np.float32(gains[j // k]) + x
        expected.append(state.mean(axis=0))
    assert gains == [0.5, 1.5, 2.5]
    np.testing.assert_allclose(got, np.stack(expected), rtol=1e-5)


def test_a_multi_step_feed_without_the_step_axis_names_it_and_the_rest_go_on(
    acc_path: Path,
) -> None:
    class Flat(AheadSteps):
        def feed(self, states: Sequence[Sums]) -> Mapping[str, np.ndarray]:
            return {"x": np.zeros((len(states), W), np.float32)}  # no step axis

    with ic.OfflineInference(acc_recipe(acc_path)) as oi:
        bad = oi.run_sequence("acc", Flat(2), np.ones((4, 1, W), np.float32))
        good = oi.run_sequence("acc", AheadSteps(2), np.ones((5, 1, W), np.float32))
        with pytest.raises(ic.InvalidInput, match=r"input 'x'.*\(1, 4\).*\(1, 2, \.\.\.\)"):
            bad.result(timeout=10)
        np.testing.assert_allclose(good.result(timeout=10)[-1], 5.0)


def test_multi_step_rows_that_a_shapes_policy_would_pad_are_refused(tmp_path: Path) -> None:
    from inferchain.testing.onnx_models import write_accumulator

    path = write_accumulator(tmp_path / "tagged.onnx", width=W, tagged=True)
    shapes = {"strategy": "buckets", "buckets": [[[W], [W], [8]]]}

    class Tagged(AheadSteps):
        def feed(self, states: Sequence[Sums]) -> Mapping[str, np.ndarray]:
            n, k = len(states), self.steps_per_batch
            return {**super().feed(states), "tag": np.zeros((n, k, 5), np.float32)}

    with ic.OfflineInference(acc_recipe(path, shapes=shapes)) as oi:
        ahead = oi.run_sequence("acc", Tagged(2), np.ones((4, 1, W), np.float32))
        with pytest.raises(ic.InvalidInput, match=r"padded to \[\(4,\), \(4,\), \(8,\)\]"):
            ahead.result(timeout=10)


def test_close_ends_every_sequence(acc_path: Path) -> None:
    oi = ic.OfflineInference(acc_recipe(acc_path, max_sequences=1)).init()
    stepper = SumSteps()
    reqs = [oi.run_sequence("acc", stepper, np.ones((50, 1, W), np.float32)) for _ in range(3)]
    oi.close(drain_timeout=0)
    assert all(r.done() for r in reqs)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=14),
    rows=st.sampled_from([1, 2]),
    cancel=st.sets(st.integers(0, 13), max_size=4),
    lanes=st.integers(2, 6),
    ahead=st.sampled_from([1, 1, 3]),
)
def test_every_sequence_ends_once_with_its_own_sums(
    acc_path: Path, lengths: list[int], rows: int, cancel: set[int], lanes: int, ahead: int
) -> None:
    """Any mix of lengths, rows, cancels and steps per batch: each request ends exactly
    once; the ones not cancelled hold their own running sums (no state of another sequence
    leaks in)."""
    rng = np.random.default_rng(len(lengths))
    xs = [rng.standard_normal((n, rows, W)).astype(np.float32) for n in lengths]
    ends: dict[int, int] = {}
    with ic.OfflineInference(acc_recipe(acc_path, max_sequences=max(lanes, rows))) as oi:
        stepper = SumSteps(rows=rows) if ahead == 1 else AheadSteps(ahead, rows=rows)
        reqs = [oi.run_sequence("acc", stepper, x) for x in xs]
        for r in reqs:
            r.add_done_listener(lambda r: ends.__setitem__(r.id, ends.get(r.id, 0) + 1))
        cancelled = {i for i in cancel if i < len(reqs) and reqs[i].cancel()}
        assert oi.wait_all(timeout=20)
        for r in reqs:
            r.wait(10)
    assert all(ends[r.id] == 1 for r in reqs)
    for i, (r, x) in enumerate(zip(reqs, xs, strict=True)):
        if i in cancelled:
            assert r.state is S.CANCELLED
        else:
            np.testing.assert_allclose(r.result(timeout=0), np.cumsum(x, axis=0), rtol=1e-5)
