"""Sequences on the acl backend (through FakeAcl): the carried state stays in device lanes
between steps, gathered and scattered on the device, with the same results as the host pool
of onnxruntime; the fake counts every copy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import recipe, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st

import inferchain as ic
from inferchain import RequestState as S
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_accumulator

W = 16  # floats per row: 64 bytes, as memcpy_async's alignment needs
ROW = W * 4
BATCH = 8


@pytest.fixture(scope="module")
def acc16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_accumulator(tmp_path_factory.mktemp("acc16") / "acc.onnx", width=W)


def acc(path: Path, backend: str = "acl", **model: Any) -> ic.Recipe:
    return recipe(
        {
            "name": "acc",
            "path": str(path),
            "max_batch_size": BATCH,
            "state": {"stateN": "state"},
            "max_sequences": BATCH,
            "warmup": False,
            **model,
        },
        backend=backend,
    )


class SumSteps(ic.Stepper):
    """Each item: f32[steps, W], one row per step; the result: the totals seen."""

    def start(self, item: np.ndarray) -> dict[str, Any]:
        return {"xs": item, "k": 0, "totals": []}

    def feed(self, states: Sequence[dict[str, Any]]) -> Mapping[str, np.ndarray]:
        return {"x": np.stack([s["xs"][s["k"]] for s in states])}

    def take(self, states: Sequence[dict[str, Any]], outputs: Mapping[str, np.ndarray]) -> Any:
        assert "stateN" not in outputs  # it stayed on the device
        for s, total in zip(states, outputs["total"], strict=True):
            s["totals"].append(total.copy())
            s["k"] += 1
        return [s["k"] == len(s["xs"]) for s in states]

    def result(self, state: dict[str, Any]) -> np.ndarray:
        return np.stack(state["totals"])


def items(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(1, 12)), W)).astype(np.float32) for _ in range(n)]


def test_state_stays_on_the_device_between_steps(acc16: Path, no_thread_leak: None) -> None:
    fake = FakeAcl(static_batch=BATCH)
    xs = items(20)  # more sequences than lanes: lanes are taken again
    with ic.OfflineInference(acc(acc16), acl_module=fake) as oi:
        assert oi._model("acc").pool.on_device  # type: ignore[union-attr]
        stepper = SumSteps()
        requests = [oi.run_sequence("acc", stepper, x) for x in xs]
        got = [r.result() for r in requests]
        executions = len(fake.executions)
    for x, totals in zip(xs, got, strict=True):
        np.testing.assert_array_equal(totals, np.cumsum(x, axis=0, dtype=np.float32))
    steps = sum(len(x) for x in xs)
    copies = fake.copies()
    # to the host: each step's `total`, never its state
    assert copies["d2h"] == (executions, steps * ROW)
    # to the device: each step's `x`, and each sequence's initial state once
    assert copies["h2d"][1] == steps * ROW + len(xs) * ROW
    # on the device: every step's state in and out (one copy per run of lanes, not per row)
    assert copies["d2d"][1] == 2 * steps * ROW - len(xs) * ROW
    assert copies["d2d"][0] < 2 * steps
    assert all(v == 0 for v in fake.live_handles().values()), fake.live_handles()
    assert fake.errors == []


class AheadSteps(SumSteps):
    """`k` steps per batch (zeros past a sequence's end); counts the rows it feeds."""

    steps_per_batch = 3

    def __init__(self) -> None:
        self.rows_fed = 0

    def feed(self, states: Sequence[dict[str, Any]]) -> Mapping[str, np.ndarray]:
        k = self.steps_per_batch
        x = np.zeros((len(states), k, W), np.float32)
        for j, s in enumerate(states):
            part = s["xs"][s["k"] : s["k"] + k]
            x[j, : len(part)] = part
        self.rows_fed += len(states) * k
        return {"x": x}

    def take(self, states: Sequence[dict[str, Any]], outputs: Mapping[str, np.ndarray]) -> Any:
        assert set(outputs) == {"total"}  # the state stayed on the device, every step
        k = self.steps_per_batch
        for s, totals in zip(states, outputs["total"], strict=True):
            m = min(k, len(s["xs"]) - s["k"])
            s["totals"] += [t.copy() for t in totals[:m]]
            s["k"] += m
        return [s["k"] == len(s["xs"]) for s in states]


def test_multi_step_batches_keep_the_state_on_the_device(acc16: Path) -> None:
    fake = FakeAcl(static_batch=BATCH)
    xs = items(20, seed=4)
    stepper = AheadSteps()
    with ic.OfflineInference(acc(acc16), acl_module=fake) as oi:
        got = [r.result() for r in [oi.run_sequence("acc", stepper, x) for x in xs]]
        executions = len(fake.executions)
    for x, totals in zip(xs, got, strict=True):
        np.testing.assert_array_equal(totals, np.cumsum(x, axis=0, dtype=np.float32))
    copies = fake.copies()
    assert copies["d2h"] == (executions, stepper.rows_fed * ROW)  # each step's `total` only
    assert copies["h2d"][1] == stepper.rows_fed * ROW + len(xs) * ROW  # `x`, each start once
    assert fake.errors == []


def script(oi: ic.OfflineInference) -> list[dict[str, np.ndarray]]:
    """Sequences stepped from Python: an initial state, rows, a reorder (beam-like)."""
    rng = np.random.default_rng(1)
    out = []
    start = rng.standard_normal(W).astype(np.float32)
    with (
        oi.sequence("acc", state={"state": start}) as one,
        oi.sequence("acc", rows=3) as beams,
    ):
        for k in range(5):
            a = one.step({"x": rng.standard_normal(W).astype(np.float32)})
            order = None if k % 2 == 0 else [2, 0, 0]
            rows = beams.step_rows(
                {"x": rng.standard_normal((3, W)).astype(np.float32)}, reorder=order
            )
            out.append(a.result())
            out += [r.result() for r in rows]
    return out


def test_same_steps_as_the_host_pool_of_onnxruntime(acc16: Path) -> None:
    with ic.OfflineInference(acc(acc16, backend="onnxruntime")) as oi:
        assert not oi._model("acc").pool.on_device  # type: ignore[union-attr]
        expected = script(oi)
    fake = FakeAcl(static_batch=BATCH)
    with ic.OfflineInference(acc(acc16), acl_module=fake) as oi:
        got = script(oi)
    assert len(got) == len(expected) == 20
    for g, e in zip(got, expected, strict=True):
        assert set(g) == {"total"}  # the carried output stays on the device
        np.testing.assert_array_equal(g["total"], e["total"])
    assert fake.errors == []


def test_rows_of_unaligned_size_keep_their_state_on_the_host(acc_path: Path) -> None:
    """The accumulator of width 4 has 16-byte rows, which memcpy_async cannot address: the
    state goes in and out with every step, results unchanged."""
    fake = FakeAcl(static_batch=BATCH)
    with ic.OfflineInference(acc(acc_path), acl_module=fake) as oi:
        assert not oi._model("acc").pool.on_device  # type: ignore[union-attr]
        with oi.sequence("acc") as seq:
            for k in range(1, 4):
                out = seq.step({"x": np.ones(4, np.float32)}).result()
                np.testing.assert_array_equal(out["stateN"], np.full(4, k, np.float32))
    assert fake.copies()["d2d"] == (0, 0)
    assert fake.errors == []


def test_a_reloaded_model_fails_only_the_sequences_whose_state_it_lost(acc16: Path) -> None:
    fake = FakeAcl(static_batch=BATCH)
    one = np.ones(W, np.float32)
    with ic.OfflineInference(acc(acc16, health={"max_failures": 1}), acl_module=fake) as oi:
        old = oi.sequence("acc")
        assert old.step({"x": one}).result()["total"][0] == 1
        unstepped = oi.sequence("acc")  # opened before the re-load, not stepped yet
        failing = oi.sequence("acc")
        fake.inject("mdl.execute_async", 507015, nth=1)  # AICORE_EXCEPTION: re-load
        bad = failing.step({"x": one})
        assert bad.wait(10) and bad.state is S.ERROR
        assert oi.wait_all(10)
        with pytest.raises(ic.StateLost, match="re-loaded"):
            old.step({"x": one})
        new = oi.sequence("acc")  # opened after the re-load
        idle = oi.sequence("acc")  # live, not stepping: the two steps below batch together
        steps = [new.step({"x": one}), unstepped.step({"x": 2 * one})]
        assert [r.result()["total"][0] for r in steps] == [1, 2]
        for k in range(2, 5):  # they go on, and a lost step re-loads nothing
            assert new.step({"x": one}).result()["total"][0] == k
        for s in (old, unstepped, failing, new, idle):
            s.close()
    assert fake.call_count("mdl.load_from_file") == 2  # the first load and one re-load
    assert all(v == 0 for v in fake.live_handles().values()), fake.live_handles()


def test_a_step_formed_before_the_reload_fails_alone_and_counts_no_failure(
    acc16: Path,
) -> None:
    """A stepper's cohort whose batch was on its way when the model was re-loaded: it
    fails with StateLost, the worker does not count it, the other sequences go on."""
    fake = FakeAcl(static_batch=BATCH)
    xs = [np.ones((40, W), np.float32) for _ in range(6)]
    recipe = acc(acc16, health={"max_failures": 1}, max_batch_size=2)
    with ic.OfflineInference(recipe, acl_module=fake) as oi:
        requests = [oi.run_sequence("acc", SumSteps(), x) for x in xs[:2]]
        fake.inject("mdl.execute_async", 507015, nth=5)
        for r in requests:
            assert r.wait(30)
        errors = {type(r.error).__name__ for r in requests if r.state is not S.DONE}
        assert errors == {"BackendError", "StateLost"}, errors
        again = [oi.run_sequence("acc", SumSteps(), x) for x in xs[2:]]
        for r in again:
            np.testing.assert_array_equal(r.result(timeout=30)[-1], np.full(W, 40, np.float32))
    assert fake.call_count("mdl.load_from_file") == 2
    assert all(v == 0 for v in fake.live_handles().values()), fake.live_handles()


def test_a_step_queued_across_the_reload_fails_alone(acc16: Path) -> None:
    """A step that waits in its group while the model is re-loaded has lost its state; a
    new sequence's step joining that group still runs."""
    fake = FakeAcl(static_batch=BATCH)
    one = np.ones(W, np.float32)
    recipe = acc(acc16, health={"max_failures": 1}, max_queue_delay_ms=500)
    with ic.OfflineInference(recipe, acl_module=fake) as oi:
        old = oi.sequence("acc")
        assert old.step({"x": one}).result()["total"][0] == 1
        idle, failing = oi.sequence("acc"), oi.sequence("acc")
        pending = old.step({"x": one})  # waits for the others (or the window)
        fake.inject("mdl.execute_async", 507015, nth=1)
        bad = failing.step({"x": one}, priority=1)  # a Work of its own: fails, re-load
        assert bad.wait(10) and bad.state is S.ERROR
        worker = oi._model("acc").workers[0]
        reloaded = wait_until(lambda: fake.call_count("mdl.load_from_file") == 2 and worker.healthy)
        assert reloaded, "the model was not re-loaded"
        new = oi.sequence("acc")  # opened after the re-load, joins `pending`'s group
        fresh = new.step({"x": one})
        assert fresh.result(timeout=10)["total"][0] == 1
        assert pending.wait(10) and isinstance(pending.error, ic.StateLost)
        for s in (old, idle, failing, new):
            s.close()
    assert fake.call_count("mdl.load_from_file") == 2


def test_steps_with_options_of_one_sequence_stay_in_one_batch(acc16: Path) -> None:
    """Steps given a priority are plain works that the batcher may join and split; a
    sequence's rows must not be split, or a reorder would read a lane already written."""
    fake = FakeAcl(static_batch=2)
    window = 600_000  # ms: no partial batch goes for the window's sake, only full ones
    recipe = acc(acc16, max_batch_size=2, max_sequences=4, streams=1, max_queue_delay_ms=window)

    def rows(*values: float) -> np.ndarray:
        return np.stack([np.full(W, v, np.float32) for v in values])

    with ic.OfflineInference(recipe, acl_module=fake) as oi:
        c, a, b = oi.sequence("acc"), oi.sequence("acc"), oi.sequence("acc", rows=2)
        for r in b.step_rows({"x": rows(1, 10)}):
            r.result()
        held = fake.executes.hold_next()
        busy = c.step({"x": rows(0)[0]}, priority=1)  # keeps the worker busy meanwhile
        assert fake.executes.wait_arrived(held)  # on the device, and stays there
        first = a.step({"x": rows(0)[0]}, priority=1)  # both wait in one group behind it
        swapped = b.step_rows({"x": rows(0, 0)}, reorder=[1, 0], priority=1)
        fake.executes.open(held)
        assert [r.result(timeout=60)["total"][0] for r in swapped] == [10, 1]
        assert busy.result(timeout=60) and first.result(timeout=60)
        for s in (a, b, c):
            s.close()
    assert fake.errors == []


class BeamSums(ic.Stepper):
    """Item (xs f32[steps, rows, W], orders int[steps, rows]): after step t, row j goes on
    from the state row orders[t][j] had (a beam search's reorder); the result: the totals."""

    rows = 0

    def start(self, item: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
        return {"xs": item[0], "orders": item[1], "k": 0, "totals": []}

    def feed(self, states: Sequence[dict[str, Any]]) -> Mapping[str, np.ndarray]:
        return {"x": np.concatenate([s["xs"][s["k"]] for s in states])}

    def take(self, states: Sequence[dict[str, Any]], outputs: Mapping[str, np.ndarray]) -> Any:
        totals = outputs["total"].reshape(len(states), -1, W)
        for s, t in zip(states, totals, strict=True):
            s["totals"].append(t.copy())
            s["k"] += 1
        ended = [s["k"] == len(s["xs"]) for s in states]
        orders = np.stack([s["orders"][min(s["k"], len(s["orders"]) - 1)] for s in states])
        return ended, orders

    def result(self, state: dict[str, Any]) -> np.ndarray:
        return np.stack(state["totals"])


def beam_reference(xs: np.ndarray, orders: np.ndarray) -> np.ndarray:
    state = np.zeros(xs.shape[1:], np.float32)
    totals = []
    for t, x in enumerate(xs):
        if t:
            state = state[orders[t]]
        state = x + state
        totals.append(state)
    return np.stack(totals)


@settings(max_examples=15)
@given(
    rows=st.integers(1, 3),
    shapes=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 2**31)), min_size=1, max_size=9),
)
def test_reorders_across_many_sequences_match_numpy(
    acc16: Path, rows: int, shapes: list[tuple[int, int]]
) -> None:
    fake = FakeAcl(static_batch=BATCH)
    items = []
    for steps, seed in shapes:
        rng = np.random.default_rng(seed)
        xs = rng.standard_normal((steps, rows, W)).astype(np.float32)
        items.append((xs, rng.integers(0, rows, (steps, rows))))
    with ic.OfflineInference(acc(acc16), acl_module=fake) as oi:
        stepper = BeamSums()
        stepper.rows = rows
        requests = [oi.run_sequence("acc", stepper, item) for item in items]
        got = [r.result() for r in requests]
    for (xs, orders), totals in zip(items, got, strict=True):
        np.testing.assert_array_equal(totals, beam_reference(xs, orders))
    assert fake.copies()["d2h"][1] == sum(xs.size * 4 for xs, _ in items)  # totals only
    assert fake.errors == []


