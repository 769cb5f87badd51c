"""The OpenVINO sides of the recipe benchmarks: a recipe on `backend: openvino` at f32 (and at
bf16 where the CPU runs it and the recipe states a tolerance for it), and the raw-model
ceiling of each CPU runtime (the model alone on pre-processed tensors, bare sessions)."""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

import inferchain as ic
from inferchain.config import ModelConfig

AVAILABLE = importlib.util.find_spec("openvino") is not None


def capabilities() -> tuple[str, ...]:
    """What OpenVINO's CPU plugin runs here (FP32, BF16, FP16, ...); () without openvino."""
    if not AVAILABLE:
        return ()
    import openvino as ov

    return tuple(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def precisions(recipe: ic.Recipe) -> tuple[list[str], str]:
    """The precisions the OpenVINO side runs at here, and why bf16 is not among them."""
    if not AVAILABLE:
        return [], "openvino is not installed (pip install 'inferchain[openvino]')"
    if "BF16" not in capabilities():
        return ["f32"], "bf16: this CPU has no bf16 (no AVX512_BF16 or AMX)"
    if any(m.reference is None for m in recipe.models):
        return ["f32"], "bf16: the recipe states no reference inputs and tolerance for it"
    return ["f32", "bf16"], ""


def openvino_recipes(
    path: Path, stack: contextlib.ExitStack, wanted: Sequence[str]
) -> dict[str, ic.OfflineInference]:
    """An initialised OfflineInference of the recipe on openvino per precision (a lower one
    passes the recipe's own precision check at init, or the benchmark stops there)."""
    out = {}
    for p in wanted:
        names = [m.name for m in ic.load_recipe(path).models]
        recipe = ic.load_recipe(
            path, backend="openvino", models={n: {"precision": p} for n in names}
        )
        out[p] = stack.enter_context(ic.OfflineInference(recipe))
    return out


def raw_ceiling(
    model: ModelConfig, tensors: np.ndarray, batch: int, wanted: Sequence[str]
) -> dict[str, Callable[[], float]]:
    """Per runtime, a side that runs `tensors` in batches of `batch` on two bare one-thread
    sessions (one per core, each on its own thread, half the batches each): seconds."""
    batches = [tensors[i : i + batch] for i in range(0, len(tensors), batch)]
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    runs: dict[str, list[Callable[[np.ndarray], Any]]] = {
        "onnxruntime": [
            _ort_run(ort.InferenceSession(model.path, so, providers=["CPUExecutionProvider"]))
            for _ in range(2)
        ]
    }
    if wanted:
        import openvino as ov

        core = ov.Core()
        for p in wanted:
            props = {
                "INFERENCE_PRECISION_HINT": p,
                "INFERENCE_NUM_THREADS": 1,
                "NUM_STREAMS": 1,
                "ENABLE_CPU_PINNING": False,
            }
            requests = [core.compile_model(model.path, "CPU", props).create_infer_request()]
            requests.append(core.compile_model(model.path, "CPU", props).create_infer_request())
            runs[f"openvino_{p}"] = [_ov_run(r) for r in requests]
    return {name: _two_lanes(pair, batches) for name, pair in runs.items()}


def _ort_run(session: ort.InferenceSession) -> Callable[[np.ndarray], Any]:
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})


def _ov_run(request: Any) -> Callable[[np.ndarray], Any]:
    return lambda x: request.infer({0: x}, share_inputs=True)


def _two_lanes(
    pair: list[Callable[[np.ndarray], Any]], batches: list[np.ndarray]
) -> Callable[[], float]:
    def lane(run: Callable[[np.ndarray], Any], mine: list[np.ndarray]) -> None:
        for x in mine:
            run(x)

    def side() -> float:
        threads = [
            threading.Thread(target=lane, args=(run, batches[k::2])) for k, run in enumerate(pair)
        ]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - started

    return side
