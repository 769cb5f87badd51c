"""Romanize recipe: one name unit -> its encoder row -> a decoder sequence of k beams.

The beam-search arithmetic is `beam.py`'s (the package's, one unit at a time); the state
(`hidden`, one row per beam) stays in the decoder's sequence slots and is reordered with the
beams there, and the encoder outputs `memory` / `src_mask` are fed again at every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferchain.pipeline import Pipeline, Process

from .beam import BeamSpec, beam_steps


class RomanizePipeline(Pipeline):
    """A unit -> its (text, score) hypotheses, best first, as the package returns them."""

    suffixes = (".txt",)
    item_per_line = True  # `inferchain run --input names.txt`: one unit per line
    # whole encoder batches must be in flight before one leaves (`batching: fill`), and
    # every unit in flight may hold a decoder sequence of k rows
    max_in_flight = 512

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec = BeamSpec.from_dir()
        self.country: str | None = self.params.get("country")
        self.role: str | None = self.params.get("role")

    def process(self, item: str) -> Process:
        spec = self.spec
        src = np.asarray(spec.source_ids(item, self.country, self.role), dtype=np.int64)
        enc = yield self.submit("encoder", {"src": src, "src_mask": src == spec.vocab.pad_id})
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

    def to_record(self, result: Any) -> dict[str, Any]:
        return {"hypotheses": [{"text": t, "score": s} for t, s in result]}

    def summary(self, result: Any) -> str:
        return ", ".join(f"{t} ({s:.3f})" for t, s in result)
