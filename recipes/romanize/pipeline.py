"""Romanize recipe: one name unit -> its encoder row -> a decoder sequence of k beams.

`RomanizePipeline` runs the beam search of all live units at once (`BeamSteps`: one call per
decoder step batch, `beam.advance` over all its units); `StepwisePipeline` is the same recipe
as a generator per unit (`oi.sequence(rows=k)`, `beam.beam_steps`). Both give the package's
hypotheses. The state (`hidden`, one row per beam) stays in the decoder's sequence lanes and
is reordered with the beams there; the encoder outputs `memory` / `src_mask` are fed at every
step, and the recipe declares them `constant:` (where the decoder keeps its state on the
device, acl with one instance, each unit's `memory` is copied there once).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inferchain import Stepper
from inferchain.pipeline import Pipeline, Process

from .beam import BeamSpec, Hypotheses, advance, beam_steps, hypotheses, initial_scores


class _Unit:
    """One unit's beam search: its encoder outputs and its beams so far."""

    __slots__ = ("finished", "hidden", "last", "lengths", "mask", "memory", "scores", "t", "tokens")

    def __init__(self, spec: BeamSpec, enc: Mapping[str, np.ndarray]) -> None:
        k = spec.beam_width
        self.memory = enc["memory_out"]  # f32[S, 256]
        self.mask = enc["src_mask_out"]  # bool[S]
        self.hidden = enc["hidden_out"]  # f32[2, 256]: every beam's initial state
        self.scores = initial_scores(1, k)[0]
        self.finished = np.zeros(k, dtype=bool)
        self.lengths = np.zeros(k, dtype=np.int64)
        self.tokens = np.zeros((k, spec.max_len), dtype=np.int64)
        self.last = np.full(k, spec.vocab.bos_id, dtype=np.int64)
        self.t = 0  # steps so far


class BeamSteps(Stepper):
    """arabic-name-romanizer's beam search for every live unit of a step batch at once."""

    # three step batches on their way: both decoder instances busy while the host's beam
    # step of the third runs
    cohorts = 3

    def __init__(self, spec: BeamSpec) -> None:
        self.spec = spec
        self.rows = spec.beam_width

    def start(self, item: Mapping[str, np.ndarray]) -> _Unit:
        return _Unit(self.spec, item)

    def initial(self, state: _Unit) -> Mapping[str, np.ndarray]:
        return {"hidden": state.hidden}

    def group(self, state: _Unit) -> int:
        """A unit's width, its encoder batch's: only units of one width share a step batch,
        so each is fed as it is, never padded to another unit's width (the decoder's last
        digits follow the width, not the rows that share its batch)."""
        return int(state.memory.shape[0])

    def feed(self, states: Sequence[_Unit]) -> Mapping[str, np.ndarray]:
        """Each beam's last token, and each unit's `memory` and `src_mask` for each of its
        beams (the units of a step batch share a width: `group`)."""
        k, n = self.rows, len(states)
        widths = {u.memory.shape[0] for u in states}
        if len(widths) > 1:
            raise ValueError(f"a step batch of units of several widths {sorted(widths)}")
        memory = np.array([u.memory for u in states])  # f32[n, S, 256]
        mask = np.array([u.mask for u in states])
        prefix = np.array([u.last for u in states]).reshape(n * k, 1)
        return {
            "prefix": prefix,
            "memory": np.repeat(memory, k, axis=0),
            "src_mask": np.repeat(mask, k, axis=0),
        }

    def take(
        self, states: Sequence[_Unit], outputs: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        spec = self.spec
        n = len(states)
        steps = np.array([u.t for u in states])
        scores, finished, lengths, beam, token = advance(
            np.array([u.scores for u in states]),
            np.array([u.finished for u in states]),
            np.array([u.lengths for u in states]),
            steps == 0,
            outputs["logprobs"],
            spec.vocab.pad_id,
            spec.vocab.eos_id,
        )
        # every unit's tokens reordered by its beams (past its step every beam holds zeros:
        # reordering whole rows is the same), then this step's token appended
        tokens = np.array([u.tokens for u in states])[np.arange(n)[:, None], beam]
        tokens[np.arange(n), :, steps] = token
        for u, tk, sc, fi, le, to in zip(
            states, tokens, scores, finished, lengths, token, strict=True
        ):
            u.tokens, u.scores, u.finished, u.lengths, u.last = tk, sc, fi, le, to
            u.t += 1
        ended = finished.all(axis=1) | (steps + 1 == spec.max_len)
        return ended, beam

    def result(self, state: _Unit) -> Hypotheses:
        t = state.t
        return hypotheses(self.spec, state.tokens[:, :t], state.scores, state.lengths)


class RomanizePipeline(Pipeline):
    """A unit -> its (text, score) hypotheses, best first, as the package returns them."""

    suffixes = (".txt",)
    item_per_line = True  # `inferchain run --input names.txt`: one unit per line
    # whole encoder batches must be in flight before one leaves (`batching: fill`), and
    # every unit in flight may hold a decoder sequence of k rows
    max_in_flight = 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec = BeamSpec.from_dir()
        self.steps = BeamSteps(self.spec)
        self.country: str | None = self.params.get("country")
        self.role: str | None = self.params.get("role")

    def encode(self, item: str) -> Any:
        spec = self.spec
        src = np.asarray(spec.source_ids(item, self.country, self.role), dtype=np.int64)
        return self.submit("encoder", {"src": src, "src_mask": src == spec.vocab.pad_id})

    def process(self, item: str) -> Process:
        enc = yield self.encode(item)
        hyps = yield self.oi.run_sequence("decoder", self.steps, enc)
        return hyps

    def to_record(self, result: Any) -> dict[str, Any]:
        return {"hypotheses": [{"text": t, "score": s} for t, s in result]}

    def summary(self, result: Any) -> str:
        return ", ".join(f"{t} ({s:.3f})" for t, s in result)


class StepwisePipeline(RomanizePipeline):
    """The same recipe as a generator per unit: `beam.beam_steps`, one `step_rows` per step."""

    def process(self, item: str) -> Process:
        spec = self.spec
        enc = yield self.encode(item)
        k = spec.beam_width
        memory = np.broadcast_to(enc["memory_out"], (k, *enc["memory_out"].shape))
        mask = np.broadcast_to(enc["src_mask_out"], (k, *enc["src_mask_out"].shape))
        with self.oi.sequence("decoder", rows=k, state={"hidden": enc["hidden_out"]}) as seq:
            steps = beam_steps(spec)
            step = next(steps)
            while True:
                feed = {"prefix": step.prefix, "memory": memory, "src_mask": mask}
                outs = yield seq.step_rows(feed, reorder=step.reorder)
                try:
                    step = steps.send(np.stack([o["logprobs"] for o in outs]))
                except StopIteration as done:
                    return done.value
