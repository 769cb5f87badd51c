"""Parquet results keep memory flat: the peak RSS of writing N and 10 N results as shards.

Each size runs in a fresh process: its items stream through the tiny MLP with `oi.map`, each
result becomes a row the way `inferchain run --format parquet` makes it (key, file, the
output `y` and a 512-float embedding) and goes through `ShardedResults` (4096 rows a shard).
The ratio of the two peaks (10 N over N) is the figure: about 1 when memory does not grow
with the job's size.

Run: `python benchmarks/bench_shards.py [--quick]` (N = 20 000; --quick: 2 000); writes
benchmarks/results/bench_shards.json (a quick run: out/benchmarks/).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile

from common import write_results

CHILD = """
import sys, tempfile
from pathlib import Path
import numpy as np
import inferchain as ic
from inferchain.config import Recipe
from inferchain.shards import ShardedResults
from inferchain.testing.onnx_models import write_mlp64

n, folder = int(sys.argv[1]), Path(sys.argv[2])
model = write_mlp64(folder / "mlp64.onnx")
recipe = Recipe.from_dict({"name": "b", "session_options": {"intra_op_num_threads": 1},
    "models": [{"name": "mlp", "path": str(model), "max_batch_size": 64, "warmup": False}]})
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 64)).astype(np.float32)
embedding = rng.standard_normal(512).astype(np.float32)
items = (x[i % 256] for i in range(n))
with ic.OfflineInference(recipe) as oi, ShardedResults(folder / "out", "new") as sink:
    for i, out in enumerate(oi.map("mlp", items)):
        sink.write({"key": f"/in/{i}.npy", "file": f"{i}.npy", "y": out["y"],
                    "embedding": embedding + i})
import pyarrow.parquet as pq
from inferchain.shards import shard_files
assert sum(pq.read_metadata(s).num_rows for s in shard_files(folder / "out")) == n
"""


def peak_rss_mib(n: int) -> float:
    """The peak RSS (MiB) of a fresh process writing `n` results."""
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        subprocess.run([sys.executable, "-c", CHILD, str(n), tmp], check=True)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        assert peak >= before  # the largest child so far: run the smaller size first
        return peak / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    n = 2_000 if quick else 20_000
    small = peak_rss_mib(n)
    large = peak_rss_mib(10 * n)
    shards = (10 * n + 4095) // 4096
    print(f"{n:>7} results: peak RSS {small:7.1f} MiB")
    print(f"{10 * n:>7} results: peak RSS {large:7.1f} MiB ({shards} shards)")
    print(f"ratio 10N / N: {large / small:.3f}")
    payload = {"quick": quick, "n": n, "peak_rss_mib": {"n": small, "10n": large}}
    path = write_results("bench_shards", {**payload, "ratio": large / small, "target": "~1"})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
