"""Tiny ONNX models written by hand (no `onnx` package) so backend tests run in milliseconds.

ONNX files are protobuf messages; the few fields these builders need are encoded below
directly (field numbers from `onnx/onnx.proto`). Every builder writes a file and returns its
path; compare against plain onnxruntime on the same file to get the expected outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

_OPSET = 13
_IR_VERSION = 8
_ELEM_TYPES = {  # numpy dtype -> onnx TensorProto.DataType
    np.dtype(np.float32): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.int8): 3,
    np.dtype(np.int32): 6,
    np.dtype(np.int64): 7,
    np.dtype(np.bool_): 9,
    np.dtype(np.float16): 10,
    np.dtype(np.float64): 11,
}
_ATTR_INTS = 7  # AttributeProto.AttributeType.INTS
_ATTR_INT = 2  # AttributeProto.AttributeType.INT

Dim = int | str | None  # int: fixed, str: named symbolic dim, None: anonymous dynamic dim


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 two's complement, as protobuf encodes negative varints
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _len(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _str(field: int, text: str) -> bytes:
    return _len(field, text.encode())


def _tensor(name: str, array: np.ndarray) -> bytes:
    """TensorProto: dims=1, data_type=2, name=8, raw_data=9 (little-endian)."""
    body = b"".join(_int(1, d) for d in array.shape)
    body += _int(2, _ELEM_TYPES[array.dtype]) + _str(8, name)
    return body + _len(
        9, np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
    )


def _value_info(name: str, dtype: np.dtype[np.generic], shape: Sequence[Dim]) -> bytes:
    """ValueInfoProto{name=1, type=2: TypeProto{tensor_type=1: {elem_type=1, shape=2}}}."""
    dims = b""
    for d in shape:
        if isinstance(d, int):
            dims += _len(1, _int(1, d))  # Dimension.dim_value
        else:
            dims += _len(1, _str(2, d) if d else b"")  # Dimension.dim_param / unknown
    tensor_type = _int(1, _ELEM_TYPES[dtype]) + _len(2, dims)
    return _str(1, name) + _len(2, _len(1, tensor_type))


def _attr_ints(name: str, values: Sequence[int]) -> bytes:
    return _str(1, name) + b"".join(_int(8, v) for v in values) + _int(20, _ATTR_INTS)


def _attr_int(name: str, value: int) -> bytes:
    return _str(1, name) + _int(3, value) + _int(20, _ATTR_INT)


def _node(op: str, inputs: Sequence[str], outputs: Sequence[str], *attrs: bytes) -> bytes:
    """NodeProto: input=1, output=2, name=3, op_type=4, attribute=5."""
    body = b"".join(_str(1, i) for i in inputs) + b"".join(_str(2, o) for o in outputs)
    body += _str(3, f"{op}_{outputs[0]}") + _str(4, op)
    return body + b"".join(_len(5, a) for a in attrs)


def _model(
    nodes: Sequence[bytes],
    initializers: Sequence[bytes],
    inputs: Sequence[bytes],
    outputs: Sequence[bytes],
    name: str,
) -> bytes:
    """ModelProto{ir_version=1, producer_name=2, graph=7, opset_import=8}."""
    graph = b"".join(_len(1, n) for n in nodes) + _str(2, name)
    graph += b"".join(_len(5, t) for t in initializers)
    graph += b"".join(_len(11, v) for v in inputs) + b"".join(_len(12, v) for v in outputs)
    opset = _str(1, "") + _int(2, _OPSET)
    return _int(1, _IR_VERSION) + _str(2, "inferchain.testing") + _len(7, graph) + _len(8, opset)


def write_mlp(
    path: str | Path,
    *,
    features: int = 4,
    hidden: int = 8,
    classes: int = 3,
    batch: int | None = None,
    seed: int = 0,
) -> Path:
    """A two-input, two-output MLP; `batch=None` makes the batch dimension dynamic ("N").

    Inputs: ``x`` float32 [N, features], ``scale`` float32 [N, 1].
    Outputs: ``logits`` = (relu(x @ W1 + b1) @ W2 + b2) * scale, float32 [N, classes];
    ``hidden`` = relu(x @ W1 + b1), float32 [N, hidden].
    """
    rng = np.random.default_rng(seed)
    f32 = np.dtype(np.float32)
    weights = {
        "W1": rng.standard_normal((features, hidden)).astype(f32),
        "b1": rng.standard_normal(hidden).astype(f32),
        "W2": rng.standard_normal((hidden, classes)).astype(f32),
        "b2": rng.standard_normal(classes).astype(f32),
    }
    n: Dim = batch if batch is not None else "N"
    nodes = [
        _node("MatMul", ["x", "W1"], ["h0"]),
        _node("Add", ["h0", "b1"], ["h1"]),
        _node("Relu", ["h1"], ["hidden"]),
        _node("MatMul", ["hidden", "W2"], ["l0"]),
        _node("Add", ["l0", "b2"], ["l1"]),
        _node("Mul", ["l1", "scale"], ["logits"]),
    ]
    data = _model(
        nodes,
        [_tensor(k, v) for k, v in weights.items()],
        [_value_info("x", f32, [n, features]), _value_info("scale", f32, [n, 1])],
        [_value_info("logits", f32, [n, classes]), _value_info("hidden", f32, [n, hidden])],
        "mlp",
    )
    out = Path(path)
    out.write_bytes(data)
    return out


def write_image_model(path: str | Path, *, channels: int = 3, batch: int | None = None) -> Path:
    """An NCHW model with dynamic H and W, for dynamic image-size (HW gear) tests.

    Input ``image`` float32 [N, C, H, W]. Outputs: ``scaled`` = image * 2 + 1, float32
    [N, C, H, W] (follows H and W) and ``mean`` = mean of ``scaled`` over H, W, float32 [N, C].
    """
    f32 = np.dtype(np.float32)
    n: Dim = batch if batch is not None else "N"
    nodes = [
        _node("Mul", ["image", "two"], ["doubled"]),
        _node("Add", ["doubled", "one"], ["scaled"]),
        _node(
            "ReduceMean", ["scaled"], ["mean"], _attr_ints("axes", [2, 3]), _attr_int("keepdims", 0)
        ),
    ]
    data = _model(
        nodes,
        [_tensor("two", np.array(2.0, f32)), _tensor("one", np.array(1.0, f32))],
        [_value_info("image", f32, [n, channels, "H", "W"])],
        [
            _value_info("scaled", f32, [n, channels, "H", "W"]),
            _value_info("mean", f32, [n, channels]),
        ],
        "image",
    )
    out = Path(path)
    out.write_bytes(data)
    return out


def write_accumulator(path: str | Path, *, width: int = 4, tagged: bool = False) -> Path:
    """A stateful model for sequence tests: its state is the running sum of its inputs.

    Inputs ``x`` and ``state`` float32 [N, width]. Outputs ``total`` = x + state and
    ``stateN`` (the same values, carried to the next step as ``state``). With `tagged`, one
    more input ``tag`` float32 [N, L] of a dynamic width, passed through as ``tag_out``.
    """
    f32 = np.dtype(np.float32)
    nodes = [_node("Add", ["x", "state"], ["total"]), _node("Identity", ["total"], ["stateN"])]
    inputs = [_value_info("x", f32, ["N", width]), _value_info("state", f32, ["N", width])]
    outputs = [_value_info("total", f32, ["N", width]), _value_info("stateN", f32, ["N", width])]
    if tagged:
        nodes.append(_node("Identity", ["tag"], ["tag_out"]))
        inputs.append(_value_info("tag", f32, ["N", "L"]))
        outputs.append(_value_info("tag_out", f32, ["N", "L"]))
    data = _model(nodes, [], inputs, outputs, "accumulator")
    out = Path(path)
    out.write_bytes(data)
    return out


def write_attending(path: str | Path, *, width: int = 16) -> Path:
    """A decoder-like step for tests of inputs constant over a sequence: the running sum of
    its inputs plus the sum of a memory of a dynamic length, which zero padding leaves as
    it is (like an attention masked over the padding).

    Inputs ``x`` float32 [N, width], ``memory`` float32 [N, L, width] (L dynamic),
    ``state`` float32 [N, width]. Outputs ``total`` = x + state + memory summed over L, and
    ``stateN`` (the same values, carried to the next step as ``state``).
    """
    f32 = np.dtype(np.float32)
    nodes = [
        _node("ReduceSum", ["memory", "axes"], ["summed"], _attr_int("keepdims", 0)),
        _node("Add", ["x", "state"], ["partial"]),
        _node("Add", ["partial", "summed"], ["total"]),
        _node("Identity", ["total"], ["stateN"]),
    ]
    inputs = [
        _value_info("x", f32, ["N", width]),
        _value_info("memory", f32, ["N", "L", width]),
        _value_info("state", f32, ["N", width]),
    ]
    outputs = [_value_info("total", f32, ["N", width]), _value_info("stateN", f32, ["N", width])]
    axes = _tensor("axes", np.array([1], dtype=np.int64))
    data = _model(nodes, [axes], inputs, outputs, "attending")
    out = Path(path)
    out.write_bytes(data)
    return out


def write_mlp64(
    path: str | Path,
    *,
    in_features: int = 64,
    hidden: int = 32,
    out_features: int = 10,
    batch: int | None = None,
    seed: int = 0,
) -> Path:
    """The benchmarks' tiny model: a 2-layer MLP, ``x`` float32 [N, 64] -> ``y`` [N, 10]."""
    rng = np.random.default_rng(seed)
    f32 = np.dtype(np.float32)
    weights = {
        "W1": (rng.standard_normal((in_features, hidden)) / np.sqrt(in_features)).astype(f32),
        "b1": (rng.standard_normal(hidden) * 0.1).astype(f32),
        "W2": (rng.standard_normal((hidden, out_features)) / np.sqrt(hidden)).astype(f32),
        "b2": (rng.standard_normal(out_features) * 0.1).astype(f32),
    }
    n: Dim = batch if batch is not None else "N"
    nodes = [
        _node("MatMul", ["x", "W1"], ["h0"]),
        _node("Add", ["h0", "b1"], ["h1"]),
        _node("Relu", ["h1"], ["h"]),
        _node("MatMul", ["h", "W2"], ["y0"]),
        _node("Add", ["y0", "b2"], ["y"]),
    ]
    data = _model(
        nodes,
        [_tensor(k, v) for k, v in weights.items()],
        [_value_info("x", f32, [n, in_features])],
        [_value_info("y", f32, [n, out_features])],
        "mlp64",
    )
    out = Path(path)
    out.write_bytes(data)
    return out


