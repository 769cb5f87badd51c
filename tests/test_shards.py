"""`inferchain run --format parquet`: shards of exact row counts, tensors as typed arrays that
read back bit-identical to `oi.map`, errors apart, resume after a kill, the missing extra."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_cli import CRASHING, inferchain, one_line_error

import inferchain as ic
from inferchain.errors import ConfigError
from inferchain.results import input_key
from inferchain.shards import ShardedResults, shard_files
from inferchain.testing.onnx_models import write_mlp64

RECIPE = """\
name: tiny
session_options: {intra_op_num_threads: 1}
models:
  - {name: mlp, path: mlp64.onnx, max_batch_size: 4, warmup: false}
inputs: samples/
"""
RECORDS = """\
from inferchain.pipeline import Pipeline

class Labels(Pipeline):
    output_format = "parquet"

    def to_record(self, result):
        y = result["y"]
        return {"label": int(y.argmax()), "score": float(y.max()), "tags": ["a", "b"]}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A one-model recipe (x: f32[64] -> y: f32[10]) and 10 .npy inputs."""
    folder = tmp_path / "tiny"
    (folder / "samples").mkdir(parents=True)
    write_mlp64(folder / "mlp64.onnx")
    (folder / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    rng = np.random.default_rng(0)
    for i in range(10):
        np.save(folder / "samples" / f"{i:02d}.npy", rng.standard_normal(64).astype(np.float32))
    return folder


def inputs(tiny: Path) -> list[Path]:
    return sorted((tiny / "samples").glob("*.npy"))


def test_tensors_are_typed_shards_of_exact_counts_bit_identical_to_map(tiny: Path) -> None:
    out = tiny / "out"
    done = inferchain("run", tiny, "--output", out, "--format", "parquet", "--rows-per-file", 4)
    assert done.returncode == 0, done.stderr
    shards = shard_files(out)
    assert [pq.read_metadata(s).num_rows for s in shards] == [4, 4, 2]
    table = ic.read_results(out)
    y = table.schema.field("y").type
    assert isinstance(y, pa.FixedShapeTensorType) and y.shape == [10]
    assert y.value_type == pa.float32()
    arrays = ic.result_arrays(table)
    assert list(arrays["key"]) == [input_key(p) for p in inputs(tiny)]
    with ic.OfflineInference(tiny) as oi:
        expected = np.stack([o["y"] for o in oi.map("mlp", [np.load(p) for p in inputs(tiny)])])
    assert arrays["y"].dtype == np.float32 and arrays["y"].shape == (10, 10)
    assert arrays["y"].tobytes() == expected.tobytes()  # bit for bit: no text on the way
    assert (out / "errors.jsonl").read_text() == ""


def test_records_scalars_are_columns_errors_in_their_own_file(tiny: Path) -> None:
    """A pipeline's own record: scalar fields typed columns, its default format parquet;
    an item that cannot be read is a line of errors.jsonl, with its key."""
    (tiny / "pipeline.py").write_text(RECORDS, encoding="utf-8")
    text = (tiny / "recipe.yaml").read_text(encoding="utf-8")
    (tiny / "recipe.yaml").write_text(text + "pipeline: pipeline.py:Labels\n")
    (tiny / "samples" / "03b.npy").write_bytes(b"")
    out = tiny / "out"
    done = inferchain("run", tiny, "--output", out)
    assert done.returncode == 1
    table = ic.read_results(out)
    assert table.num_rows == 10
    assert table.schema.field("label").type == pa.int64()
    assert table.schema.field("score").type == pa.float64()
    assert table.schema.field("tags").type == pa.list_(pa.string())
    (error,) = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert error["key"] == input_key(tiny / "samples" / "03b.npy") and "error" in error


def test_a_kill_leaves_whole_shards_and_resume_ends_byte_identical(tiny: Path) -> None:
    """The process dies at its third item with rows 0-1 in a shard and row 2 in memory;
    --resume keeps the shard, redoes the rest and the shards equal an uninterrupted run's."""
    straight = tiny / "straight"
    args = ("--format", "parquet", "--rows-per-file", 2)
    assert inferchain("run", tiny, "--output", straight, *args).returncode == 0
    (tiny / "pipeline.py").write_text(CRASHING, encoding="utf-8")
    text = (tiny / "recipe.yaml").read_text(encoding="utf-8")
    (tiny / "recipe.yaml").write_text(text + "pipeline: pipeline.py:CrashOnThird\n")
    out = tiny / "out"
    assert inferchain("run", tiny, "--output", out, *args).returncode == 9
    assert [s.name for s in shard_files(out)] == ["part-00000.parquet"]
    (out / "part-00001.parquet.tmp").write_bytes(b"PAR1 torn")  # what a kill mid-write leaves
    (tiny / "recipe.yaml").write_text(text)
    done = inferchain("run", tiny, "--output", out, "--resume", *args)
    assert done.returncode == 0, done.stderr
    assert "8 done, 0 failed, 2 skipped as done before" in done.stdout
    assert not list(out.glob("*.tmp"))
    assert [s.read_bytes() for s in shard_files(out)] == [
        s.read_bytes() for s in shard_files(straight)
    ]
    again = inferchain("run", tiny, "--output", out, "--resume", *args)
    assert "0 done, 0 failed, 10 skipped as done before" in again.stdout


def test_an_earlier_runs_shards_are_not_overwritten_unasked(tiny: Path) -> None:
    out = tiny / "out"
    assert inferchain("run", tiny, "--output", out, "--format", "parquet").returncode == 0
    error = one_line_error(inferchain("run", tiny, "--output", out, "--format", "parquet"))
    assert "--resume" in error
    assert "--resume" in one_line_error(inferchain("run", tiny, "--output", out))  # jsonl too
    again = inferchain("run", tiny, "--output", out, "--format", "parquet", "--overwrite")
    assert again.returncode == 0 and ic.read_results(out).num_rows == 10


def test_without_pyarrow_parquet_is_one_error_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` fail
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigError, match=r"pyarrow: pip install 'inferchain\[parquet\]'"):
        ShardedResults(tmp_path, "new").check()
