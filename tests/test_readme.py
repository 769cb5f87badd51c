"""README.md's "Run your own model" blocks run as they are written: the four-line recipe
from Python, then its pipeline over image files with `inferchain run` and `info --input`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from inferchain.testing.onnx_models import write_classifier

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_block(marker: str) -> str:
    """The README's fenced block whose first line is `# {marker}`."""
    blocks = README.read_text(encoding="utf-8").split("```")[1::2]
    for block in blocks:
        body = block.split("\n", 1)[1]
        if body.startswith(f"# {marker}\n"):
            return body
    raise AssertionError(f"README.md has no block starting with # {marker}")


def test_the_readme_recipe_runs_from_python_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "mymodel"
    folder.mkdir()
    (folder / "recipe.yaml").write_text(readme_block("mymodel/recipe.yaml"), encoding="utf-8")
    write_classifier(folder / "classifier.onnx")
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    exec(readme_block("mymodel: from Python"), scope)  # the documented code itself
    one, many = scope["one"], scope["many"]
    assert isinstance(one, dict) and one["logits"].shape == (10,)
    assert isinstance(many, list) and len(many) == 100
    assert np.array_equal(many[0]["logits"], one["logits"])


def test_the_readme_pipeline_classifies_image_files_with_run_and_info(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "mymodel"
    folder.mkdir()
    recipe = readme_block("mymodel/recipe.yaml") + "pipeline: pipeline.py:Classify\n"
    (folder / "recipe.yaml").write_text(recipe, encoding="utf-8")
    (folder / "pipeline.py").write_text(readme_block("mymodel/pipeline.py"), encoding="utf-8")
    model = write_classifier(folder / "classifier.onnx")
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(4)
    for i, mode in enumerate(("RGB", "L", "RGBA")):
        pixels = rng.integers(0, 256, (30 + i, 40, 4), dtype=np.uint8)
        Image.fromarray(pixels, "RGBA").convert(mode).save(photos / f"{i}.png")
    assert cli("run", folder, "--input", photos, "--output", tmp_path / "out") == 0
    lines = (tmp_path / "out" / "results.jsonl").read_text(encoding="utf-8").splitlines()
    got = [json.loads(line)["class"] for line in lines]
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    expected = []
    for path in sorted(photos.iterdir()):
        with Image.open(path) as image:
            rgb = image.convert("RGB").resize((224, 224))
        x = np.asarray(rgb, np.float32).transpose(2, 0, 1) / 255
        expected.append(int(session.run(None, {"x": x[None]})[0][0].argmax()))
    assert got == expected
    capsys.readouterr()
    assert cli("info", folder, "--input", photos / "2.png") == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"{photos / '2.png'}: PNG RGBA 40x32 -> uint8 (32, 40, 3) RGB")
