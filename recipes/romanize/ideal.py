"""The package's romanizer model path, and the ideal continuous-batching loop on the same model.

`package_model(...)` is arabic-name-romanizer's own `OnnxModel` (beam search over batches
of 256 names in lock step, each batch until its last name ends). `ContinuousDecoder` keeps
`slots` names live: every step runs the decoder once over all their beams, a name leaves as
soon as its beams end and the next name takes its slot in the same step. Names are encoded
in the package's batches of 256 (the encoder output depends on the padding of its batch),
so each name's hypotheses are the package's, bit for bit.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .beam import BeamSpec, Encoded, Hypotheses, advance, encode_chunk, hypotheses, resources_dir

ENCODE_BATCH = 256  # the package's OnnxModel batch_size default


def open_sessions(threads: int = 2) -> tuple[Any, Any]:
    """Encoder and decoder sessions with the package's options (2 intra-op threads)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads
    res = resources_dir()
    return tuple(  # type: ignore[return-value]
        ort.InferenceSession(str(res / f), opts, providers=["CPUExecutionProvider"])
        for f in ("encoder.onnx", "decoder.onnx")
    )


def package_model(batch_size: int = ENCODE_BATCH, threads: int = 2) -> Any:
    """The package's own model path: dedupe off, no spelling prior (none ships)."""
    from arabic_name_romanizer.inference import OnnxModel

    return OnnxModel(resources_dir(), batch_size=batch_size, dedupe=False, intra_op_threads=threads)


def package_hypotheses(model: Any, units: Sequence[str]) -> list[Hypotheses]:
    """`OnnxModel.transliterate_units` with every hypothesis kept (top_k = beam width)."""
    return [list(h) for h in model.transliterate_units(list(units), None, top_k=model.beam_width)]


def sample_units(n: int, seed: int = 0) -> list[str]:
    """`n` distinct Arabic-script name units from the package's own names.sqlite3, sorted."""
    with sqlite3.connect(resources_dir() / "names.sqlite3") as db:
        rows = db.execute(
            "SELECT DISTINCT arabic_key FROM units WHERE country NOT IN ('AF', 'IR', 'PK') "
            "ORDER BY arabic_key"
        ).fetchall()
    picks = np.random.default_rng(seed).choice(len(rows), size=min(n, len(rows)), replace=False)
    return [rows[i][0] for i in sorted(picks)]


def encoded_names(
    encoder: Any, spec: BeamSpec, units: Sequence[str], batch: int = ENCODE_BATCH
) -> Iterator[Encoded]:
    """Each unit's encoder outputs, computed in the package's batches (lazily, batch by batch)."""
    for i in range(0, len(units), batch):
        sources = [spec.source_ids(u) for u in units[i : i + batch]]
        yield from encode_chunk(encoder, sources, spec.vocab.pad_id)


class ContinuousDecoder:
    """Beam search with names joining and leaving between decoder steps.

    State lives in pools of `slots` names x k beams: the encoder memory and mask (padded to
    `width`), the decoder hidden state, the tokens so far, the beams' scores. A step gathers
    the live names' rows (none when every slot is live), runs the decoder, reorders the
    hidden rows and tokens by the chosen beams and writes them back.
    """

    def __init__(self, decoder: Any, spec: BeamSpec, slots: int, width: int) -> None:
        k = spec.beam_width
        self.decoder, self.spec, self.slots, self.k = decoder, spec, slots, k
        self.memory = np.zeros((slots * k, width, 256), dtype=np.float32)
        self.src_mask = np.ones((slots * k, width), dtype=bool)
        self.hidden = np.zeros((slots * k, 2, 256), dtype=np.float32)
        self.last = np.zeros((slots * k, 1), dtype=np.int64)  # each beam's last token
        self.tokens = np.zeros((slots, k, spec.max_len), dtype=np.int64)
        self.scores = np.zeros((slots, k), dtype=np.float64)
        self.finished = np.zeros((slots, k), dtype=bool)
        self.lengths = np.zeros((slots, k), dtype=np.int64)
        self.step = np.zeros(slots, dtype=np.int64)
        self.name = np.full(slots, -1, dtype=np.int64)  # slot -> index of its name, -1: free

    def run(self, names: Iterator[Encoded]) -> list[Hypotheses]:
        """Decode every name; results in the order the names came."""
        results: dict[int, Hypotheses] = {}
        pending = enumerate(names)
        for slot in range(self.slots):
            self._join(slot, pending)
        while (self.name >= 0).any():
            for slot, hyps in self._step():
                results[int(self.name[slot])] = hyps
                self._join(slot, pending)
        return [results[i] for i in range(len(results))]

    def _join(self, slot: int, pending: Iterator[tuple[int, Encoded]]) -> None:
        nxt = next(pending, None)
        if nxt is None:
            self.name[slot] = -1
            return
        index, enc = nxt
        rows = slice(slot * self.k, (slot + 1) * self.k)
        w = enc.memory.shape[0]
        self.memory[rows, :w] = enc.memory
        self.memory[rows, w:] = 0.0
        self.src_mask[rows, :w] = enc.src_mask
        self.src_mask[rows, w:] = True
        self.hidden[rows] = enc.hidden
        self.last[rows] = self.spec.vocab.bos_id
        self.scores[slot] = 0.0
        self.scores[slot, 1:] = -np.inf
        self.finished[slot] = False
        self.lengths[slot] = 0
        self.step[slot] = 0
        self.name[slot] = index

    def _step(self) -> list[tuple[int, Hypotheses]]:
        """One decoder step of every live name; returns the names that ended, by slot."""
        k, vocab = self.k, self.spec.vocab
        live = np.flatnonzero(self.name >= 0)
        if live.size == self.slots:
            rows = np.arange(self.slots * k)
            feed = {"memory": self.memory, "src_mask": self.src_mask, "hidden": self.hidden}
            feed["prefix"] = self.last
        else:
            rows = (live[:, None] * k + np.arange(k)).reshape(-1)
            feed = {
                "prefix": self.last[rows],
                "memory": self.memory[rows],
                "src_mask": self.src_mask[rows],
                "hidden": self.hidden[rows],
            }
        logprobs, hidden = self.decoder.run(None, feed)
        step = self.step[live]
        scores, finished, lengths, beam, token = advance(
            self.scores[live],
            self.finished[live],
            self.lengths[live],
            step == 0,
            logprobs,
            vocab.pad_id,
            vocab.eos_id,
        )
        self.hidden[rows] = hidden[(np.arange(live.size)[:, None] * k + beam).reshape(-1)]
        tokens = np.take_along_axis(self.tokens[live], beam[:, :, None], axis=1)
        tokens[np.arange(live.size), :, step] = token
        self.tokens[live] = tokens
        self.last[rows, 0] = token.reshape(-1)
        self.scores[live], self.finished[live], self.lengths[live] = scores, finished, lengths
        self.step[live] = step + 1
        ended = live[finished.all(axis=1) | (step + 1 == self.spec.max_len)]
        return [
            (
                int(s),
                hypotheses(
                    self.spec,
                    self.tokens[s, :, : self.step[s]],
                    self.scores[s],
                    self.lengths[s],
                ),
            )
            for s in ended
        ]


def continuous_hypotheses(
    encoder: Any, decoder: Any, spec: BeamSpec, units: Sequence[str], slots: int = 128
) -> list[Hypotheses]:
    """Every unit's hypotheses from the continuous loop (`slots` names live at once)."""
    width = max(len(spec.source_ids(u)) for u in units)
    loop = ContinuousDecoder(decoder, spec, min(slots, len(units)), width)
    return loop.run(encoded_names(encoder, spec, units))
