"""The ceiling of a recipe: the best any schedule of its own work could do on this machine.

Each recipe benchmark times, in the same rounds as the recipe, the recipe's own work stage
by stage on one thread, with no framework: the model at full batch on a bare one-thread
session, the host stages (decode, pre-processing) as plain calls. Each is one core's seconds
of that stage: the least CPU time any schedule spends on it. Spread perfectly over the
machine's cores, with no core ever idle, the job cannot end sooner than the sum of its
stages over the number of cores (`cpu_bound`). A recurrent job has a second bound: the
longest sequence's steps one after the other at batch 1 (`max`). A recipe's fraction of its
ceiling is ceiling seconds / recipe seconds, per round, the median of the rounds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def bare_session(path: str, threads: int = 1) -> ort.InferenceSession:
    """A CPU session of `threads` intra-op threads that do not spin."""
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def model_seconds(
    session: ort.InferenceSession, feeds: Sequence[dict[str, np.ndarray]]
) -> Callable[[], float]:
    """A side: `feeds` one after the other on a bare one-thread `session`; its seconds."""

    def run() -> float:
        started = time.perf_counter()
        for feed in feeds:
            session.run(None, feed)
        return time.perf_counter() - started

    return run


def host_seconds(fn: Callable[[Any], Any], items: Sequence[Any]) -> Callable[[], float]:
    """A side: `fn` over `items` on this thread; its seconds."""

    def run() -> float:
        started = time.perf_counter()
        for item in items:
            fn(item)
        return time.perf_counter() - started

    return run


def cpu_bound(stages: Sequence[Sequence[float]], ncores: int) -> list[float]:
    """Per round, the sum of the stages' one-core seconds spread over `ncores` cores."""
    return [sum(round_) / ncores for round_ in zip(*stages, strict=True)]


def fraction(ceiling_s: Sequence[float], side_s: Sequence[float]) -> float:
    """The median over rounds of ceiling seconds / the side's seconds."""
    pairs = sorted(c / s for c, s in zip(ceiling_s, side_s, strict=True))
    mid = len(pairs) // 2
    return pairs[mid] if len(pairs) % 2 else (pairs[mid - 1] + pairs[mid]) / 2
