"""VAD recipe: each file's 512-sample chunks are steps of one sequence of the `vad` model.

The state stays in the model's sequence lanes (docs/sequences.md). `VadPipeline` runs the
host logic of all live files at once (`VadSteps`, one call per step batch); `StepwisePipeline`
is the same recipe written as a generator per file (`oi.sequence`), one step at a time. Both
give the package's segments; the numpy logic (`vad.py`) is the one the ideal loop uses too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferchain import Stepper
from inferchain.pipeline import Pipeline, Process

from .vad import (
    CHUNK,
    SAMPLING_RATE,
    Audio,
    Segments,
    chunk_inputs,
    num_chunks,
    read_audio,
    speech_segments,
)

SR = np.array(SAMPLING_RATE, np.int64)  # a 0-d array: the exact-type fast path


class _File:
    """One file's sequence: its model inputs per chunk (and `ahead - 1` chunks of silence
    after them, so that every batch can take `ahead` chunks) and the probabilities so far."""

    __slots__ = ("inputs", "k", "probs")

    def __init__(self, audio: np.ndarray, ahead: int = 1) -> None:
        n = num_chunks(audio.size)
        tail = np.zeros((ahead - 1) * CHUNK, dtype=np.float32)
        self.inputs = chunk_inputs(np.concatenate([audio, tail]))[: n + ahead - 1]
        self.probs = np.empty(n, dtype=np.float32)
        self.k = 0  # the next chunk


class VadSteps(Stepper):
    """silero-vad's host logic for every live file of a step batch at once.

    A file's next chunks do not depend on the model's outputs, so each batch runs
    `steps_per_batch` steps of its files on the worker (multi-step batches,
    docs/sequences.md): this host logic runs once per that many chunks. A file's last
    batch runs on chunks of silence past its end; their probabilities are dropped.
    """

    steps_per_batch = 16

    def __init__(self, steps_per_batch: int | None = None) -> None:
        if steps_per_batch is not None:
            self.steps_per_batch = steps_per_batch

    def start(self, item: np.ndarray) -> _File:
        return _File(item, self.steps_per_batch)

    def feed(self, states: Sequence[_File]) -> Mapping[str, np.ndarray]:
        k = self.steps_per_batch
        if k == 1:
            return {"input": np.stack([f.inputs[f.k] for f in states]), "sr": SR}
        return {"input": np.stack([f.inputs[f.k : f.k + k] for f in states]), "sr": SR}

    def take(self, states: Sequence[_File], outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        k = self.steps_per_batch
        probs = outputs["output"].reshape(len(states), k)
        ended = np.empty(len(states), dtype=bool)
        for i, f in enumerate(states):
            m = min(k, len(f.probs) - f.k)  # the chunks that are the file's
            f.probs[f.k : f.k + m] = probs[i, :m]
            f.k += m
            ended[i] = f.k == len(f.probs)
        return ended

    def result(self, state: _File) -> np.ndarray:
        return state.probs


def audio_of(item: Audio | np.ndarray) -> Audio:
    """An item as `Audio`: a file read by `load`, or an array of 16 kHz mono samples."""
    if isinstance(item, Audio):
        return item
    samples = np.asarray(item, dtype=np.float32).reshape(-1)
    return Audio(samples, SAMPLING_RATE, samples.size)


class VadPipeline(Pipeline):
    """An audio file -> one sequence of steps (`VadSteps`) -> its speech segments.

    Items are files read by `load` (any rate, resampled to 16 kHz; several channels mixed
    down to their mean: `params: {resample, downmix}`) or arrays of 16 kHz mono samples.
    The result is a `Segments` list of `{"start", "end"}` in the item's own samples (for a
    16 kHz item, exactly the package's); its record adds seconds and the sampling rate. The
    steps of many files batch together; a file's sequence ends with its last chunk and frees
    its state lane for the next file.
    """

    suffixes = (".wav", ".flac", ".ogg")
    requires = ("soundfile", "soxr")  # read_audio's reader and resampler
    steps = VadSteps()

    def load(self, path: Path) -> Audio:
        resample = bool(self.params.get("resample", True))
        return read_audio(path, resample=resample, downmix=bool(self.params.get("downmix", True)))

    def process(self, item: Audio | np.ndarray) -> Process:
        audio = audio_of(item)
        if audio.samples.size == 0:
            return Segments([], audio.rate, audio.channels)
        probs = yield self.oi.run_sequence("vad", self.steps, audio.samples)
        return Segments.of(speech_segments(probs, audio.samples.size), audio)

    def to_record(self, result: Segments) -> dict[str, Any]:
        """`{"sampling_rate": Hz, "channels": N, "segments": [{"start", "end", "start_s",
        "end_s"}]}`: samples of the file itself at its rate, and seconds."""
        return {
            "sampling_rate": result.rate,
            "channels": result.channels,
            "segments": result.records(),
        }

    def summary(self, result: Segments) -> str:
        return f"{len(result)} speech segments, {result.seconds:.1f} s of speech"


class StepwisePipeline(VadPipeline):
    """The same recipe as a generator per file: one `seq.step` per chunk."""

    def process(self, item: Audio | np.ndarray) -> Process:
        audio = audio_of(item)
        inputs = chunk_inputs(audio.samples)
        probs = np.empty(len(inputs), dtype=np.float32)
        with self.oi.sequence("vad") as seq:
            for k, x in enumerate(inputs):
                out = yield seq.step({"input": x, "sr": SR})
                probs[k] = out["output"][0]
        return Segments.of(speech_segments(probs, audio.samples.size), audio)