def write_stateful(path: str | Path, *, hidden: int = 4, batch: int | None = None) -> Path:
    """A step of a recurrent model that keeps its rows on axis 1 of its state, like
    silero-vad, with a scalar shared by the whole batch.

    Inputs: ``x`` float32 [N, hidden], ``state`` float32 [2, N, hidden] (rows on axis 1),
    ``gain`` float32 [] (a scalar). Outputs: ``stateN`` = state * gain + x, float32
    [2, N, hidden]; ``y`` = the mean of ``stateN`` over its first axis, float32 [N, hidden].
    """
    f32 = np.dtype(np.float32)
    n: Dim = batch if batch is not None else "N"
    nodes = [
        _node("Mul", ["state", "gain"], ["scaled"]),
        _node("Add", ["scaled", "x"], ["stateN"]),
        _node("ReduceMean", ["stateN"], ["y"], _attr_ints("axes", [0]), _attr_int("keepdims", 0)),
    ]
    data = _model(
        nodes,
        [],
        [
            _value_info("x", f32, [n, hidden]),
            _value_info("state", f32, [2, n, hidden]),
            _value_info("gain", f32, []),
        ],
        [_value_info("y", f32, [n, hidden]), _value_info("stateN", f32, [2, n, hidden])],
        "stateful",
    )
    out = Path(path)
    out.write_bytes(data)
    return out


