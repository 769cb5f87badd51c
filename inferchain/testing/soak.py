"""A bounded soak: mixed models, random faults, cancels and timeouts; nothing may be lost.

`python -m inferchain.testing.soak --seconds 600` (what `make soak` runs) or
`run_soak(seconds=3)` from a test. Every submitted request must end exactly once, and the
resident memory must stay flat after the warm-up.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import attrs
import numpy as np

from inferchain.backends.onnxruntime import OnnxRuntimeBackend
from inferchain.config import Recipe
from inferchain.core.request import Request
from inferchain.errors import RequestError
from inferchain.offline import OfflineInference
from inferchain.testing.faults import FaultyBackend
from inferchain.testing.onnx_models import write_mlp64


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@attrs.frozen
class SoakReport:
    submitted: int
    finished: dict[str, int]  # terminal state name -> count
    duplicates: int  # requests whose terminal callback ran more than once
    lost: int  # requests not terminal after close()
    rss_start: int  # bytes, after the warm-up
    rss_end: int
    injected_failures: int

    @property
    def rss_growth(self) -> float:
        return self.rss_end / self.rss_start - 1.0


def _recipe(path: Path) -> Recipe:
    model = {"path": str(path), "warmup": False, "health": {"max_failures": 5}}
    return Recipe.from_dict(
        {
            "name": "soak",
            "session_options": {"intra_op_num_threads": 1},
            "scheduler": {"max_queue_size": 2000},
            "models": [
                {"name": "a", "max_batch_size": 16, **model},
                {"name": "b", "max_batch_size": 4, "instances": 2, **model},
            ],
        }
    )


def run_soak(
    seconds: float, *, fail_p: float = 0.01, seed: int = 0, producers: int = 2
) -> SoakReport:
    """Drive the chain for `seconds` with `producers` threads; returns what happened."""
    with tempfile.TemporaryDirectory() as tmp:
        recipe = _recipe(write_mlp64(Path(tmp) / "m.onnx"))
        backend = FaultyBackend(OnnxRuntimeBackend(recipe), fail_p=fail_p, seed=seed)
        oi = OfflineInference(recipe, backend=backend).init()
        ends: Counter[int] = Counter()
        final: dict[int, str] = {}  # request id -> terminal state name
        lock = threading.Lock()
        submitted: list[int] = []  # ids only: keeping the requests would grow the RSS

        def on_end(r: Request) -> None:
            with lock:
                ends[r.id] += 1
                final[r.id] = r.state.name

        def produce(k: int, until: float) -> None:
            rng = random.Random(seed * 100 + k)
            x = np.ones(64, np.float32)
            while time.monotonic() < until:
                model = rng.choice("ab")
                batch = oi.submit_many(
                    model,
                    [x] * rng.randint(1, 32),
                    priority=rng.randint(-1, 1),
                    timeout=rng.choice([None, None, 0.002, 1.0]),
                    callback=on_end,
                )
                with lock:
                    submitted.extend(r.id for r in batch)
                if rng.random() < 0.1:
                    batch[0].cancel()
                if rng.random() < 0.05:
                    with contextlib.suppress(RequestError):  # an injected fault ends the map
                        sum(1 for _ in oi.map(model, [x] * 64))

        def phase(duration: float) -> None:
            until = time.monotonic() + duration
            threads = [threading.Thread(target=produce, args=(k, until)) for k in range(producers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            oi.wait_all()

        phase(min(1.0, seconds / 4))  # warm-up: allocators and rings reach their size
        with lock:
            submitted.clear()
            final.clear()
        rss_start = rss_bytes()
        phase(seconds)
        rss_end = rss_bytes()
        oi.close()
        states = Counter(final[i] for i in submitted if i in final)
        return SoakReport(
            submitted=len(submitted),
            finished=dict(states),
            duplicates=sum(1 for i in submitted if ends[i] > 1),
            lost=sum(1 for i in submitted if ends[i] == 0),
            rss_start=rss_start,
            rss_end=rss_end,
            injected_failures=backend.counts["failed"],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--fail-p", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    report = run_soak(args.seconds, fail_p=args.fail_p, seed=args.seed)
    print(report)
    print(f"RSS growth after warm-up: {report.rss_growth:+.2%}")
    ok = report.lost == 0 and report.duplicates == 0 and report.rss_growth < 0.05
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
