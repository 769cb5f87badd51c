"""FakeAcl's `.om` models: an ONNX file run by ONNX Runtime, "compiled" the way ATC would.

A compiled model has one fixed batch (static), batch gears (dynamic batch), image-size gears
(dynamic HW, static batch) or dims gears (ATC's `--input_shape` with -1 + `--dynamic_dims`:
each gear gives a value to every dynamic dim of every input, in input order, the batch dim
included when the ONNX batch is dynamic). Dynamic models get the extra
`ascend_mbatch_shape_data` input (int64: [1] for batch, [2] for HW, [n] for n dynamic dims)
last, and report -1 for the dims that follow the gear; buffer sizes are those of the largest
gear.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from inferchain.testing.fake_acl._calls import INVALID_FILE, Fail

MBATCH_INPUT = "ascend_mbatch_shape_data"
OM_MAGIC = b"FAKEOM1\n"
ACL_INT64 = 9
_TYPES: dict[str, tuple[int, type[np.generic]]] = {  # onnxruntime type -> aclDataType, numpy
    "tensor(float)": (0, np.float32),
    "tensor(float16)": (1, np.float16),
    "tensor(int8)": (2, np.int8),
    "tensor(int32)": (3, np.int32),
    "tensor(uint8)": (4, np.uint8),
    "tensor(int16)": (6, np.int16),
    "tensor(uint16)": (7, np.uint16),
    "tensor(uint32)": (8, np.uint32),
    "tensor(int64)": (9, np.int64),
    "tensor(uint64)": (10, np.uint64),
    "tensor(double)": (11, np.float64),
    "tensor(bool)": (12, np.bool_),
}


def _gears(values: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted({int(v) for v in values}))


def _hw_gears(values: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted({(int(h), int(w)) for h, w in values}))


def _dims_gears(values: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(dict.fromkeys(tuple(int(v) for v in g) for g in values))


def _probe(
    values: Mapping[str, float] | Sequence[tuple[str, float]],
) -> tuple[tuple[str, float], ...]:
    items = values.items() if isinstance(values, Mapping) else values
    return tuple(sorted((str(k), float(v)) for k, v in items))


@attrs.frozen
class CompileOptions:
    """How ATC "compiled" a model (see the FakeAcl docstring)."""

    batch: int | None = None  # static batch (static and dynamic-HW models)
    dynamic_batch: tuple[int, ...] = attrs.field(default=(), converter=_gears)
    dynamic_hw: tuple[tuple[int, int], ...] = attrs.field(default=(), converter=_hw_gears)
    dynamic_dims: tuple[tuple[int, ...], ...] = attrs.field(default=(), converter=_dims_gears)
    # the value each named input holds in the runs that find the output dims (default 0):
    # a model that branches on an input (silero-vad's sampling rate) fails on zeros
    probe: tuple[tuple[str, float], ...] = attrs.field(default=(), converter=_probe)


@attrs.frozen
class Gear:
    """One concrete configuration: rows per execution and, for dynamic HW, (height, width)."""

    batch: int
    hw: tuple[int, int] | None = None
    dims: tuple[int, ...] | None = None  # a dims gear: the value of each dynamic dim


@attrs.frozen
class IOSpec:
    """One input or output as the model desc reports it."""

    name: str
    dims: tuple[int, ...]  # -1 where the dim follows the gear
    acl_type: int  # aclDataType
    dtype: np.dtype[Any]
    size: int  # bytes at the largest gear
    hw_axes: bool = False  # dims 2 and 3 are the dynamic H and W
    offset: int = 0  # dims gears: where this input's dynamic dims start in a gear's values

    def shape(self, gear: Gear) -> tuple[int, ...]:
        dims = list(self.dims)
        if gear.dims is not None:
            values = iter(gear.dims[self.offset :])
            return tuple(next(values) if d == -1 else d for d in dims)
        if dims and dims[0] == -1:
            dims[0] = gear.batch
        if self.hw_axes and gear.hw is not None:
            dims[2], dims[3] = gear.hw
        return tuple(dims)


def read_om(path: Path) -> tuple[Path, CompileOptions] | None:
    """The ONNX file and options a fake `.om` wrapper names; None when `path` is not one."""
    with path.open("rb") as f:
        if f.read(len(OM_MAGIC)) != OM_MAGIC:
            return None
        spec = json.loads(f.read().decode())
    onnx = Path(spec["onnx"])
    options = CompileOptions(
        batch=spec.get("batch"),
        dynamic_batch=spec.get("dynamic_batch", ()),
        dynamic_hw=spec.get("dynamic_hw", ()),
        dynamic_dims=spec.get("dynamic_dims", ()),
    )
    return (onnx if onnx.is_absolute() else path.parent / onnx), options


class CompiledModel:
    """An ONNX model with its ATC-style desc; `execute` runs one gear on the CPU."""

    def __init__(
        self, session: Any, options: CompileOptions, static_batch: int, where: str
    ) -> None:
        self._session = session
        self.where = where
        self._probe_values = dict(options.probe)
        kinds = [options.dynamic_batch, options.dynamic_hw, options.dynamic_dims]
        if sum(1 for k in kinds if k) > 1:
            raise Fail(INVALID_FILE, f"{where}: batch, HW and dims gears are exclusive")
        self.batch_gears = options.dynamic_batch
        self.hw_gears = options.dynamic_hw
        self.dims_gears = options.dynamic_dims
        self._offset = 0  # dynamic dims described so far (dims gears)
        if any(b <= 0 for b in self.batch_gears) or any(min(g) <= 0 for g in self.hw_gears):
            raise Fail(INVALID_FILE, f"{where}: gears must be positive")
        self.static_batch = self._batch_of(options.batch, static_batch)
        self._data_inputs = [self._input(a) for a in session.get_inputs()]
        if self.dims_gears:
            n = self._offset
            bad = [g for g in self.dims_gears if len(g) != n or min(g, default=1) <= 0]
            if bad:
                raise Fail(
                    INVALID_FILE,
                    f"{where}: dims gear {list(bad[0])} does not give {n} positive values "
                    "(one per dynamic dim)",
                )
            self._data_inputs = [self._sized(s) for s in self._data_inputs]
        self.inputs = list(self._data_inputs)
        if self.batch_gears or self.hw_gears or self.dims_gears:
            n = 1 if self.batch_gears else 2 if self.hw_gears else self._offset
            self.inputs.append(IOSpec(MBATCH_INPUT, (n,), ACL_INT64, np.dtype(np.int64), 8 * n))
        self._shapes: dict[Gear, list[tuple[int, ...]]] = {}
        self.outputs = self._describe_outputs()

    # -- the desc -------------------------------------------------------------------------

    def _batch_of(self, declared: int | None, default: int) -> int:
        fixed = {d[0] for d in (a.shape for a in self._session.get_inputs()) if d}
        fixed_ints = {d for d in fixed if isinstance(d, int) and d > 0}
        if len(fixed_ints) > 1:
            raise Fail(INVALID_FILE, f"{self.where}: inputs disagree on the batch: {fixed_ints}")
        if fixed_ints:
            onnx_batch = fixed_ints.pop()
            if self.batch_gears or (declared is not None and declared != onnx_batch):
                raise Fail(INVALID_FILE, f"{self.where}: the ONNX batch is fixed at {onnx_batch}")
            return onnx_batch
        return declared if declared is not None else default

    def _input(self, arg: Any) -> IOSpec:
        acl_type, dtype = _TYPES.get(arg.type, (-1, np.uint8))
        if acl_type < 0:
            raise Fail(INVALID_FILE, f"{self.where}: input {arg.name!r} has type {arg.type}")
        dims = [d if isinstance(d, int) and d > 0 else -1 for d in arg.shape]
        if self.dims_gears:
            spec = IOSpec(arg.name, tuple(dims), acl_type, np.dtype(dtype), 0, False, self._offset)
            self._offset += dims.count(-1)
            return spec  # sized by _size_inputs once every offset is known
        hw_axes = bool(self.hw_gears) and len(dims) == 4 and -1 in dims[2:]
        if hw_axes:
            dims[2] = dims[3] = -1
        if dims:
            dims[0] = -1 if self.batch_gears else self.static_batch
        rest = dims[4:] if hw_axes else dims[1:]
        if -1 in rest or (hw_axes and dims[1] == -1):
            raise Fail(
                INVALID_FILE,
                f"{self.where}: input {arg.name!r} has dynamic dims {arg.shape} that no gear fixes",
            )
        spec = IOSpec(arg.name, tuple(dims), acl_type, np.dtype(dtype), 0, hw_axes)
        size = max(math.prod(spec.shape(g)) for g in self.gears()) * spec.dtype.itemsize
        return attrs.evolve(spec, size=size)

    def _sized(self, spec: IOSpec) -> IOSpec:
        if not self.dims_gears:
            return spec
        size = max(math.prod(spec.shape(g)) for g in self.gears()) * spec.dtype.itemsize
        return attrs.evolve(spec, size=size)

    def _dims_gear(self, values: tuple[int, ...]) -> Gear:
        first = self._data_inputs[0] if self._data_inputs else None
        batch = self.static_batch
        if first is not None and first.dims and first.dims[0] == -1:
            batch = values[first.offset]
        return Gear(batch, None, values)

    def gears(self) -> list[Gear]:
        if self.dims_gears:
            return [self._dims_gear(g) for g in self.dims_gears]
        if self.batch_gears:
            return [Gear(b) for b in self.batch_gears]
        if self.hw_gears:
            return [Gear(self.static_batch, hw) for hw in self.hw_gears]
        return [Gear(self.static_batch)]

    @property
    def largest_gear(self) -> Gear:
        if self.dims_gears:
            return max(self.gears(), key=self._elements)
        return self.gears()[-1] if not self.hw_gears else max(self.gears(), key=self._area)

    def _elements(self, gear: Gear) -> int:
        return sum(math.prod(s.shape(gear)) for s in self._data_inputs)

    def dims_of(self, gear: Gear) -> list[int]:
        """A dims gear as `get_input_dynamic_dims` reports it: every data input's shape at
        the gear, concatenated in input order."""
        return [d for s in self._data_inputs for d in s.shape(gear)]

    @staticmethod
    def _area(gear: Gear) -> int:
        return gear.hw[0] * gear.hw[1] if gear.hw else 0

    def _describe_outputs(self) -> list[IOSpec]:
        """Output specs from a probe run per gear (zeros in); dims that vary become -1."""
        gears = self.gears()
        try:
            shapes = {g: [o.shape for o in self._infer(self._zeros(g))] for g in gears}
        except Exception as e:  # onnxruntime's own error types
            raise Fail(
                INVALID_FILE,
                f"{self.where}: the run that finds the output dims failed on inputs of "
                f"{self._probe_values or 'zeros'} (give input values with `probe`): {e}",
            ) from None
        self._shapes.update(shapes)
        specs = []
        for i, arg in enumerate(self._session.get_outputs()):
            acl_type, dtype = _TYPES.get(arg.type, (-1, np.uint8))
            if acl_type < 0:
                raise Fail(INVALID_FILE, f"{self.where}: output {arg.name!r} has type {arg.type}")
            per_gear = [shapes[g][i] for g in gears]
            first = per_gear[0]
            dims = tuple(-1 if any(s[k] != d for s in per_gear) else d for k, d in enumerate(first))
            size = max(math.prod(s) for s in per_gear) * np.dtype(dtype).itemsize
            name = f"{arg.name}_node:0:{arg.name}"  # ATC's "op:edge:name" for ONNX outputs
            specs.append(IOSpec(name, dims, acl_type, np.dtype(dtype), size))
        return specs

    def output_shapes(self, gear: Gear) -> list[tuple[int, ...]]:
        return self._shapes[gear]

    def _zeros(self, gear: Gear) -> list[np.ndarray]:
        values = self._probe_values
        return [np.full(s.shape(gear), values.get(s.name, 0), s.dtype) for s in self._data_inputs]

    # -- running --------------------------------------------------------------------------

    def gear_from(self, mbatch: np.ndarray) -> Gear | None:
        """The gear the `ascend_mbatch_shape_data` bytes select; None if not a gear."""
        values = tuple(int(v) for v in mbatch.view(np.int64))
        if self.dims_gears:
            return self._dims_gear(values) if values in self.dims_gears else None
        if self.batch_gears:
            return Gear(values[0]) if values[0] in self.batch_gears else None
        hw = (values[0], values[1])
        return Gear(self.static_batch, hw) if hw in self.hw_gears else None

    @property
    def data_inputs(self) -> list[IOSpec]:
        return self._data_inputs

    def execute(self, gear: Gear, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the model on `arrays` (the data inputs, shaped for `gear`)."""
        return self._infer(arrays)

    def _infer(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        feed = {s.name: a for s, a in zip(self._data_inputs, arrays, strict=True)}
        outputs: list[np.ndarray] = self._session.run(None, feed)
        return [np.ascontiguousarray(o) for o in outputs]


def compile_model(
    source: Path | bytes, options: CompileOptions | None, static_batch: int, where: str
) -> CompiledModel:
    """Read an ONNX file, ONNX bytes or a fake `.om` wrapper; 100003 when it is none of them."""
    import onnxruntime as ort  # lazily: only tests that load a fake model need it

    if isinstance(source, Path):
        if not source.is_file():
            raise Fail(INVALID_FILE, f"{where}: no such file")
        wrapped = read_om(source)
        if wrapped is not None:
            source, file_options = wrapped
            options = options or file_options
    elif source.startswith(OM_MAGIC):
        raise Fail(INVALID_FILE, f"{where}: load fake .om wrappers with load_from_file")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    try:
        model = source if isinstance(source, bytes) else str(source)
        session = ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types
        raise Fail(INVALID_FILE, f"{where}: not a model the fake can load: {e}") from None
    return CompiledModel(session, options or CompileOptions(), static_batch, where)