def write_time_major(
    path: str | Path,
    *,
    features: int = 6,
    steps: int = 3,
    batch: int | None = None,
    declared: Sequence[Dim] = ("N", "seqlen", "classes"),
) -> Path:
    """A model whose declared output shape lies, like many exported sequence recognisers:
    its output is time-major, rows on axis 1, while it declares them on axis 0.

    Input ``x`` float32 [N, features]. Output ``probs`` = x * (k + 1) for each time step k,
    really float32 (steps, N, features), declared as `declared` (a reshape to its own
    runtime shape hides the real one from shape inference, so the declaration stands).
    """
    f32 = np.dtype(np.float32)
    n: Dim = batch if batch is not None else "N"
    scale = (np.arange(steps, dtype=f32) + 1).reshape(steps, 1, 1) * np.ones(features, f32)
    nodes = [
        _node("Unsqueeze", ["x", "axis0"], ["x1"]),
        _node("Mul", ["x1", "scale"], ["y"]),
        _node("Shape", ["y"], ["y_shape"]),
        _node("Reshape", ["y", "y_shape"], ["probs"]),
    ]
    data = _model(
        nodes,
        [_tensor("axis0", np.array([0], np.int64)), _tensor("scale", scale.astype(f32))],
        [_value_info("x", f32, [n, features])],
        [_value_info("probs", f32, list(declared))],
        "time_major",
    )
    out = Path(path)
    out.write_bytes(data)
    return out