def test_steps_with_options_and_sequences_too_wide(acc16: Path) -> None:
    fake = FakeAcl(static_batch=BATCH)
    one = np.ones(W, np.float32)
    with ic.OfflineInference(acc(acc16, max_sequences=16), acl_module=fake) as oi:
        with oi.sequence("acc") as seq:
            for k in range(1, 5):
                options = {"priority": k} if k % 2 else {"timeout": 30.0}
                out = seq.step({"x": one}, **options).result()
                assert set(out) == {"total"} and out["total"][0] == k
        with pytest.raises(ic.InvalidInput, match="does not fit one batch of 8"):
            oi.sequence("acc", rows=BATCH + 1)
    assert fake.errors == []


def test_the_memory_plan_counts_the_state_lanes(acc16: Path) -> None:
    with ic.OfflineInference(acc(acc16, backend="onnxruntime", max_sequences=32)) as oi:
        plan = oi.memory["acc"]
    assert plan.state_bytes == 32 * ROW
    assert plan.static_bytes == plan.model_bytes + plan.buffer_bytes + 32 * ROW


# -- rows on another batch axis (silero-vad's layout) ---------------------------------------

H = 16  # the stateful model's width: a row of its state is 64 bytes


@pytest.fixture(scope="module")
def axis1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inferchain.testing.onnx_models import write_stateful

    return write_stateful(tmp_path_factory.mktemp("axis1") / "stateful.onnx", hidden=H)


