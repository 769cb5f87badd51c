"""ONNX Runtime backend: CPU by default; CUDA and Ascend CANN through execution providers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from inferchain.backends.base import Backend, Session
from inferchain.backends.padding import FixedBatch
from inferchain.backends.probe import unknown_provider
from inferchain.config import ModelConfig, Recipe, SessionOptions
from inferchain.errors import BackendError, ConfigError, LoadError
from inferchain.layout import Layout
from inferchain.logs import get_logger
from inferchain.tensors import TensorDesc

log = get_logger(__name__)

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}
_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session_options(options: SessionOptions) -> ort.SessionOptions:
    """`ort.SessionOptions` from the recipe's `session_options`."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = options.intra_op_num_threads
    so.inter_op_num_threads = options.inter_op_num_threads
    so.graph_optimization_level = _LEVELS[options.graph_optimization_level]
    so.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL
        if options.execution_mode == "parallel"
        else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    if options.log_severity_level is not None:  # else the process default (set_log_level)
        so.log_severity_level = options.log_severity_level
    if not options.allow_spinning:  # idle intra-op threads sleep instead of spinning
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


#: `inferchain --log-level` -> onnxruntime's severity (0 verbose, 1 info, 2 warning, 3 error)
SEVERITIES = {"debug": 0, "info": 1, "warning": 2, "error": 3}


def set_log_level(level: str) -> None:
    """onnxruntime's own log (its C++ warnings, e.g. `VerifyOutputSizes`) at `level` and up
    (a `--log-level` name), for the sessions made after: for applications, as
    `inferchain.backends.factory.set_runtime_log_level` calls it; a recipe's
    `session_options: {log_severity_level: N}` overrides it per session."""
    ort.set_default_logger_severity(SEVERITIES[level.lower()])


def providers(
    requested: Sequence[str | Mapping[str, Any]],
    available: Sequence[str],
    known: Sequence[str] = (),
    where: str = "",
) -> tuple[list[str], list[dict[str, Any]]]:
    """The recipe's providers that this onnxruntime build has, with their options.

    A name onnxruntime does not know at all (`known`: `ort.get_all_providers()`) is a
    ConfigError naming the key (after `where`, e.g. the recipe file) and the closest name.
    A known provider that this build lacks is dropped with a warning; CPU is always last,
    so a recipe written for CUDA or CANN still runs (slowly) on a machine without them.
    """
    names: list[str] = []
    opts: list[dict[str, Any]] = []
    for i, entry in enumerate(requested):
        options: Mapping[str, Any]
        if isinstance(entry, str):
            name, options = entry, {}
        else:
            if len(entry) != 1:
                raise ConfigError(f"provider entry {dict(entry)!r} must be {{Name: {{options}}}}")
            ((name, options),) = entry.items()
            options = options or {}
        wrong = unknown_provider(name, known)
        if wrong is not None:
            raise ConfigError(f"{where}key 'providers[{i}]': {wrong}")
        if name not in available:
            log.warning("provider_unavailable", provider=name, available=list(available))
            continue
        names.append(name)
        opts.append({k: str(v) for k, v in options.items()})
    if "CPUExecutionProvider" not in names:
        names.append("CPUExecutionProvider")
        opts.append({})
    return names, opts


def describe(args: Sequence[Any]) -> tuple[TensorDesc, ...]:
    """TensorDescs from `session.get_inputs()` / `get_outputs()`."""
    descs = []
    for a in args:
        shape = [d if isinstance(d, int) else None for d in a.shape]
        descs.append(TensorDesc(a.name, shape, _ORT_TYPES.get(a.type, np.float32)))
    return tuple(descs)


class OnnxRuntimeSession(Session):
    """One `ort.InferenceSession`; `run` feeds the batch in the model's input order and
    layout (each input's rows on its batch axis, an unbatched input's one value)."""

    def __init__(self, session: ort.InferenceSession, model: ModelConfig) -> None:
        self._session = session
        self.inputs = describe(session.get_inputs())
        self.outputs = describe(session.get_outputs())
        self._input_names = [t.name for t in self.inputs]
        self._output_names = [t.name for t in self.outputs]
        layout = Layout.of(model, self.inputs, self.outputs)
        # a model that does not batch takes its inputs whole: no limit, nothing padded
        batching = model.max_batch_size > 0
        self.max_batch_size = layout.batch_limit(self.inputs) if batching else None
        self.reuses_outputs = False  # every run returns new arrays
        self.metadata: dict[str, str] = dict(session.get_modelmeta().custom_metadata_map)
        self._fixed = FixedBatch(model.pads_to(self.max_batch_size), layout.inputs)
        so = session.get_session_options()
        self.settings = {
            "threads": str(so.intra_op_num_threads or "default"),
            "providers": ", ".join(session.get_providers()),
        }

    def run(self, inputs: Sequence[np.ndarray], batch_size: int) -> list[np.ndarray]:
        fixed = self._fixed
        if fixed.limit is not None and batch_size < fixed.limit:  # a fixed batch: padded
            inputs = fixed.pad(inputs, batch_size)
        feed = dict(zip(self._input_names, inputs, strict=True))
        try:
            return self._session.run(self._output_names, feed)  # type: ignore[no-any-return]
        except Exception as e:  # onnxruntime raises its own Fail/InvalidArgument types
            raise BackendError(f"onnxruntime: {e}", name=type(e).__name__) from e

    def padded_rows(self, rows: int) -> int:
        """A model with a fixed batch (or a deterministic one) runs it whole."""
        return self._fixed.padded_rows(rows)

    def close(self) -> None:
        self._session = None


class OnnxRuntimeBackend(Backend):
    """Builds one InferenceSession per worker with the recipe's providers and options."""

    name = "onnxruntime"
    thread_affine = False  # an InferenceSession may run on any thread (one at a time here)

    def __init__(self, recipe: Recipe) -> None:
        self._recipe = recipe
        self._providers, self._provider_options = providers(
            recipe.providers,
            ort.get_available_providers(),
            ort.get_all_providers(),
            f"{recipe.source}: ",
        )

    def load(self, model: ModelConfig, device: int) -> Session:
        if model.precision != "f32":
            raise ConfigError(
                f"{self._recipe.source}: model {model.name!r} key 'precision': onnxruntime runs "
                f"a model in the types its file declares, not at {model.precision} (backend "
                "openvino runs bf16 and f16 where the CPU has them; or convert the file and "
                "check it with `inferchain compare`)"
            )
        options = model.session_options or self._recipe.session_options
        try:
            session = ort.InferenceSession(
                model.path,
                sess_options=session_options(options),
                providers=self._providers,
                provider_options=self._provider_options,
            )
        except Exception as e:
            raise LoadError(
                f"onnxruntime could not load model {model.name!r} from {model.path}: {e}",
                name=type(e).__name__,
            ) from e
        return OnnxRuntimeSession(session, model)