def write_detector(
    path: str | Path, *, classes: int = 3, stride: int = 8, seed: int = 0, gain: float = 6.0
) -> Path:
    """A YOLO-style detector with a dynamic input size, for onboarding a detector end to end
    (`docs/own-model.md`): each `stride` x `stride` cell of the image is one anchor.

    Input ``images`` float32 [N, 3, H, W] (RGB in [0, 1]; H and W multiples of `stride`).
    Output ``preds`` float32 [N, (H / stride) * (W / stride), 4 + classes], anchors in
    row-major cell order: sigmoid of a 1x1 convolution (weights `gain` x N(0, 1)) of each
    cell's mean colour; per anchor the box centre's offset in the cell (x, y), its width and
    height in units of 8 strides, then one score per class. A class scores 0.05 on the
    letterbox grey (114 / 255) and high only on colours far from it.
    """
    rng = np.random.default_rng(seed)
    f32 = np.dtype(np.float32)
    outputs = 4 + classes
    weights = rng.standard_normal((outputs, 3)) * gain
    bias = rng.standard_normal(outputs) * gain / 4
    bias[4:] = -3.0 - weights[4:] @ np.full(3, 114 / 255)  # grey: logit -3
    weights, bias = weights.reshape(outputs, 3, 1, 1).astype(f32), bias.astype(f32)
    nodes = [
        _node(
            "AveragePool",
            ["images"],
            ["cells"],
            _attr_ints("kernel_shape", [stride, stride]),
            _attr_ints("strides", [stride, stride]),
        ),
        _node("Conv", ["cells", "W", "B"], ["logits"]),
        _node("Sigmoid", ["logits"], ["maps"]),
        _node("Reshape", ["maps", "flat"], ["anchors"]),
        _node("Transpose", ["anchors"], ["preds"], _attr_ints("perm", [0, 2, 1])),
    ]
    initializers = [
        _tensor("W", weights),
        _tensor("B", bias),
        _tensor("flat", np.array([0, outputs, -1], np.int64)),
    ]
    data = _model(
        nodes,
        initializers,
        [_value_info("images", f32, ["N", 3, "H", "W"])],
        [_value_info("preds", f32, ["N", "A", outputs])],
        "detector",
    )
    out = Path(path)
    out.write_bytes(data)
    return out


def write_classifier(
    path: str | Path, *, size: int = 224, classes: int = 10, seed: int = 0
) -> Path:
    """An image classifier: ``x`` float32 [N, 3, size, size] -> ``logits`` float32
    [N, classes], a linear layer over the image's mean colour (global average pool)."""
    rng = np.random.default_rng(seed)
    f32 = np.dtype(np.float32)
    nodes = [
        _node("GlobalAveragePool", ["x"], ["pooled"]),
        _node("Flatten", ["pooled"], ["colour"]),
        _node("MatMul", ["colour", "W"], ["scores"]),
        _node("Add", ["scores", "b"], ["logits"]),
    ]
    weights = [
        _tensor("W", (rng.standard_normal((3, classes)) * 4).astype(f32)),
        _tensor("b", rng.standard_normal(classes).astype(f32)),
    ]
    data = _model(
        nodes,
        weights,
        [_value_info("x", f32, ["N", 3, size, size])],
        [_value_info("logits", f32, ["N", classes])],
        "classifier",
    )
    out = Path(path)
    out.write_bytes(data)
    return out
