"""Every benchmark runs once in quick mode, only to keep it working (no speed assertion).

The core benchmark runs in `make gate` instead, against its loose CI floors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
QUICK = [
    "bench_memory",
    "bench_startup",
    "bench_ocr",
    "bench_orientation",
    "bench_padding",
    "bench_acl_streams",
    "bench_acl_pipeline",
    "bench_handover",
    "bench_shards",
    "bench_vad",
    "bench_romanize",
]


@pytest.mark.parametrize("name", QUICK)
def test_benchmark_runs_in_quick_mode(name: str, tmp_path: Path) -> None:
    env = {**os.environ, "INFERCHAIN_BENCH_RESULTS": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick"],
        cwd=BENCHMARKS,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / f"{name}.json").read_text())
    assert result["benchmark"] == name


def _counting() -> Any:
    """The CI gate's counter (`benchmarks/counting.py`), imported as the gate imports it."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import counting
    finally:
        sys.path.remove(str(BENCHMARKS))
    return counting


def test_the_gate_counts_framework_calls_on_every_thread_it_saw_start() -> None:
    """The counter counts the Python calls of inferchain's code and the C calls made from
    it, on the calling thread and on threads started while it is installed, and nothing
    of the caller's own code."""
    import threading

    from inferchain.in_flight import Window

    counting = _counting()

    def work() -> None:
        window = Window(4)
        for _ in range(10):
            window.fits(1)  # one Python call of inferchain's each (no C call inside)
        len([])  # the caller's own C call: not counted

    with counting.CallCounter() as counter:
        worker = threading.Thread(target=lambda: (started.wait(), work()))
        started = threading.Event()
        worker.start()

        def both() -> None:
            work()
            started.set()
            worker.join()

        calls = counter.count(1, both)
    # Window() is a call of __init__ (max is its one C call); ten `fits` calls each side
    assert calls.python == 2 * 11
    assert calls.c == 2 * 1


def test_the_gate_counts_objects_kept_per_unit() -> None:
    counting = _counting()
    kept = counting.objects_kept(1000, lambda: [[] for _ in range(2000)])
    assert kept == pytest.approx(2.0, abs=0.01)  # a few of the process's own may come and go
