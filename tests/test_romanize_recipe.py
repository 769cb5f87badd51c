"""The romanize recipe's beam-search steps against arabic-name-romanizer's own model path."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import inferchain as ic

pytest.importorskip("arabic_name_romanizer")

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "romanize"


def recipe_module(name: str) -> ModuleType:
    return ic.import_recipe_module(RECIPE, name)


beam = recipe_module("beam")
ideal = recipe_module("ideal")


@pytest.fixture(scope="module")
def units() -> list[str]:
    return list(ideal.sample_units(300, seed=1))


@pytest.fixture(scope="module")
def spec() -> Any:
    return beam.BeamSpec.from_dir()


@pytest.fixture(scope="module")
def sessions() -> tuple[Any, Any]:
    return ideal.open_sessions(threads=1)


@pytest.fixture(scope="module")
def expected(units: list[str]) -> list[Any]:
    return list(ideal.package_hypotheses(ideal.package_model(threads=1), units))


def test_units_are_distinct_arabic_names_from_the_package_index(units: list[str]) -> None:
    assert len(set(units)) == len(units) == 300
    assert all(any("\u0621" <= ch <= "\u064a" for ch in u) for u in units)


@pytest.mark.parametrize("slots", [16, 128])
def test_continuous_loop_gives_the_package_hypotheses(
    units: list[str], spec: Any, sessions: tuple[Any, Any], expected: list[Any], slots: int
) -> None:
    """Texts and scores bit for bit, with names joining and leaving between steps."""
    ours = ideal.continuous_hypotheses(*sessions, spec, units, slots=slots)
    assert len(ours) == len(expected)
    assert all(len(h) >= 1 for h in expected)
    mismatches = [(u, a, b) for u, a, b in zip(units, ours, expected, strict=True) if a != b]
    assert mismatches == []


def test_a_generator_per_name_gives_the_package_hypotheses(
    units: list[str], spec: Any, sessions: tuple[Any, Any], expected: list[Any]
) -> None:
    encoder, decoder = sessions
    encoded = list(ideal.encoded_names(encoder, spec, units))
    k = spec.beam_width
    for i in range(0, len(units), 10):  # every tenth name, one decoder call per step
        steps = beam.beam_steps(spec)
        memory = np.repeat(encoded[i].memory[None], k, axis=0)  # constant per name
        src_mask = np.repeat(encoded[i].src_mask[None], k, axis=0)
        hidden = np.repeat(encoded[i].hidden[None], k, axis=0)  # carried state
        step = next(steps)
        while True:
            if step.reorder is not None:
                hidden = hidden[step.reorder]
            feed = {"prefix": step.prefix, "memory": memory, "src_mask": src_mask}
            logprobs, hidden = decoder.run(None, feed | {"hidden": hidden})
            try:
                step = steps.send(logprobs)
            except StopIteration as done:
                assert done.value == expected[i], units[i]
                break


def test_the_package_result_depends_on_the_padding_of_its_batch(units: list[str]) -> None:
    """Why the loop encodes in the package's batches: alone, a name is padded less and the
    GRU encoder (which runs over the padding) gives other scores and some other texts; a
    name as long as the batch's longest is padded the same and differs in rounding only."""
    names = units[:40]
    batched = ideal.package_hypotheses(ideal.package_model(threads=1), names)
    alone = ideal.package_hypotheses(ideal.package_model(batch_size=1, threads=1), names)
    widths = [len(beam.BeamSpec.from_dir().source_ids(u)) for u in names]
    longest = [i for i, w in enumerate(widths) if w == max(widths)]
    padded = [i for i, w in enumerate(widths) if w < max(widths)]
    for i in longest:
        assert [t for t, _ in batched[i]] == [t for t, _ in alone[i]]
        assert batched[i][0][1] == pytest.approx(alone[i][0][1], abs=1e-5)
    assert sum(batched[i][0][0] != alone[i][0][0] for i in padded) >= 2
    assert all(batched[i] != alone[i] for i in padded)


@pytest.fixture(scope="module")
def romanize() -> Iterator[ic.OfflineInference]:
    with ic.OfflineInference(ic.load_recipe(RECIPE)) as oi:
        yield oi


def test_the_recipe_gives_the_package_hypotheses(
    romanize: ic.OfflineInference, units: list[str], expected: list[Any]
) -> None:
    """`oi.run(units)` through the framework: an encoder batch of 256 and one of 44, then
    the decoder steps of every live unit batched together, names joining and leaving."""
    ours = list(romanize.run(units))
    mismatches = [(u, a, b) for u, a, b in zip(units, ours, expected, strict=True) if a != b]
    assert mismatches == []
    stats = romanize.stats().models
    assert stats["encoder"].batch_sizes == {256: 1, 44: 1}  # the package's batches
    steps = stats["decoder"].sequences
    assert steps is not None and steps.rows_per_step > 2  # steps of many units at once
    again = list(romanize.run(units[:5]))  # a run of 5 is one batch of 5: the package's too
    assert again == ideal.package_hypotheses(ideal.package_model(threads=1), units[:5])


def test_the_recipe_as_a_generator_per_unit_gives_the_package_hypotheses(
    units: list[str], expected: list[Any]
) -> None:
    with ic.OfflineInference(ic.load_recipe(RECIPE)) as oi:
        oi._pipeline = recipe_module("pipeline").StepwisePipeline(oi)
        ours = list(oi.run(units))
    assert ours == expected