def axis1_recipe(path: Path, backend: str) -> ic.Recipe:
    return recipe(
        {
            "name": "s",
            "path": str(path),
            "max_batch_size": 4,
            "inputs": {"state": {"batch_axis": 1}, "gain": {"batched": False}},
            "state": {"stateN": "state"},
            "max_sequences": 4,
            "warmup": False,
        },
        backend=backend,
    )


class GainSteps(ic.Stepper):
    """Each item: f32[steps, H]; the result: every step's `y`."""

    def start(self, item: np.ndarray) -> dict[str, Any]:
        return {"xs": item, "k": 0, "ys": []}

    def feed(self, states: Sequence[dict[str, Any]]) -> Mapping[str, np.ndarray]:
        x = np.stack([s["xs"][s["k"]] for s in states])
        return {"x": x, "gain": np.array(0.5, np.float32)}

    def take(self, states: Sequence[dict[str, Any]], outputs: Mapping[str, np.ndarray]) -> Any:
        for s, y in zip(states, outputs["y"], strict=True):
            s["ys"].append(y.copy())
            s["k"] += 1
        return [s["k"] == len(s["xs"]) for s in states]

    def result(self, state: dict[str, Any]) -> np.ndarray:
        return np.stack(state["ys"])


def test_state_on_batch_axis_1_stays_on_the_device_in_blocks(axis1: Path) -> None:
    """Dims gears (ATC puts a dynamic batch on axis 0 only), each batch padded to its gear on
    axis 1; the state in device lanes as [2, lanes, row], gathered and scattered one copy
    per block and run of lanes; the same outputs as onnxruntime's host pool."""
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((int(rng.integers(1, 7)), H)).astype(np.float32) for _ in range(9)]
    with ic.OfflineInference(axis1_recipe(axis1, "onnxruntime")) as oi:
        want = [r.result() for r in [oi.run_sequence("s", GainSteps(), x) for x in xs]]
    r = axis1_recipe(axis1, "acl")
    fake = FakeAcl.for_recipe(r)
    with ic.OfflineInference(r, acl_module=fake) as oi:
        assert oi._model("s").pool.on_device  # type: ignore[union-attr]
        got = [r.result() for r in [oi.run_sequence("s", GainSteps(), x) for x in xs]]
        executions = list(fake.executions)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    steps = sum(len(x) for x in xs)
    row = H * 4
    copies = fake.copies()
    assert copies["d2h"] == (len(executions), steps * row)  # `y` only, never the state
    # `x` per step, the gain per batch, each sequence's initial state (2 blocks) once
    assert copies["h2d"][1] == steps * row + len(executions) * 4 + len(xs) * 2 * row
    assert copies["d2d"][1] == 2 * (2 * steps - len(xs)) * row  # in and out, both blocks
    assert {e.batch for e in executions} <= {1, 2, 4}  # the gears
    assert fake.errors == []
    assert all(v == 0 for v in fake.live_handles().values()), fake.live_handles()


