"""arabic-name-romanizer's beam search, one decoder step at a time, for any set of names.

The package (`arabic_name_romanizer.inference.beam_search`) decodes a fixed batch of names
in lock step until the last one ends. The same arithmetic is split here so that each name
can start and end on its own step, and the steps of many names still run as one batch:

- `encode_chunk`: the encoder over up to 256 names exactly as the package calls it (one
  batch padded to its longest name: the encoder's outputs depend on that padding);
- `advance`: one beam step for n names from the decoder's log-probabilities (n = 1 for a
  single name), the package's arithmetic row for row;
- `hypotheses`: a name's finished beams -> `(text, score)` best first, as the package returns;
- `beam_steps`: the plain form, a generator per name that yields what each step needs.

Decoder IO per row (one row per beam): `prefix` i64[rows, t] (only its last token is read),
`memory` f32[rows, src_len, 256] and `src_mask` bool[rows, src_len] from the encoder (the
same for a name's beams, never reordered), `hidden` f32[rows, 2, 256] carried from
`hidden_out` and reordered with the beams -> `logprobs` f32[rows, 160], `hidden_out`.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

Hypotheses = list[tuple[str, float]]  # (text, length-normalised mean log-probability)


def resources_dir() -> Path:
    """The model files inside the arabic-name-romanizer wheel."""
    from arabic_name_romanizer.api import default_resources_dir

    return Path(default_resources_dir())


@attrs.frozen
class BeamSpec:
    """What the package's `OnnxModel` reads from meta.json and vocab.json."""

    vocab: Any  # arabic_name_romanizer.vocab.CharVocab
    beam_width: int  # beams per name (2)
    max_len: int  # decoder steps at most (32)
    length_alpha: float  # score = sum of log-probs / length ** alpha (1.0)

    @classmethod
    def from_dir(cls, model_dir: Path | None = None) -> BeamSpec:
        from arabic_name_romanizer.vocab import CharVocab

        model_dir = model_dir or resources_dir()
        meta = json.loads((model_dir / "meta.json").read_text(encoding="utf-8"))
        return cls(
            vocab=CharVocab.load(model_dir / "vocab.json"),
            beam_width=int(meta["beam_width"]),
            max_len=int(meta["max_tgt_len"]),
            length_alpha=float(meta.get("length_alpha", 1.0)),
        )

    def source_ids(
        self, unit: str, country: str | None = None, role: str | None = None
    ) -> list[int]:
        """The encoder's token ids for one name unit (the package's own function)."""
        from arabic_name_romanizer.inference import encode_source_ids

        return list(encode_source_ids(self.vocab, unit, country, role))


@attrs.frozen(eq=False)
class Encoded:
    """One name's encoder outputs, held for all its decoder steps."""

    memory: np.ndarray  # f32[src_len, 256]; src_len = the padded width of its encoder batch
    src_mask: np.ndarray  # bool[src_len], True at padding
    hidden: np.ndarray  # f32[2, 256], the decoder's initial `hidden`


def encode_chunk(encoder: Any, sources: Sequence[list[int]], pad_id: int) -> list[Encoded]:
    """Run the encoder once over `sources` padded to the longest, as the package batches."""
    from arabic_name_romanizer.inference import pad_batch

    src, mask = pad_batch(list(sources), pad_id)
    memory, src_mask, hidden = encoder.run(None, {"src": src, "src_mask": mask})
    return [Encoded(memory[i], src_mask[i], hidden[i]) for i in range(len(sources))]


def initial_scores(n: int, k: int) -> np.ndarray:
    """f64[n, k]: only beam 0 is alive at the start."""
    scores = np.zeros((n, k), dtype=np.float64)
    scores[:, 1:] = -np.inf
    return scores


