"""docs/own-model.md, step by step, on models with the traps it names (a fixed batch of 1,
declared shapes that lie with the rows on axis 1, batch-dependent quantization), and its
worked detector example run as the guide writes it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import inferchain as ic
from inferchain.testing.onnx_models import write_detector, write_time_major

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "own-model.md"


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


# -- the worked detector example -------------------------------------------------------------


def guide_files(folder: Path) -> Path:
    """The guide's `detector/...` files, written as they are in the guide into `folder`."""
    folder.mkdir()
    text = GUIDE.read_text(encoding="utf-8")
    for block in text.split("```")[1::2]:
        body = block.split("\n", 1)[1] if "\n" in block else ""
        first = body.split("\n", 1)[0]
        if first.startswith("# detector/"):
            (folder / first.removeprefix("# detector/").strip()).write_text(body, encoding="utf-8")
    assert {p.name for p in folder.iterdir()} >= {"recipe.yaml", "pipeline.py"}
    return folder


def detector_images(folder: Path) -> list[Path]:
    """RGB (PNG and JPEG), grey and RGBA photos of coloured rectangles, of several sizes;
    the RGBA ones transparent around coloured shapes whose hidden colour is not black."""
    rng = np.random.default_rng(11)
    folder.mkdir()
    paths = []
    for i in range(12):
        w, h = int(rng.integers(90, 420)), int(rng.integers(90, 420))
        pixels = np.empty((h, w, 3), np.uint8)
        pixels[:] = rng.integers(0, 256, 3)
        for _ in range(4):
            x0, y0 = int(rng.integers(0, w - 30)), int(rng.integers(0, h - 30))
            pixels[y0 : y0 + int(rng.integers(20, h)), x0 : x0 + int(rng.integers(20, w))] = (
                rng.integers(0, 256, 3)
            )
        image = Image.fromarray(pixels)
        kind = ("rgb", "jpeg", "grey", "rgba")[i % 4]
        if kind == "grey":
            image = image.convert("L")
        if kind == "rgba":
            alpha = np.where(pixels.std(axis=2) > 10, 255, 0).astype(np.uint8)
            image = Image.fromarray(np.dstack((pixels, alpha)), "RGBA")
        path = folder / f"{i:02d}_{kind}.{'jpg' if kind == 'jpeg' else 'png'}"
        image.save(path, **({"quality": 92} if kind == "jpeg" else {}))
        paths.append(path)
    return paths


def plain_reference(model: Path, paths: list[Path], params: dict[str, Any]) -> list[dict[str, Any]]:
    """The detector the plain way: Pillow reads each image, onnxruntime runs it alone, loops
    decode it and run NMS."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    size, stride = params["size"], params["stride"]
    results = []
    for path in paths:
        with Image.open(path) as opened:
            rgb = opened.convert("RGB")
        w, h = rgb.size
        scale = size / max(w, h)
        new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
        left, top = (size - new_w) // 2, (size - new_h) // 2
        canvas = Image.new("RGB", (size, size), (114, 114, 114))
        canvas.paste(rgb.resize((new_w, new_h), Image.Resampling.BILINEAR), (left, top))
        x = np.asarray(canvas).transpose(2, 0, 1).astype(np.float32) / np.float32(255)
        (preds,) = session.run(None, {"images": x[None]})
        results.append(plain_decode(preds[0], (scale, left, top, w, h), params, size // stride))
    return results


def plain_decode(
    preds: np.ndarray, frame: tuple[float, int, int, int, int], params: dict[str, Any], cells: int
) -> dict[str, Any]:
    stride = params["stride"]
    rows = [[float(v) for v in row] for row in preds]
    order = sorted(range(len(rows)), key=lambda a: -max(rows[a][4:]))[: params["max_candidates"]]
    found = []
    for a in order:
        score = max(rows[a][4:])
        if score <= params["conf"]:
            continue
        gx, gy = a % cells, a // cells
        cx, cy = (gx + rows[a][0]) * stride, (gy + rows[a][1]) * stride
        hw, hh = rows[a][2] * (4 * stride), rows[a][3] * (4 * stride)
        found.append(([cx - hw, cy - hh, cx + hw, cy + hh], score, rows[a][4:].index(score)))
    kept: list[tuple[list[float], float, int]] = []
    for box, score, cls in found:
        if all(c != cls or iou(box, k) <= params["iou"] for k, _, c in kept):
            kept.append((box, score, cls))
    scale, left, top, w, h = frame
    boxes = []
    for box, _, _ in kept:
        x1, y1, x2, y2 = ((v - o) / scale for v, o in zip(box, (left, top, left, top), strict=True))
        boxes.append(
            [min(max(x1, 0), w), min(max(y1, 0), h), min(max(x2, 0), w), min(max(y2, 0), h)]
        )
    return {"boxes": boxes, "scores": [s for _, s, _ in kept], "classes": [c for _, _, c in kept]}


def iou(a: list[float], b: list[float]) -> float:
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(width, 0) * max(height, 0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def test_the_guides_detector_gives_the_plain_scripts_detections_on_rgb_grey_and_rgba(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    """The worked example end to end: the guide's recipe and pipeline, a detector with a
    dynamic input written by the project's ONNX writer, RGB, grey and RGBA images; `oi.run`
    and `inferchain run` give exactly the boxes, scores and classes of the plain script,
    batched (the model saw batches of several images)."""
    import yaml

    folder = guide_files(tmp_path / "detector")
    model = write_detector(folder / "detector.onnx")
    paths = detector_images(folder / "images")
    params = yaml.safe_load((folder / "recipe.yaml").read_text())["params"]
    expected = plain_reference(model, paths, params)
    for kind in ("rgb", "jpeg", "grey", "rgba"):  # boxes to compare on every kind
        assert any(r["boxes"] for p, r in zip(paths, expected, strict=True) if kind in p.name)
    assert sum(bool(r["boxes"]) for r in expected) >= len(paths) - 2
    with ic.OfflineInference(folder) as oi:
        got = list(oi.run(paths))
        assert max(oi.stats().models["det"].batch_sizes) > 1
    assert got == expected
    out = tmp_path / "out"
    assert cli("run", folder, "--output", out) == 0
    lines = (out / "results.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r.pop("file") for r in records] == [str(p) for p in paths]
    assert [r.pop("key") for r in records] == [str(p.resolve()) for p in paths]
    assert records == expected
    assert cli("info", folder, "--input", paths[3]) == 0
    with Image.open(paths[3]) as rgba:
        w, h = rgba.size
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{paths[3]}: PNG RGBA {w}x{h} -> uint8 ({h}, {w}, 3) RGB (alpha: drop, "
        "EXIF orientation not applied, max_mb 256)"
    )
