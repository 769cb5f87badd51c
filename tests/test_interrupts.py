"""Interrupts never hang and lose nothing finished: real SIGINTs at randomised moments, to
`inferchain run` (jsonl and Parquet) and to `oi.run()` in its own process. Every run ends
within a bound (exit 130 for the command line), every result written or yielded before the
signal is whole and correct, and a resume then equals a run straight through, byte for
byte. The last item of every interrupted run waits for ever, so the signal always lands
while the run is still going (at any point of it: a random count of finished items, then a
random fraction of a millisecond range)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import inferchain as ic
from inferchain.testing.onnx_models import write_mlp64

ITEMS = 40
BOUND_S = 60  # an interrupted run must end within this (it takes well under a second)
PIPELINE = """\
import os
import threading

import numpy as np

from inferchain.pipeline import Pipeline


class HoldsLast(Pipeline):
    hold = threading.Event()  # set: nothing holds (a run straight through, a resume)
    if not os.environ.get("HOLD_LAST"):
        hold.set()

    def process(self, item):
        if item[0] == LAST_ITEM:
            self.hold.wait()  # the run cannot end before the signal
        out = yield self.submit("mlp", np.tanh(item) * 2)
        return out
"""
RECIPE = """\
name: held
session_options: {intra_op_num_threads: 1}
host_workers: 2
scheduler: {drain_timeout_s: 5}
models:
  - {name: mlp, path: mlp64.onnx, max_batch_size: 8, warmup: false}
inputs: samples/
pipeline: pipeline.py:HoldsLast
"""


@pytest.fixture
def held(tmp_path: Path) -> Path:
    """A recipe over ITEMS .npy items whose last one waits for ever under HOLD_LAST=1."""
    folder = tmp_path / "held"
    (folder / "samples").mkdir(parents=True)
    write_mlp64(folder / "mlp64.onnx")
    (folder / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    (folder / "pipeline.py").write_text(PIPELINE.replace("LAST_ITEM", str(ITEMS - 1)))
    for i in range(ITEMS):
        np.save(folder / "samples" / f"{i:03d}.npy", np.full(64, i, np.float32))
    return folder


def command(recipe: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "inferchain.cli",
        "run",
        str(recipe),
        "--output",
        str(out),
        *extra,
    ]


def interrupted(recipe: Path, out: Path, rng: random.Random, *extra: str) -> int:
    """`run --resume` SIGINTed after a random number of its item lines and a random
    moment more; its exit status, and how many item lines it had printed then."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HOLD_LAST": "1"}
    lines = rng.randint(1, ITEMS - 1)
    with subprocess.Popen(
        command(recipe, out, "--resume", *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as child:
        assert child.stdout is not None
        seen = 0
        for seen, _ in enumerate(child.stdout, 1):
            if seen >= lines:
                break
        threading.Event().wait(rng.uniform(0.0, 0.02))  # a random moment, not an order
        child.send_signal(signal.SIGINT)
        try:
            status = child.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            child.kill()
            raise AssertionError(f"`inferchain run` hung after SIGINT ({seen} lines)") from None
    assert status == 130, f"exit {status} after SIGINT at line {seen}"
    return seen


def jsonl(out: Path) -> list[bytes]:
    return (out / "results.jsonl").read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("form", ["jsonl", "parquet"])
def test_sigint_to_the_command_line_at_random_moments(held: Path, form: str) -> None:
    extra = ("--format", "parquet", "--rows-per-file", "7") if form == "parquet" else ()
    if extra:
        pytest.importorskip("pyarrow")
    straight = held / "straight"
    done = subprocess.run(command(held, straight, *extra), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    shards = sorted(straight.glob("part-*.parquet"))
    rng = random.Random(7 if extra else 3)
    for round_ in range(5):
        out = held / f"out{round_}"
        seen = interrupted(held, out, rng, *extra)
        if extra:  # whole shards in input order, every printed result among them
            rows = ic.read_results(out).column("key").to_pylist()
            assert rows == ic.read_results(straight).column("key").to_pylist()[: len(rows)]
            assert len(rows) >= seen
        else:
            kept = jsonl(out)
            assert kept == jsonl(straight)[: len(kept)] and len(kept) >= seen
        again = subprocess.run(command(held, out, "--resume", *extra), capture_output=True)
        assert again.returncode == 0, again.stderr
        if extra:
            got = sorted(out.glob("part-*.parquet"))
            assert [p.read_bytes() for p in got] == [p.read_bytes() for p in shards]
        else:
            assert jsonl(out) == jsonl(straight)


CHILD = """\
import faulthandler, os, random, signal, sys, threading, time
import numpy as np
import inferchain as ic

recipe, rounds, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
items = [np.full(64, i % 37, np.float32) for i in range(3000)]
items[-1] = np.full(64, LAST_ITEM, np.float32)  # the one that holds
with ic.OfflineInference(ic.load_recipe(recipe)) as oi:
    hold = type(oi.pipeline).hold
    hold.set()
    expected = [r["y"] for r in oi.run(items)]
    slowest = 0.0
    for n in range(rounds):
        faulthandler.dump_traceback_later(BOUND, exit=True)  # a hang fails, never stalls
        hold.clear()
        sent = []

        def interrupt():
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        timer = threading.Timer(rng.uniform(0.0, 0.3), interrupt)
        got = []
        timer.start()
        try:
            for r in oi.run(items):
                got.append(r["y"])
            raise SystemExit(f"round {n}: the run ended without its interrupt")
        except KeyboardInterrupt:
            slowest = max(slowest, time.monotonic() - sent[0])
        timer.join()
        hold.set()
        assert all(np.array_equal(g, e) for g, e in zip(got, expected)), f"round {n}: wrong"
        faulthandler.cancel_dump_traceback_later()
    again = [r["y"] for r in oi.run(items)]
    assert all(np.array_equal(g, e) for g, e in zip(again, expected, strict=True))
print(f"ok {rounds} rounds, slowest {slowest:.3f} s")
"""


def test_sigint_to_oi_run_at_random_moments(held: Path, tmp_path: Path) -> None:
    """`oi.run()` in its own process, 30 rounds each SIGINTed at a random moment: each
    ends (KeyboardInterrupt) within the bound, what it yielded is right, and the same
    OfflineInference then runs the whole input again."""
    script = tmp_path / "child.py"
    script.write_text(CHILD.replace("LAST_ITEM", str(ITEMS - 1)).replace("BOUND", str(BOUND_S)))
    done = subprocess.run(
        [sys.executable, str(script), str(held), "30", "11"],
        capture_output=True,
        text=True,
        timeout=BOUND_S * 10,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.startswith("ok 30 rounds"), done.stdout
