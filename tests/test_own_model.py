"""docs/own-model.md, step by step, on models with the traps it names: a fixed batch of 1,
declared shapes that lie with the rows on axis 1, and batch-dependent quantization."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import structlog

import inferchain as ic
from inferchain.cli import main
from inferchain.testing.onnx_models import write_time_major

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "own-model.md"


@pytest.fixture
def cli() -> Iterator[Callable[..., int]]:
    saved = structlog.get_config()
    yield lambda *argv: main([str(a) for a in argv])
    structlog.configure(**saved)


def guide_function(name: str) -> Callable[..., bool]:
    """The guide's python block defining `name`, run as it is written."""
    text = GUIDE.read_text(encoding="utf-8")
    block = next(b for b in text.split("```python")[1:] if f"def {name}(" in b)
    scope: dict[str, object] = {}
    exec(block.split("```")[0], scope)  # the documented code itself
    return scope[name]  # type: ignore[return-value]


def recipe_yaml(folder: Path, **model: object) -> Path:
    text = "name: recognizer\nmodels:\n  - name: rec\n    path: recognizer.onnx\n"
    text += "".join(f"    {k}: {v}\n" for k, v in model.items())
    (folder / "recipe.yaml").write_text(text, encoding="utf-8")
    return folder


def test_info_finds_the_fixed_batch_and_the_rows_on_axis_1_and_the_recipe_fixes_them(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_time_major(tmp_path / "recognizer.onnx", batch=1, declared=("N", "T", "C"))
    assert cli("--log-level", "error", "info", model) == 0  # step 1
    out = capsys.readouterr().out
    assert "1: [3, 1, 6]" in out
    assert "max_batch_size 8 exceeds the 1 its fixed batch dim accepts" in out
    assert "set `outputs: {probs: {batch_axis: 1}}` in the recipe" in out
    with pytest.raises(ic.ConfigError, match=r"exceeds the 1 the loaded model accepts.*instances"):
        ic.OfflineInference(recipe_yaml(tmp_path)).init()  # the defaults are refused at init
    folder = recipe_yaml(  # step 2, as the guide writes it
        tmp_path, max_batch_size=1, instances=2, outputs="{probs: {batch_axis: 1}}"
    )
    assert cli("--log-level", "error", "info", folder) == 0
    assert "!" not in capsys.readouterr().out.split("\n\n")[0]
    xs = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    with ic.OfflineInference(folder) as oi:
        got = [o["probs"] for o in oi.map("rec", xs)]
    for x, y in zip(xs, got, strict=True):  # each request its own rows, every time step
        np.testing.assert_allclose(y, np.stack([x * (k + 1) for k in range(3)]), rtol=1e-6)
    assert cli("--log-level", "error", "compare", model, folder, "--model", "rec") == 0  # step 3


def write_dynamic_quantized(path: Path) -> Path:
    """x -> DynamicQuantizeLinear -> DequantizeLinear: uint8 with a scale computed over the
    whole batch, as dynamically quantized models do."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "scale", "zero"]),
            helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"]),
        ],
        "dynamic_quant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_the_batch_invariance_check_finds_dynamic_quantization(tmp_path: Path) -> None:
    """Step 4: the guide's own function says a dynamically quantized model is not batch
    invariant, and a plain one (the time-major model with a dynamic batch) is."""
    batch_invariant = guide_function("batch_invariant")
    rng = np.random.default_rng(1)
    quantized = tmp_path / "q"
    quantized.mkdir()
    write_dynamic_quantized(quantized / "recognizer.onnx")
    recipe_yaml(quantized, warmup="false")
    items = [rng.standard_normal(8).astype(np.float32) * (i + 1) for i in range(16)]
    assert batch_invariant(quantized, "rec", items) is False
    plain = tmp_path / "p"
    plain.mkdir()
    write_time_major(plain / "recognizer.onnx")
    recipe_yaml(plain, outputs="{probs: {batch_axis: 1}}")
    items = [rng.standard_normal(6).astype(np.float32) for _ in range(16)]
    assert batch_invariant(plain, "rec", items) is True
