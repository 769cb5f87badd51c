"""inferchain as a library: silent below WARNING unless the application configured logging."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from inferchain.testing.onnx_models import write_mlp64

SCRIPT = """\
import logging, sys
import numpy as np
import inferchain as ic
{setup}
recipe = ic.Recipe.from_dict({{"name": "quiet", "models": [{{"name": "m", "path": sys.argv[1],
    "max_batch_size": 4}}], "providers": ["RknpuExecutionProvider", "CPUExecutionProvider"]}})
with ic.OfflineInference(recipe) as oi:
    oi.infer("m", np.zeros(64, np.float32))
"""


def run_script(model: Path, setup: str = "") -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(setup=setup)
    return subprocess.run(
        [sys.executable, "-c", code, str(model)], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mlp64(tmp_path_factory.mktemp("m") / "mlp64.onnx")


def test_unconfigured_library_shows_warnings_only(model: Path) -> None:
    done = run_script(model)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "provider_unavailable" in done.stderr  # a warning still reaches stderr
    for quiet in ("initialized", "worker_ready", "closed"):
        assert quiet not in done.stderr


def test_the_applications_stdlib_logging_decides(model: Path) -> None:
    done = run_script(model, "logging.basicConfig(level=logging.DEBUG)")
    assert "initialized" in done.stderr and "worker_ready" in done.stderr


def test_the_applications_structlog_configuration_decides(model: Path) -> None:
    setup = (
        "import structlog\n"
        "structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))"
    )
    done = run_script(model, setup)
    assert "initialized" in done.stderr and "worker_ready" in done.stderr
