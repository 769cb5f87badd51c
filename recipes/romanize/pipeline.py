"""Romanize recipe: one name unit -> encoder request -> a decoder sequence of k beams.

Written against the sequence API proposed in docs/sequences.md (`self.oi.sequence`); the
beam-search logic it uses (`beam.py`) is the one the ideal loop and the tests run today.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from inferchain.pipeline import Pipeline, Process

from .beam import BeamSpec, beam_steps


class RomanizePipeline(Pipeline):
    """A unit -> its (text, score) hypotheses, best first, as the package returns them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec = BeamSpec.from_dir()
        self.country: str | None = self.params.get("country")
        self.role: str | None = self.params.get("role")

    def load(self, path: Path) -> Any:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]

    def process(self, item: str) -> Process:
        src = np.asarray(self.spec.source_ids(item, self.country, self.role), dtype=np.int64)
        enc = yield self.submit("encoder", {"src": src, "src_mask": src == self.spec.vocab.pad_id})
        k = self.spec.beam_width
        with self.oi.sequence(  # type: ignore[attr-defined]
            "decoder",
            rows=k,
            constants={"memory": enc["memory_out"], "src_mask": enc["src_mask_out"]},
            state={"hidden": np.repeat(enc["hidden_out"][None], k, axis=0)},
        ) as seq:
            steps = beam_steps(self.spec)
            step = next(steps)
            while True:
                out = yield seq.step({"prefix": step.prefix}, reorder=step.reorder)
                try:
                    step = steps.send(out["logprobs"])
                except StopIteration as done:
                    return done.value

    def to_record(self, result: Any) -> dict[str, Any]:
        return {"hypotheses": [{"text": t, "score": s} for t, s in result]}

    def summary(self, result: Any) -> str:
        return ", ".join(f"{t} ({s:.3f})" for t, s in result)
