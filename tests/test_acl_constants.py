"""Inputs constant over a sequence (recipe `constant:`) on the acl backend through FakeAcl:
each sequence's value crosses to the device once, at its first step, and every later step
gathers it from device lanes, with the results of onnxruntime (which feeds it every step)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.backends.acl_buffers import Slot
from inferchain.backends.acl_constants import plan
from inferchain.backends.acl_gears import DimsGear
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_attending

W = 16  # floats per column: 64 bytes, as memcpy_async's alignment needs
ROW = W * 4
BATCH = 8
LONGEST = 5  # memory lengths 1..5


@pytest.fixture(scope="module")
def att(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_attending(tmp_path_factory.mktemp("att") / "att.onnx", width=W)


def att_recipe(path: Path, backend: str = "acl", **model: Any) -> ic.Recipe:
    return recipe(
        {
            "name": "att",
            "path": str(path),
            "max_batch_size": BATCH,
            "state": {"stateN": "state"},
            "constant": ["memory"],
            "max_sequences": BATCH,
            "warmup": False,
            **model,
        },
        backend=backend,
    )


def compiled(r: ic.Recipe) -> FakeAcl:
    """The model as ATC compiles it with dims gears of every memory length at 4 and 8 rows."""
    widths = range(1, LONGEST + 1)
    return FakeAcl.for_recipe(
        r, shapes={"att": [[[W], [n, W], [W]] for n in widths]}, batches={"att": [4, 8]}
    )


class Unit:
    """One sequence of two rows: its memory, its steps' x (the same for both rows)."""

    def __init__(self, item: tuple[np.ndarray, np.ndarray]) -> None:
        self.memory, self.xs = item
        self.k = 0
        self.totals: list[np.ndarray] = []


class MemorySteps(ic.Stepper):
    """Feeds `memory` at every step, padded with zeros to the batch's longest (as the
    romanizer's beam search does); records each feed's width and the units it started."""

    rows = 2

    def __init__(self) -> None:
        self.feeds: list[tuple[int, int, int]] = []  # (rows, width, units at their first step)

    def start(self, item: tuple[np.ndarray, np.ndarray]) -> Unit:
        return Unit(item)

    def feed(self, states: Sequence[Unit]) -> Mapping[str, np.ndarray]:
        width = max(len(u.memory) for u in states)
        memory = np.zeros((len(states), 2, width, W), np.float32)
        for i, u in enumerate(states):
            memory[i, :, : len(u.memory)] = u.memory
        x = np.repeat(np.stack([u.xs[u.k] for u in states]), 2, axis=0)
        self.feeds.append((2 * len(states), width, sum(u.k == 0 for u in states)))
        return {"x": x, "memory": memory.reshape(-1, width, W)}

    def take(self, states: Sequence[Unit], outputs: Mapping[str, np.ndarray]) -> Any:
        assert "stateN" not in outputs or outputs["stateN"].shape[1:] == (W,)
        for i, u in enumerate(states):
            u.totals.append(outputs["total"][2 * i : 2 * i + 2].copy())
            u.k += 1
        return [u.k == len(u.xs) for u in states]

    def result(self, state: Unit) -> np.ndarray:
        return np.stack(state.totals)


