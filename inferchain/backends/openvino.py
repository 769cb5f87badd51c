"""OpenVINO backend: a second CPU runtime for the same ONNX files, faster on some CPUs, and
the one that runs bf16 or f16 where the CPU has them (`precision:`, checked against f32).

Each session is one model compiled for the CPU with one stream and one infer request. The
recipe's `session_options` become OpenVINO properties where they mean the same thing
(`properties`), and are refused where they do not. OpenVINO's own precision hint (bf16 on CPUs
with AMX) is overridden: a model runs at f32 unless its recipe asks for less.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import openvino as ov

from inferchain.backends.base import Backend, Session
from inferchain.backends.openvino_options import PRECISIONS, properties
from inferchain.backends.padding import FixedBatch
from inferchain.config import ModelConfig, Recipe
from inferchain.errors import BackendError, ConfigError, LoadError
from inferchain.layout import Layout
from inferchain.precision import check_feed, check_precision, run_rows
from inferchain.tensors import TensorDesc

DEVICE = "CPU"


def one_line(error: BaseException) -> str:
    """OpenVINO's many-line exception text as one line: its summary, or its last line."""
    text = str(error)
    if "Summary:" in text:
        text = text.rsplit("Summary:", 1)[1]
    else:
        text = next((ln for ln in reversed(text.splitlines()) if ln.strip()), text)
    return " ".join(text.replace("--", " ").split())


def describe(ports: Sequence[Any]) -> tuple[TensorDesc, ...]:
    """TensorDescs of a model's inputs or outputs (dynamic dims None)."""
    descs = []
    for port in ports:
        shape = [d.get_length() if d.is_static else None for d in port.get_partial_shape()]
        descs.append(TensorDesc(port.get_any_name(), shape, port.get_element_type().to_dtype()))
    return tuple(descs)


def metadata(model: ov.Model) -> dict[str, str]:
    """The ONNX file's custom metadata (`metadata_props`), which OpenVINO keeps in the
    model's `framework` runtime info."""
    info = model.get_rt_info()
    if "framework" not in info:
        return {}
    return {str(k): model.get_rt_info(["framework", k]).astype(str) for k in info["framework"]}


class OpenVinoSession(Session):
    """One compiled model and its infer request; `run` feeds the batch by input position
    (shared, not copied) and returns new arrays."""

    def __init__(self, compiled: ov.CompiledModel, model: ModelConfig, info: dict[str, str]):
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self.inputs = describe(compiled.inputs)
        self.outputs = describe(compiled.outputs)
        layout = Layout.of(model, self.inputs, self.outputs)
        batching = model.max_batch_size > 0  # else inputs go whole: no limit, nothing padded
        self.max_batch_size = layout.batch_limit(self.inputs) if batching else None
        self.reuses_outputs = False  # share_outputs=False: every run returns new arrays
        self.metadata = info
        self.settings = {
            "threads": str(compiled.get_property("INFERENCE_NUM_THREADS")),
            "streams": str(compiled.get_property("NUM_STREAMS")),
            "precision": compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name(),
        }
        self._fixed = FixedBatch(model.pads_to(self.max_batch_size), layout.inputs)

    def run(self, inputs: Sequence[np.ndarray], batch_size: int) -> list[np.ndarray]:
        inputs = self._fixed.pad(inputs, batch_size)
        # shared, not copied; OpenVINO shares only writeable arrays (not a broadcast value)
        feed = {i: a if a.flags.writeable else np.array(a) for i, a in enumerate(inputs)}
        try:
            result = self._request.infer(feed, share_inputs=True)
        except Exception as e:  # OpenVINO raises RuntimeError with a many-line text
            raise BackendError(f"openvino: {one_line(e)}", name=type(e).__name__) from e
        return list(result.to_tuple())

    def padded_rows(self, rows: int) -> int:
        """A model with a fixed batch (or a deterministic one) runs it whole."""
        return self._fixed.padded_rows(rows)

    def close(self) -> None:
        self._request = None
        self._compiled = None


class OpenVinoBackend(Backend):
    """Compiles one model per worker on the CPU; a lower precision is checked once per
    model against f32 (`check` False: not checked, for `inferchain compare`, which reports
    the same measures instead)."""

    name = "openvino"
    thread_affine = False  # a compiled model's infer request may run on any thread

    def __init__(self, recipe: Recipe, *, check: bool = True) -> None:
        self._recipe = recipe
        self._core = ov.Core()
        self._check = check
        self._lock = threading.Lock()  # one precision check at a time
        self._checked: set[str] = set()  # models whose precision passed

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What the CPU plugin can run here (OPTIMIZATION_CAPABILITIES: FP32, BF16, ...)."""
        return tuple(self._core.get_property(DEVICE, "OPTIMIZATION_CAPABILITIES"))

    def load(self, model: ModelConfig, device: int) -> Session:
        where = f"{self._recipe.source}: model {model.name!r} "
        options = model.session_options or self._recipe.session_options
        props = properties(options, model.precision, where)
        read = self._read(model)
        session = self._compile(model, read, props)
        try:
            self._verify(model, read, props, session, where)
        except BaseException:
            session.close()
            raise
        return session

    def _verify(
        self, model: ModelConfig, read: ov.Model, props: dict[str, Any], low: Session, where: str
    ) -> None:
        """The compiled model runs at the precision asked (OpenVINO falls back to f32 where
        the CPU cannot), and a lower one passed its check (once per model)."""
        ran = low.settings["precision"]
        if ran != PRECISIONS[model.precision]:
            raise ConfigError(
                f"{where}key 'precision': {model.precision} asked, but OpenVINO runs the model "
                f"at {ran} on this CPU (it can: {', '.join(self.capabilities)}; bf16 needs "
                "AVX512_BF16 or AMX, f16 AVX512_FP16)"
            )
        if model.precision == "f32" or not self._check:
            return
        with self._lock:
            if model.name not in self._checked:
                self._check_precision(model, read, props, low, where)
                self._checked.add(model.name)

    def _read(self, model: ModelConfig) -> ov.Model:
        try:
            return self._core.read_model(model.path)
        except Exception as e:
            raise LoadError(
                f"openvino could not read model {model.name!r} from {model.path}: {one_line(e)} "
                "(a recipe names a file OpenVINO reads with `paths: {openvino: FILE}`)",
                name=type(e).__name__,
            ) from e

    def _compile(self, model: ModelConfig, read: ov.Model, props: dict[str, Any]) -> Session:
        try:
            compiled = self._core.compile_model(read, DEVICE, props)
        except Exception as e:
            raise LoadError(
                f"openvino could not compile model {model.name!r} ({model.path}): {one_line(e)}",
                name=type(e).__name__,
            ) from e
        return OpenVinoSession(compiled, model, metadata(read))

    def _check_precision(
        self, model: ModelConfig, read: ov.Model, props: dict[str, Any], low: Session, where: str
    ) -> None:
        """Run the check inputs at f32 and at the model's precision; ConfigError beyond its
        tolerance (`inferchain.precision.check_precision`)."""
        f32 = self._compile(model, read, {**props, "INFERENCE_PRECISION_HINT": "f32"})
        try:
            feed, rows = check_feed(model, f32, where.rstrip())
            want = run_rows(f32, model, feed, rows)
        finally:
            f32.close()
        got = run_rows(low, model, feed, rows)
        check_precision(model, [t.name for t in low.outputs], want, got, where.rstrip())