def test_rows_on_axis_1_are_padded_to_the_gear_and_cut_back(axis1: Path) -> None:
    """Without `state:`, a batch of 3 rows runs the gear of 4 (of 1, 2, 4, 8): each input
    laid out with its rows on its own axis at the gear's rows, the scalar whole, `stateN`
    (rows on axis 1) cut back to the batch's rows; outputs identical to onnxruntime's."""
    rng = np.random.default_rng(5)
    items = [
        {
            "x": rng.standard_normal(H).astype(np.float32),
            "state": rng.standard_normal((2, H)).astype(np.float32),
            "gain": np.array(1.5, np.float32),
        }
        for _ in range(3)
    ]
    model = {
        "name": "s",
        "path": str(axis1),
        "max_batch_size": 8,  # gears 1, 2, 4, 8
        "inputs": {"state": {"batch_axis": 1}, "gain": {"batched": False}},
        "outputs": {"stateN": {"batch_axis": 1}},
        "max_queue_delay_ms": 10000,  # one batch of the three
        "warmup": False,
    }
    with ic.OfflineInference(recipe(model)) as oi:
        want = [r.result() for r in oi.submit_many("s", items)]
    r = recipe(model, backend="acl")
    fake = FakeAcl.for_recipe(r)
    with ic.OfflineInference(r, acl_module=fake) as oi:
        requests = oi.submit_many("s", items)
        oi.flush()
        got = [r.result() for r in requests]
        sizes = oi.stats().models["s"].batch_sizes
    assert sizes == {3: 1}
    assert [e.batch for e in fake.executions] == [4]  # the gear that holds 3
    for a, b in zip(got, want, strict=True):
        assert set(a) == {"y", "stateN"}
        np.testing.assert_array_equal(a["y"], b["y"])
        np.testing.assert_array_equal(a["stateN"], b["stateN"])
    assert fake.errors == []
