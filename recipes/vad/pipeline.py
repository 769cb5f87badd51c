"""VAD recipe: each file's 512-sample chunks are steps of one sequence of the `vad` model.

The state stays in the model's sequence slots (`self.oi.sequence`, docs/sequences.md); the
numpy logic (`vad.py`) is the one the ideal loop uses too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from inferchain.pipeline import Pipeline, Process

from .vad import SAMPLING_RATE, chunk_inputs, read_wav, speech_segments

SR = np.array(SAMPLING_RATE, np.int64)  # a 0-d array: the exact-type fast path


class VadPipeline(Pipeline):
    """A 16 kHz mono file -> one step per chunk (the state stays with the framework) -> segments.

    The steps of many files batch together; a file's sequence ends with its last chunk and
    frees its state slot for the next file.
    """

    suffixes = (".wav", ".flac", ".ogg")

    def load(self, path: Path) -> Any:
        return read_wav(path, resample=bool(self.params.get("resample", True)))

    def input_files(self, folder: Path) -> list[Path]:
        return sorted(
            p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in self.suffixes
        )

    def process(self, item: np.ndarray) -> Process:
        inputs = chunk_inputs(item)
        probs = np.empty(len(inputs), dtype=np.float32)
        with self.oi.sequence("vad") as seq:
            for k, x in enumerate(inputs):
                out = yield seq.step({"input": x, "sr": SR})
                probs[k] = out["output"][0]
        return speech_segments(probs, item.size)

    def to_record(self, result: Any) -> dict[str, Any]:
        return {"segments": list(result)}

    def summary(self, result: Any) -> str:
        seconds = sum(s["end"] - s["start"] for s in result) / SAMPLING_RATE
        return f"{len(result)} speech segments, {seconds:.1f} s of speech"
