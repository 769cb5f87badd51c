"""`inferchain run`'s results as a careless or hostile user meets them, each case a real
process: one writer per output folder, resumes keyed by the resolved input path from any
working directory, names that are not UTF-8, merged tails, records in input order after a
resume, duplicate inputs, and a folder of the other format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cli import inferchain, one_line_error, records, tiny  # noqa: F401 (a fixture)

import inferchain as ic

CLI = (sys.executable, "-m", "inferchain.cli")
GATED = """\
from pathlib import Path
from inferchain.pipeline import Pipeline

class Gated(Pipeline):
    def load(self, path):
        if path.name == "0.npy":  # says it runs, then waits until the test lets it go
            Path(__file__).with_name("ready").open("w").close()
            Path(__file__).with_name("gate").open().read()
        return super().load(path)
"""


def use_pipeline(folder: Path, source: str, name: str) -> None:
    (folder / "pipeline.py").write_text(source, encoding="utf-8")
    recipe = (folder / "recipe.yaml").read_text(encoding="utf-8")
    (folder / "recipe.yaml").write_text(recipe + f"pipeline: pipeline.py:{name}\n")


def test_a_second_run_on_a_folder_in_use_is_refused_at_once_naming_the_holder(
    tiny: Path,  # noqa: F811
) -> None:
    """The first run holds the folder's lock while its first item waits on a FIFO; a
    second run there fails with one line naming the folder and the first one's pid; the
    first ends with all its results. A SIGKILLed holder leaves no stale lock."""
    use_pipeline(tiny, GATED, "Gated")
    os.mkfifo(tiny / "ready")
    os.mkfifo(tiny / "gate")
    out = tiny / "out"
    cmd = [*CLI, "run", str(tiny), "--output", str(out)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as first:
        (tiny / "ready").open().read()  # returns once the first run is at its first item
        second = inferchain("run", tiny, "--output", out, "--overwrite")
        with (tiny / "gate").open("w") as gate:
            gate.write("go")
        _, stderr = first.communicate(timeout=300)
    error = one_line_error(second)
    assert f"{out} is in use by another inferchain run (pid {first.pid})" in error
    assert first.returncode == 0, stderr
    assert len(records(out)) == 4

    with subprocess.Popen([*cmd, "--overwrite"], stdout=subprocess.DEVNULL) as killed:
        (tiny / "ready").open().read()
        killed.kill()
        killed.wait(timeout=300)
    (tiny / "pipeline.py").write_text(GATED.replace('"0.npy"', '"none"'), encoding="utf-8")
    after = inferchain("run", tiny, "--output", out, "--resume")
    assert after.returncode == 0, after.stderr
    assert [Path(str(r["file"])).name for r in records(out)] == [f"{i}.npy" for i in range(4)]


def test_a_resume_from_another_working_directory_skips_what_is_done(
    tiny: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The first run is given a relative --input from the recipe's folder; the resume, from
    elsewhere, another relative path to the same files: nothing runs twice."""
    out = tmp_path / "out"
    env = dict(os.environ)
    first = subprocess.run(
        [*CLI, "run", ".", "--input", "samples", "--output", str(out), "--limit", "2"],
        cwd=tiny,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert first.returncode == 0, first.stderr
    relative = os.path.relpath(tiny / "samples", tmp_path)
    again = subprocess.run(
        [*CLI, "run", str(tiny), "--input", relative, "--output", str(out), "--resume"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert again.returncode == 0, again.stderr
    assert "2 done, 0 failed, 2 skipped as done before;" in again.stdout
    keys = [r["key"] for r in records(out)]
    assert keys == [str((tiny / "samples" / f"{i}.npy").resolve()) for i in range(4)]


def test_a_name_that_is_not_utf8_is_kept_losslessly_or_is_its_items_error(
    tiny: Path,  # noqa: F811
) -> None:
    """jsonl: the name's bytes come back through `os.fsencode` and the file is UTF-8;
    a resume recognises it. Parquet: that item is an error line, the others are rows."""
    raw = b"\xff\xfe-odd.npy"
    np.save(os.fsdecode(os.path.join(os.fsencode(tiny / "samples"), raw)), np.ones(64, "f4"))
    out = tiny / "out"
    done = inferchain("run", tiny, "--output", out)
    assert done.returncode == 0, done.stderr
    (out / "results.jsonl").read_bytes().decode("utf-8")  # strict: valid UTF-8
    odd = [r for r in records(out) if "-odd" in str(r["file"])]
    assert len(odd) == 1 and os.fsencode(Path(str(odd[0]["file"])).name) == raw and "y" in odd[0]
    again = inferchain("run", tiny, "--output", out, "--resume")
    assert "0 done, 0 failed, 5 skipped as done before" in again.stdout, again.stderr

    pytest.importorskip("pyarrow")
    shards = tiny / "shards"
    done = inferchain("run", tiny, "--output", shards, "--format", "parquet")
    assert done.returncode == 1, done.stderr
    (error,) = [json.loads(line) for line in (shards / "errors.jsonl").read_text().splitlines()]
    assert os.fsencode(Path(error["file"]).name) == raw
    assert error["error"].startswith("InvalidInput: key") and "not UTF-8" in error["error"]
    assert ic.read_results(shards).num_rows == 4


def test_a_last_line_without_its_newline_is_run_again_not_merged(
    tiny: Path,  # noqa: F811
) -> None:
    out, straight = tiny / "out", tiny / "straight"
    assert inferchain("run", tiny, "--output", straight).returncode == 0
    assert inferchain("run", tiny, "--output", out, "--limit", 2).returncode == 0
    lines = out / "results.jsonl"
    lines.write_bytes(lines.read_bytes().rstrip(b"\n"))  # whole, but its newline is lost
    done = inferchain("run", tiny, "--output", out, "--resume")
    assert done.returncode == 0, done.stderr
    assert "3 done, 0 failed, 1 skipped as done before" in done.stdout
    assert lines.read_bytes() == (straight / "results.jsonl").read_bytes()
    assert ic.read_results(out).num_rows == 4


def test_an_input_that_always_fails_keeps_its_place_after_a_resume(
    tiny: Path,  # noqa: F811
) -> None:
    """Its error line stays first, where a run straight through writes it: the resumed
    file is byte for byte the straight one."""
    (tiny / "samples" / "0.npy").write_bytes(b"")  # the first input can never be read
    out, straight = tiny / "out", tiny / "straight"
    assert inferchain("run", tiny, "--output", straight).returncode == 1
    assert inferchain("run", tiny, "--output", out, "--limit", 3).returncode == 1
    for _ in range(2):
        done = inferchain("run", tiny, "--output", out, "--resume")
        assert done.returncode == 1, done.stderr
        assert (out / "results.jsonl").read_bytes() == (straight / "results.jsonl").read_bytes()
    assert "error" in records(out)[0]


def test_duplicate_inputs_have_a_record_each_after_any_resume(
    tiny: Path,  # noqa: F811
) -> None:
    """The same file twice and a link to it: one record per input position, in a run
    straight through and after resumes, the same bytes."""
    samples = tiny / "samples"
    (samples / "link.npy").symlink_to(samples / "1.npy")
    inputs = [samples / "1.npy", samples, samples / "1.npy", samples / "link.npy"]
    given = [a for p in inputs for a in ("--input", p)]
    out, straight = tiny / "out", tiny / "straight"
    assert inferchain("run", tiny, *given, "--output", straight).returncode == 0
    expected = (straight / "results.jsonl").read_bytes()
    assert len(records(straight)) == 8  # 1, the folder's 0 1 2 3 link, 1, link
    assert inferchain("run", tiny, *given, "--output", out, "--limit", 3).returncode == 0
    done = inferchain("run", tiny, *given, "--output", out, "--resume", "--limit", 2)
    assert done.returncode == 0 and "2 done, 0 failed, 3 skipped" in done.stdout, done.stderr
    done = inferchain("run", tiny, *given, "--output", out, "--resume")
    assert done.returncode == 0 and "3 done, 0 failed, 5 skipped" in done.stdout, done.stderr
    assert (out / "results.jsonl").read_bytes() == expected


def test_a_resume_in_the_other_format_is_refused_in_one_line(
    tiny: Path,  # noqa: F811
) -> None:
    pytest.importorskip("pyarrow")
    lines, shards = tiny / "lines", tiny / "shards"
    assert inferchain("run", tiny, "--output", lines).returncode == 0
    before = (lines / "results.jsonl").read_bytes()
    error = one_line_error(
        inferchain("run", tiny, "--output", lines, "--resume", "--format", "parquet")
    )
    assert "holds jsonl results" in error and "--format jsonl" in error
    assert not list(lines.glob("part-*")) and (lines / "results.jsonl").read_bytes() == before
    assert inferchain("run", tiny, "--output", shards, "--format", "parquet").returncode == 0
    error = one_line_error(inferchain("run", tiny, "--output", shards, "--resume"))
    assert "holds Parquet results" in error and "--format parquet" in error
    assert not (shards / "results.jsonl").exists()
    again = inferchain("run", tiny, "--output", shards, "--overwrite")  # one kind stays
    assert again.returncode == 0 and not list(shards.glob("part-*")), again.stderr


def test_parquet_shards_stay_cut_at_multiples_of_rows_per_file_over_the_job(
    tiny: Path,  # noqa: F811
) -> None:
    """A run that stops early writes its rows in hand as a short last shard (an interrupt
    does the same, tests/test_interrupts.py); the resume takes it back: the shards are
    those of a run straight through, byte for byte."""
    pytest.importorskip("pyarrow")
    for i in range(4, 11):
        np.save(tiny / "samples" / f"{i}.npy", np.full(64, i, np.float32))
    form = ("--format", "parquet", "--rows-per-file", "4")
    out, straight = tiny / "out", tiny / "straight"
    assert inferchain("run", tiny, "--output", straight, *form).returncode == 0
    assert inferchain("run", tiny, "--output", out, *form, "--limit", 6).returncode == 0
    pq = pytest.importorskip("pyarrow.parquet")
    assert [pq.read_metadata(p).num_rows for p in sorted(out.glob("part-*"))] == [4, 2]
    for limit in ("3", "9"):
        done = inferchain("run", tiny, "--output", out, *form, "--resume", "--limit", limit)
        assert done.returncode == 0, done.stderr
    shards = [sorted(f.glob("part-*.parquet")) for f in (out, straight)]
    assert [p.name for p in shards[0]] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert [p.read_bytes() for p in shards[0]] == [p.read_bytes() for p in shards[1]]


STUCK = """\
import threading
from inferchain.pipeline import Pipeline

class StuckLoad(Pipeline):
    def load(self, path):
        if path.name == "1.npy":
            threading.Event().wait()  # never returns
        return super().load(path)
"""


def test_item_timeout_bounds_a_host_step_that_never_returns(tiny: Path) -> None:  # noqa: F811
    """The stuck load becomes its item's timeout line and the run ends (exit 1) with the
    other items' results; its thread is left behind and does not hold the exit."""
    for i in range(4, 12):
        np.save(tiny / "samples" / f"{i:02d}.npy", np.full(64, i, np.float32))
    use_pipeline(tiny, STUCK, "StuckLoad")
    out = tiny / "out"
    done = inferchain("run", tiny, "--output", out, "--item-timeout", 1)
    assert done.returncode == 1, done.stderr
    lines = records(out)
    assert len(lines) == 12
    stuck = [r for r in lines if Path(str(r["file"])).name == "1.npy"]
    assert [r["error"] for r in stuck] == ["RequestTimeout: timed out after 1 s"]
    assert sum("y" in r for r in lines) >= 8  # the items after it ran on the other threads
