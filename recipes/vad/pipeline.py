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

from .vad import SAMPLING_RATE, chunk_inputs, read_wav, speech_segments

SR = np.array(SAMPLING_RATE, np.int64)  # a 0-d array: the exact-type fast path


class _File:
    """One file's sequence: its model inputs per chunk and the probabilities so far."""

    __slots__ = ("inputs", "k", "probs")

    def __init__(self, audio: np.ndarray) -> None:
        self.inputs = chunk_inputs(audio)  # f32[chunks, 576], a strided view
        self.probs = np.empty(len(self.inputs), dtype=np.float32)
        self.k = 0  # the next chunk


class VadSteps(Stepper):
    """silero-vad's host logic for every live file of a step batch at once."""

    def start(self, item: np.ndarray) -> _File:
        return _File(item)

    def feed(self, states: Sequence[_File]) -> Mapping[str, np.ndarray]:
        return {"input": np.stack([f.inputs[f.k] for f in states]), "sr": SR}

    def take(self, states: Sequence[_File], outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        probs = outputs["output"][:, 0].tolist()
        ended = np.empty(len(states), dtype=bool)
        for i, f in enumerate(states):
            f.probs[f.k] = probs[i]
            f.k += 1
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