def advance(
    scores: np.ndarray,
    finished: np.ndarray,
    lengths: np.ndarray,
    first: np.ndarray,
    logprobs: np.ndarray,
    pad: int,
    eos: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One beam step for n names, each at its own step.

    scores f64[n, k], finished bool[n, k], lengths i64[n, k]: the names' beams so far;
    first bool[n]: the name's first step (no empty outputs); logprobs f32[n * k, V]: the
    decoder's output, k rows per name. Returns the new scores, finished and lengths, and
    beam i64[n, k] (which old beam each new beam extends: reorder state and tokens with it)
    and token i64[n, k] (the token it appends; PAD after a beam has finished).
    """
    n, k = scores.shape
    v = logprobs.shape[1]
    lp = logprobs.astype(np.float64).reshape(n, k, v)
    lp[first, :, eos] = -np.inf
    lp = np.where(finished[:, :, None], -np.inf, lp)
    lp[:, :, pad] = np.where(finished, 0.0, -np.inf)  # finished beams go on with PAD, free
    flat = (scores[:, :, None] + lp).reshape(n, k * v)
    top = np.argpartition(-flat, k - 1, axis=1)[:, :k]
    top_scores = np.take_along_axis(flat, top, axis=1)
    order = np.argsort(-top_scores, axis=1, kind="stable")
    top = np.take_along_axis(top, order, axis=1)
    top_scores = np.take_along_axis(top_scores, order, axis=1)
    beam, token = top // v, top % v
    was_finished = np.take_along_axis(finished, beam, axis=1)
    lengths = np.take_along_axis(lengths, beam, axis=1) + (~was_finished)
    return top_scores, was_finished | (token == eos), lengths, beam, token


def advance_one(
    scores: np.ndarray,
    finished: np.ndarray,
    lengths: np.ndarray,
    first: bool,
    logprobs: np.ndarray,
    pad: int,
    eos: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`advance` for one name (scores, finished, lengths of shape [k]; logprobs [k, V]):
    the same arithmetic on 1-D arrays, without the batch axis's indexing overhead."""
    k, v = logprobs.shape
    lp = logprobs.astype(np.float64)
    if first:
        lp[:, eos] = -np.inf
    if finished.any():
        lp[finished] = -np.inf
    lp[:, pad] = np.where(finished, 0.0, -np.inf)
    flat = (scores[:, None] + lp).ravel()
    top = np.argpartition(-flat, k - 1)[:k]
    top_scores = flat[top]
    order = np.argsort(-top_scores, kind="stable")
    top, top_scores = top[order], top_scores[order]
    beam, token = top // v, top % v
    was_finished = finished[beam]
    return top_scores, was_finished | (token == eos), lengths[beam] + ~was_finished, beam, token


def hypotheses(
    spec: BeamSpec, tokens: np.ndarray, scores: np.ndarray, lengths: np.ndarray
) -> Hypotheses:
    """A name's beams (tokens i64[k, steps], scores f64[k], lengths i64[k]) -> best first.

    Beams are decoded to text, empty and repeated texts dropped, scores divided by
    length ** alpha, then sorted: `beam_search`'s own last loop.
    """
    vocab, pad = spec.vocab, spec.vocab.pad_id
    out: Hypotheses = []
    seen: set[str] = set()
    for j in range(len(scores)):
        if not np.isfinite(scores[j]):
            continue
        text = vocab.decode([x for x in tokens[j].tolist() if x != pad]).strip()
        if not text or text in seen:
            continue
        seen.add(text)
        out.append((text, float(scores[j]) / max(int(lengths[j]), 1) ** spec.length_alpha))
    out.sort(key=lambda h: -h[1])
    return out


@attrs.frozen(eq=False)
class DecodeStep:
    """What one name's next decoder step needs from the host side."""

    prefix: np.ndarray  # i64[k, 1]: each beam's last token (the decoder reads no other)
    reorder: np.ndarray | None  # i64[k]: beam j goes on from the carried state's row
    # reorder[j] (gather `hidden_out` of the last step with it); None at the first step


def beam_steps(spec: BeamSpec) -> Generator[DecodeStep, np.ndarray, Hypotheses]:
    """One name's beam search as a generator: yields each decoder step's `DecodeStep`,
    receives that step's `logprobs` f32[k, V], returns the name's hypotheses.

    The carried state (`hidden`, k rows, initially the encoder's `hidden_out` for each
    beam) and the constant `memory` / `src_mask` stay with whoever runs the decoder.
    """
    k, vocab = spec.beam_width, spec.vocab
    scores = initial_scores(1, k)[0]
    finished = np.zeros(k, dtype=bool)
    lengths = np.zeros(k, dtype=np.int64)
    tokens = np.zeros((k, spec.max_len), dtype=np.int64)
    step = DecodeStep(np.full((k, 1), vocab.bos_id, dtype=np.int64), None)
    t = 0
    while t < spec.max_len:
        logprobs = yield step
        scores, finished, lengths, beam, token = advance_one(
            scores, finished, lengths, t == 0, logprobs, vocab.pad_id, vocab.eos_id
        )
        tokens[:, : t + 1] = tokens[beam, : t + 1]
        tokens[:, t] = token
        t += 1
        if finished.all():
            break
        step = DecodeStep(token.reshape(k, 1), beam)
    tokens = tokens[:, :t]
    return hypotheses(spec, tokens, scores, lengths)
