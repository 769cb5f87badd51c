"""Every benchmark runs once in quick mode, only to keep it working (no speed assertion).

The core benchmark runs in `make gate` instead, against its loose CI floors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
