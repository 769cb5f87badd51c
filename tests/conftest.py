"""Shared fixtures: tiny real ONNX models, recipe builders, a faulty backend around ONNX Runtime,
thread-leak checks. Builders of the core's records (Works, batchers, schedulers) are in
`inferchain.testing.builders`."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, settings

import inferchain as ic
from inferchain.backends.onnxruntime import OnnxRuntimeBackend
from inferchain.cli import main
from inferchain.config import Recipe
from inferchain.testing.faults import FaultyBackend
from inferchain.testing.onnx_models import write_accumulator, write_mlp, write_mlp64

# The application configures logging, not the library: tests log warnings and up to stderr.
structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
)

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def mlp_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer MLP, x: float32[N, 64] -> y: float32[N, 10]."""
    return write_mlp64(tmp_path_factory.mktemp("models") / "mlp64.onnx")


@pytest.fixture(scope="session")
def two_io_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two inputs (x float32[N, 4], scale float32[N, 1]) -> (logits [N, 3], hidden [N, 8])."""
    return write_mlp(tmp_path_factory.mktemp("models") / "mlp2.onnx")


def recipe(*models: dict[str, Any], **top: Any) -> Recipe:
    """A Recipe from model dicts, with one intra-op thread by default (2-core machines)."""
    data: dict[str, Any] = {
        "name": "test",
        "session_options": {"intra_op_num_threads": 1},
        "models": list(models),
    }
    data.update(top)
    return Recipe.from_dict(data)


def mlp_recipe(path: Path, **model: Any) -> Recipe:
    """The 64-wide MLP as model "m" (batches of 4) without warm-up, so that run numbers
    count real batches only (`model` overrides its keys)."""
    return recipe({"name": "m", "path": str(path), "max_batch_size": 4, "warmup": False, **model})


def faulty(r: Recipe, **faults: Any) -> tuple[ic.OfflineInference, FaultyBackend]:
    """An OfflineInference of `r` on ONNX Runtime behind a `FaultyBackend(**faults)`."""
    backend = FaultyBackend(OnnxRuntimeBackend(r), **faults)
    return ic.OfflineInference(r, backend=backend), backend


ACC_WIDTH = 4  # the accumulator's: total = x + state, carried as stateN -> state


@pytest.fixture(scope="session")
def acc_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stateful accumulator model of the sequence tests."""
    return write_accumulator(tmp_path_factory.mktemp("acc") / "acc.onnx", width=ACC_WIDTH)


def acc_recipe(path: Path, **model: Any) -> Recipe:
    """A recipe of the accumulator as a stateful model (`model` overrides its keys)."""
    return recipe(
        {
            "name": "acc",
            "path": str(path),
            "max_batch_size": 8,
            "state": {"stateN": "state"},
            "max_sequences": 4,
            "warmup": False,
            **model,
        }
    )


@pytest.fixture
def make_recipe() -> Callable[..., Recipe]:
    return recipe


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """True once `condition()` holds, False if it did not within `timeout` seconds: for a
    state that no event announces (a request admitted by the engine's loop)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.001)
    return True


def inferchain_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("inferchain-")]


@pytest.fixture
def cli() -> Iterator[Callable[..., int]]:
    """`inferchain ARGS...`, with the test suite's logging set up again afterwards."""
    saved = structlog.get_config()
    yield lambda *argv: main([str(a) for a in argv])
    structlog.configure(**saved)


@pytest.fixture
def no_thread_leak() -> Iterator[None]:
    """Fails the test if an inferchain thread is alive after it."""
    yield
    alive = inferchain_threads()
    assert not alive, f"threads left behind: {[t.name for t in alive]}"
