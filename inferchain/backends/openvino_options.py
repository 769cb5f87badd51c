"""The recipe's session options and a model's precision as OpenVINO CPU properties: what
the openvino backend compiles with, and what `inferchain doctor` shows, without importing
OpenVINO."""

from __future__ import annotations

from typing import Any

from inferchain.config import SessionOptions
from inferchain.errors import ConfigError

#: recipe `precision:` -> OpenVINO's element type name (`INFERENCE_PRECISION_HINT`)
PRECISIONS = {"f32": "f32", "bf16": "bf16", "f16": "f16"}
#: what the CPU plugin must list in OPTIMIZATION_CAPABILITIES to run a precision
CAPABILITIES = {"f32": "FP32", "bf16": "BF16", "f16": "FP16"}
#: session_options' `log_severity_level` (0 verbose .. 4 fatal) -> OpenVINO's LOG_LEVEL
LOG_LEVELS = {0: "LOG_DEBUG", 1: "LOG_INFO", 2: "LOG_WARNING", 3: "LOG_ERROR", 4: "LOG_NONE"}


def properties(options: SessionOptions, precision: str, where: str) -> dict[str, Any]:
    """OpenVINO CPU properties for the recipe's session options and a model's precision.

    intra-op threads -> INFERENCE_NUM_THREADS (0: the plugin's default, every core);
    log_severity_level -> LOG_LEVEL. One stream, no thread pinning (sessions of several
    models and instances share the cores as the OS places them, as onnxruntime's do).
    An option with no OpenVINO meaning is a ConfigError naming its key (after `where`).
    """
    props: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": PRECISIONS[precision],
        "NUM_STREAMS": 1,
        "ENABLE_CPU_PINNING": False,
    }
    if options.intra_op_num_threads:
        props["INFERENCE_NUM_THREADS"] = options.intra_op_num_threads
    refused = {
        "inter_op_num_threads": (
            options.inter_op_num_threads > 1,
            "OpenVINO runs one operator at a time per stream (0 or 1 mean that)",
        ),
        "execution_mode": (
            options.execution_mode != "sequential",
            "OpenVINO has no parallel execution of operators (sequential only)",
        ),
        "graph_optimization_level": (
            options.graph_optimization_level != "all",
            "OpenVINO always optimizes the whole graph (all only)",
        ),
        "allow_spinning": (
            not options.allow_spinning and options.intra_op_num_threads != 1,
            "OpenVINO's threads cannot be told not to spin (false needs intra_op_num_threads: 1, "
            "where no thread waits)",
        ),
    }
    for key, (bad, why) in refused.items():
        if bad:
            value = getattr(options, key)
            raise ConfigError(
                f"{where}key 'session_options.{key}': {value!r} has no OpenVINO equivalent: {why}"
            )
    if options.log_severity_level is not None:
        props["LOG_LEVEL"] = LOG_LEVELS[options.log_severity_level]
    return props