def units(n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        memory = rng.standard_normal((int(rng.integers(1, LONGEST + 1)), W)).astype(np.float32)
        xs = rng.standard_normal((int(rng.integers(1, 9)), W)).astype(np.float32)
        out.append((memory, xs))
    return out


def expected(item: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    memory, xs = item
    totals = np.cumsum(xs + memory.sum(axis=0), axis=0, dtype=np.float32)
    return np.repeat(totals[:, None], 2, axis=1)  # [steps, 2 rows, W]


def run(r: ic.Recipe, items: list[Any], fake: FakeAcl | None = None) -> tuple[list[Any], Any]:
    stepper = MemorySteps()
    kwargs = {"acl_module": fake} if fake is not None else {}
    with ic.OfflineInference(r, **kwargs) as oi:
        reqs = [oi.run_sequence("att", stepper, item) for item in items]
        results = [q.result(timeout=60) for q in reqs]
    return results, stepper


def test_each_sequence_constant_crosses_to_the_device_once(att: Path) -> None:
    """Per step only `x` goes in and `total` comes out; each sequence's memory goes in
    once (its first row, at the width of its first batch), the pad row once per session;
    every other step of every row reads it from the device lanes."""
    r = att_recipe(att)
    fake = compiled(r)
    items = units(24)
    results, stepper = run(r, items, fake)
    for got, item in zip(results, items, strict=True):
        np.testing.assert_allclose(got, expected(item), rtol=1e-5, atol=1e-5)
    steps = sum(rows for rows, _, _ in stepper.feeds)  # rows stepped, over all steps
    uploaded = sum(width * ROW * fresh for _, width, fresh in stepper.feeds)
    fed = sum(rows * width * ROW for rows, width, _ in stepper.feeds)
    copies = fake.copies()
    initial_state = len(items) * 2 * ROW  # each row's zeros, once
    assert copies["h2d"][1] == steps * ROW + initial_state + uploaded + LONGEST * ROW
    assert uploaded < fed / 3  # what feeding it every step would have moved
    assert copies["d2h"][1] == steps * ROW  # `total` only
    assert fake.errors == []
    assert all(n == 0 for n in fake.live_handles().values()), fake.live_handles()


class TwoSteps(MemorySteps):
    """Two steps per batch (`steps_per_batch`): x and memory as [rows, 2, ...]; a unit with
    one step left pads the second with zeros and ends."""

    steps_per_batch = 2

    def feed(self, states: Sequence[Unit]) -> Mapping[str, np.ndarray]:
        width = max(len(u.memory) for u in states)
        memory = np.zeros((len(states), 2, 2, width, W), np.float32)
        x = np.zeros((len(states), 2, 2, W), np.float32)
        for i, u in enumerate(states):
            memory[i, :, :, : len(u.memory)] = u.memory
            for k in range(min(2, len(u.xs) - u.k)):
                x[i, :, k] = u.xs[u.k + k]
        self.feeds.append((2 * len(states), width, sum(u.k == 0 for u in states)))
        return {"x": x.reshape(-1, 2, W), "memory": memory.reshape(-1, 2, width, W)}

    def take(self, states: Sequence[Unit], outputs: Mapping[str, np.ndarray]) -> Any:
        for i, u in enumerate(states):
            for k in range(min(2, len(u.xs) - u.k)):
                u.totals.append(outputs["total"][2 * i : 2 * i + 2, k].copy())
            u.k = min(u.k + 2, len(u.xs))
        return [u.k == len(u.xs) for u in states]


def test_multi_step_batches_read_the_constant_from_the_device_lanes(att: Path) -> None:
    """Two steps per batch: both launches read memory from the lanes; it goes in once."""
    r = att_recipe(att)
    fake = compiled(r)
    items = units(12, seed=4)
    stepper = TwoSteps()
    with ic.OfflineInference(r, acl_module=fake) as oi:
        results = [oi.run_sequence("att", stepper, item).result(timeout=60) for item in items]
    for got, item in zip(results, items, strict=True):
        np.testing.assert_allclose(got, expected(item), rtol=1e-5, atol=1e-5)
    launches = sum(2 * rows for rows, _, _ in stepper.feeds)  # rows of x, two per batch
    uploaded = sum(width * ROW * fresh for _, width, fresh in stepper.feeds)
    initial_state = len(items) * 2 * ROW
    assert fake.copies()["h2d"][1] == launches * ROW + initial_state + uploaded + LONGEST * ROW
    assert fake.errors == []


def test_same_results_as_onnxruntime_which_feeds_it_every_step(att: Path) -> None:
    items = units(16, seed=3)
    on_acl, _ = run(att_recipe(att), items, compiled(att_recipe(att)))
    on_ort, _ = run(att_recipe(att, backend="onnxruntime"), items)
    for a, b in zip(on_acl, on_ort, strict=True):
        np.testing.assert_array_equal(a, b)


def test_without_the_key_the_constant_goes_in_at_every_step(att: Path) -> None:
    """The same run without `constant:`: memory is fed like any input, every step."""
    r = att_recipe(att, constant=[])
    fake = compiled(r)
    items = units(8, seed=5)
    results, stepper = run(r, items, fake)
    for got, item in zip(results, items, strict=True):
        np.testing.assert_allclose(got, expected(item), rtol=1e-5, atol=1e-5)
    steps = sum(rows for rows, _, _ in stepper.feeds)
    fed = sum(rows * width * ROW for rows, width, _ in stepper.feeds)
    assert fake.copies()["h2d"][1] == steps * ROW + len(items) * 2 * ROW + fed


def test_two_instances_each_keep_the_constants_of_their_own_sequences(att: Path) -> None:
    """With two instances each session keeps the state and the constant of its partition
    of the lanes: still once per sequence, the pad row once per session; each sequence's
    steps run on its own instance."""
    r = att_recipe(att, instances=2)
    fake = compiled(r)
    items = units(16, seed=7)
    results, stepper = run(r, items, fake)
    for got, item in zip(results, items, strict=True):
        np.testing.assert_allclose(got, expected(item), rtol=1e-5, atol=1e-5)
    steps = sum(rows for rows, _, _ in stepper.feeds)
    uploaded = sum(width * ROW * fresh for _, width, fresh in stepper.feeds)
    copies = fake.copies()
    initial_state = len(items) * 2 * ROW
    assert copies["h2d"][1] == steps * ROW + initial_state + uploaded + 2 * LONGEST * ROW
    assert copies["d2h"][1] == steps * ROW  # `total` only: the state never comes back
    assert fake.errors == []


def _slot(dims: tuple[int, ...], dtype: Any, name: str) -> Slot:
    return Slot(1 << 20, np.dtype(dtype), dims, name)


def test_the_plan_keeps_aligned_columns_and_says_why_not_the_others() -> None:
    data = [
        _slot((-1, -1, 16), np.float32, "memory"),  # 64-byte columns of a varying width
        _slot((-1, -1), np.bool_, "mask"),  # 1-byte columns
        _slot((-1, 16), np.float32, "flat"),  # a fixed width: one 64-byte row
        _slot((-1, 4, 16), np.float32, "fixed"),  # a fixed width of 4 columns
        _slot((-1, 3), np.float32, "short"),  # a fixed row of 12 bytes
        _slot((-1,), np.float32, "scalar"),  # no dim after the rows
    ]
    shapes = ((8, 3, 16), (8, 3), (8, 16), (8, 4, 16), (8, 3), (8,))
    gears = [DimsGear(shapes, 8), DimsGear(((8, 7, 16), (8, 7), *shapes[2:]), 8)]
    found, why = plan(data, range(6), [0] * 6, gears, 8, {"memory": 0.0})
    assert [(c.name, c.width, c.col_bytes) for c in found] == [
        ("memory", 7, 64),
        ("flat", 16, 4),
        ("fixed", 4, 64),
    ]
    assert len(why) == 3
    assert "'mask'" in why[0] and "a column is 1 bytes, not a multiple of 64" in why[0]
    assert "'short'" in why[1] and "a row is 12 bytes" in why[1]
    assert "'scalar'" in why[2]
    assert not found[0].pad.any() and found[0].pad.shape == (7, 16)
    found, why = plan(data, [0], [1] * 6, gears, 8, {"memory": 0.5})
    assert found == [] and "axis 0" in why[0]
    found, _ = plan(data, [0], [0] * 6, gears, 8, {"memory": 0.5})
    assert (found[0].pad == 0.5).all()


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"constant": ["nope"]}, "'nope' is not an input"),
        ({"constant": ["state"]}, "carried input"),
        ({"state": {}, "constant": ["memory"]}, "need a stateful model"),
    ],
)
def test_the_key_is_checked_against_the_model(
    att: Path, model: dict[str, Any], message: str
) -> None:
    r = att_recipe(att, backend="onnxruntime", **model)
    with pytest.raises(ic.ConfigError, match=message), ic.OfflineInference(r):
        pass


def test_the_key_lists_distinct_names(att: Path) -> None:
    with pytest.raises(ic.ConfigError, match="distinct input names"):
        att_recipe(att, constant=["memory", "memory"])
