"""Make the VAD recipe's sample files: real speech cut and joined with pauses, 16 kHz mono WAV.

The speech comes from the recordings that the `moonshine-voice` wheel ships as demo assets
(MIT licensed): a Beckett passage, a scene of Beckett's Endgame and the opening of A Tale of
Two Cities, converted to 16 kHz with soxr. Each sample file is 10-60 s long: pieces of
2-12 s of those recordings at random offsets, with pauses of 0.3-3 s of faint noise between
them. Deterministic for a given seed; nothing is committed (about 1 MB per file):

    python recipes/vad/make_samples.py OUT_DIR [--count 32] [--seed 0]
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np

RATE = 16000
SOURCES = ("beckett.wav", "endgame_nagg_nell.wav", "two_cities.wav")


def assets_dir() -> Path:
    """The `assets/` folder of the installed moonshine_voice package (not imported)."""
    spec = importlib.util.find_spec("moonshine_voice")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "the VAD samples need the speech recordings of the moonshine-voice wheel: "
            "pip install moonshine-voice (or the dev extra)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "assets"


def recordings() -> list[np.ndarray]:
    """The source recordings, float32 mono at 16 kHz."""
    import soundfile as sf
    import soxr

    out = []
    for name in SOURCES:
        audio, rate = sf.read(assets_dir() / name, dtype="float32", always_2d=True)
        mono = audio.mean(axis=1, dtype=np.float32)
        if rate != RATE:
            mono = soxr.resample(mono, rate, RATE).astype(np.float32)
        out.append(mono)
    return out


def compose(rng: np.random.Generator, sources: list[np.ndarray]) -> np.ndarray:
    """One file: pauses and pieces of speech until its drawn length (10-60 s) is reached."""
    target = int(rng.uniform(10, 60) * RATE)
    parts: list[np.ndarray] = []
    length = 0
    fade = np.linspace(0, 1, RATE // 100, dtype=np.float32)  # 10 ms, no clicks
    while length < target:
        pause = int(rng.uniform(0.3, 3.0) * RATE)
        parts.append((rng.standard_normal(pause) * 1e-3).astype(np.float32))
        source = sources[int(rng.integers(len(sources)))]
        size = min(int(rng.uniform(2, 12) * RATE), source.size)
        start = int(rng.integers(0, source.size - size + 1))
        piece = source[start : start + size].copy()
        piece[: fade.size] *= fade
        piece[-fade.size :] *= fade[::-1]
        parts.append(piece)
        length += pause + size
    return np.concatenate(parts)[:target]


def make_samples(out_dir: Path, count: int = 32, seed: int = 0) -> list[Path]:
    """Write `count` files `speech_NN.wav` into `out_dir` (kept if already there)."""
    import soundfile as sf

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"speech_{seed}_{i:03d}.wav" for i in range(count)]
    if all(p.exists() for p in paths):
        return paths
    sources = recordings()
    for i, path in enumerate(paths):
        audio = compose(np.random.default_rng([seed, i]), sources)
        sf.write(path, np.clip(audio, -1, 1), RATE, subtype="PCM_16")
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--count", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for path in make_samples(args.out_dir, args.count, args.seed):
        print(path)


if __name__ == "__main__":
    main()
