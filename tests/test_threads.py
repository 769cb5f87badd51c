"""`threads: auto`: the plan for the cores, applied at OfflineInference(...), shown by info."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import inferchain as ic
from inferchain.testing.onnx_models import write_mlp64
from inferchain.threads import MAX_HOST_WORKERS, MAX_INSTANCES, planned, visible_cores

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
SHIPPED = ("ocr", "orientation", "vad", "romanize")


def tiny(folder: Path, threads: str = "auto", **top: object) -> Path:
    write_mlp64(folder / "mlp64.onnx")
    head = [f"name: tiny\nthreads: {threads}"] + [f"{k}: {v}" for k, v in top.items()]
    body = "models:\n  - name: m\n    path: mlp64.onnx\n    instances: 1\n    max_batch_size: 8"
    (folder / "recipe.yaml").write_text("\n".join([*head, body]) + "\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("cores", [1, 2, 4, 64])
@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_recipe_gets_a_valid_plan_on_any_cores(name: str, cores: int) -> None:
    written = ic.load_recipe(RECIPES / name)
    assert written.threads == "auto"
    recipe, plan = planned(written, cores)
    assert plan is not None and plan.cores == cores
    for m in recipe.models:
        assert m.instances == min(cores, MAX_INSTANCES)
        options = m.session_options or recipe.session_options
        assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
        assert not options.allow_spinning
    fill = any(m.batching == "fill" for m in written.models)  # romanize's encoder
    host = recipe.host_workers
    assert host == (0 if fill else min(max(cores, 2), MAX_HOST_WORKERS))
    assert plan.instances == {m.name: m.instances for m in recipe.models}


def test_a_recipe_on_a_device_keeps_what_it_says() -> None:
    for backend in ("acl",):
        written = ic.load_recipe(RECIPES / "vad", backend=backend)
        recipe, plan = planned(written, 8)
        assert recipe == written
        assert plan is not None and not plan.instances and "a device runs the models" in plan.why
    cuda = ic.load_recipe(RECIPES / "orientation", providers=["CUDAExecutionProvider"])
    recipe, plan = planned(cuda, 8)
    assert recipe == cuda and plan is not None and not plan.instances


def test_manual_is_the_default_and_keeps_the_recipe_as_written(tmp_path: Path) -> None:
    folder = tiny(tmp_path, threads="manual")
    written = ic.load_recipe(folder)
    assert planned(written, 8) == (written, None)
    (folder / "recipe.yaml").write_text(
        (folder / "recipe.yaml").read_text().replace("threads: manual\n", "")
    )
    assert ic.load_recipe(folder).threads == "manual"
    with pytest.raises(ic.ConfigError, match="threads"):
        ic.load_recipe(folder, threads="many")


def test_offline_inference_runs_the_plan_for_this_machine(tmp_path: Path) -> None:
    with ic.OfflineInference(tiny(tmp_path)) as oi:
        assert oi.thread_plan is not None
        assert oi.recipe.model("m").instances == min(visible_cores(), MAX_INSTANCES)
        xs = np.ones((20, 64), np.float32)
        assert len(list(oi.map("m", xs))) == 20
        workers = oi._models["m"].workers
        assert len(workers) == oi.recipe.model("m").instances
        assert {w.session.settings["threads"] for w in workers} == {"1"}  # type: ignore[union-attr]


def test_info_says_what_the_plan_chose_and_why(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tiny(tmp_path)
    assert cli("info", folder) == 0
    out = capsys.readouterr().out
    cores = visible_cores()
    assert f"threads: auto on {cores} cores: instances m x{min(cores, MAX_INSTANCES)}" in out
    assert "why: one-thread sessions that do not spin" in out
    assert cli("info", folder, "--json") == 0
    plan = json.loads(capsys.readouterr().out)["thread_plan"]
    assert plan["cores"] == cores and plan["instances"] == {"m": min(cores, MAX_INSTANCES)}
