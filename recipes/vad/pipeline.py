"""VAD recipe: each file's 512-sample chunks are steps of one sequence of the `vad` model.

The state stays in the model's sequence slots (docs/sequences.md). `VadPipeline` runs the
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

from .vad import CHUNK, SAMPLING_RATE, chunk_inputs, num_chunks, read_wav, speech_segments

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


class VadPipeline(Pipeline):
    """A 16 kHz mono file -> one sequence of steps (`VadSteps`) -> segments.

    The steps of many files batch together; a file's sequence ends with its last chunk and
    frees its state slot for the next file.
    """

    suffixes = (".wav", ".flac", ".ogg")
    requires = ("soundfile", "soxr")  # read_wav's reader and resampler
    steps = VadSteps()

    def load(self, path: Path) -> Any:
        return read_wav(path, resample=bool(self.params.get("resample", True)))

    def process(self, item: np.ndarray) -> Process:
        if item.size == 0:
            return []
        probs = yield self.oi.run_sequence("vad", self.steps, item)
        return speech_segments(probs, item.size)

    def to_record(self, result: Any) -> dict[str, Any]:
        return {"segments": list(result)}

    def summary(self, result: Any) -> str:
        seconds = sum(s["end"] - s["start"] for s in result) / SAMPLING_RATE
        return f"{len(result)} speech segments, {seconds:.1f} s of speech"


class StepwisePipeline(VadPipeline):
    """The same recipe as a generator per file: one `seq.step` per chunk."""

    def process(self, item: np.ndarray) -> Process:
        inputs = chunk_inputs(item)
        probs = np.empty(len(inputs), dtype=np.float32)
        with self.oi.sequence("vad") as seq:
            for k, x in enumerate(inputs):
                out = yield seq.step({"input": x, "sr": SR})
                probs[k] = out["output"][0]
        return speech_segments(probs, item.size)