def test_the_recipe_runs_from_the_command_line_one_unit_per_line(
    units: list[str], expected: list[Any], tmp_path: Path
) -> None:
    names = tmp_path / "names.txt"
    names.write_text("\n".join(units[:3]) + "\n\n", encoding="utf-8")  # a blank line: skipped
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "inferchain.cli", "run", str(RECIPE), "--input", str(names)]
    done = subprocess.run([*cmd, "--output", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    want = ideal.package_hypotheses(ideal.package_model(threads=1), units[:3])
    assert [r["line"] for r in records] == [1, 2, 3]
    assert [r["text"] for r in records] == units[:3]
    assert [[(h["text"], h["score"]) for h in r["hypotheses"]] for r in records] == want


def compiled_for(recipe: ic.Recipe, widths: range) -> Any:
    """FakeAcl compiled for the recipe as ATC would: a dims gear per source width (the
    encoder at its batch of 256, the decoder at four batch gears)."""
    from inferchain.testing.fake_acl import FakeAcl

    return FakeAcl.for_recipe(
        recipe,
        shapes={
            "encoder": [[[w], [w]] for w in widths],
            "decoder": [[[1], [w, 256], [w], [2, 256]] for w in widths],
        },
        batches={"encoder": [256], "decoder": [64, 128, 256, 512]},
    )


def test_the_recipe_on_acl_gives_the_package_hypotheses(
    units: list[str], spec: Any, expected: list[Any]
) -> None:
    """Both models on `backend: acl` through FakeAcl, their variable source length as dims
    gears (ATC's `--dynamic_dims`: one per width up to the longest unit here, the encoder at
    its batch of 256, the decoder at four batch gears): each batch runs the gear of its
    width and the fewest rows that hold it; the package's hypotheses, bit for bit."""

    widths = range(1, max(len(spec.source_ids(u)) for u in units) + 1)
    recipe = ic.load_recipe(RECIPE, backend="acl")
    fake = compiled_for(recipe, widths)
    with ic.OfflineInference(recipe, acl_module=fake) as oi:
        ours = list(oi.run(units))
        sizes = oi.stats().models["encoder"].batch_sizes
    mismatches = [(u, a, b) for u, a, b in zip(units, ours, expected, strict=True) if a != b]
    assert mismatches == []
    assert sizes == {256: 1, 44: 1}  # the package's batches; the 44 padded to the gear
    assert {e.batch for e in fake.executions} <= {64, 128, 256, 512}
    assert fake.errors == []
    assert all(n == 0 for n in fake.live_handles().values()), fake.live_handles()


@pytest.mark.parametrize("instances", [1, 2])
def test_on_acl_each_unit_memory_crosses_to_the_device_once(
    units: list[str], spec: Any, expected: list[Any], instances: int
) -> None:
    """The decoder on acl (one instance, or two as shipped: each its own units) keeps its
    state and its `constant:` input `memory` in device lanes: per step batch only the last
    tokens and the (unaligned, so host-fed) `src_mask` go in; per unit its initial `hidden`
    and its `memory` once, at the width of its first step batch. The exact host-to-device
    bytes, from what the stepper fed; the package's hypotheses, bit for bit."""

    pipeline = recipe_module("pipeline")

    class Recording(pipeline.BeamSteps):  # type: ignore[misc, name-defined]
        def __init__(self, spec: Any) -> None:
            super().__init__(spec)
            self.feeds: list[tuple[int, int, int]] = []  # rows, width, units starting

        def feed(self, states: Any) -> Any:
            fed = super().feed(states)
            fresh = sum(u.t == 0 for u in states)
            self.feeds.append((len(fed["prefix"]), fed["memory"].shape[1], fresh))
            return fed

    sources = [spec.source_ids(u) for u in units]
    widths = range(1, max(len(s) for s in sources) + 1)
    recipe = ic.load_recipe(RECIPE, backend="acl", models={"decoder": {"instances": instances}})
    fake = compiled_for(recipe, widths)
    with ic.OfflineInference(recipe, acl_module=fake) as oi:
        steps = oi._pipeline.steps = Recording(spec)
        ours = list(oi.run(units))
    mismatches = [(u, a, b) for u, a, b in zip(units, ours, expected, strict=True) if a != b]
    assert mismatches == []
    assert fake.errors == []
    assert sum(fresh for _, _, fresh in steps.feeds) == len(units)
    encoder = sum(  # src (int64) and src_mask (bool) of each encoder batch
        len(chunk) * max(len(s) for s in chunk) * 9
        for chunk in (sources[i : i + 256] for i in range(0, len(sources), 256))
    )
    decoder = sum(rows * (8 + width) for rows, width, _ in steps.feeds)  # prefix, src_mask
    hidden = len(units) * 2 * 2 * 256 * 4  # each beam's initial state
    memory = sum(width * 256 * 4 * fresh for _, width, fresh in steps.feeds)
    pad = instances * max(widths) * 256 * 4  # the pad row, once per session
    assert fake.copies()["h2d"][1] == encoder + decoder + hidden + memory + pad
    fed_every_step = sum(rows * width * 256 * 4 for rows, width, _ in steps.feeds)
    assert memory * 10 < fed_every_step
