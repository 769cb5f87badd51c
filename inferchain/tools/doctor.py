"""The environment check: runtimes, providers, CANN, driver, firmware and NPUs.

`diagnose(recipe)` returns one `Check` per item, OK / WARN / MISSING / not used / FAIL, for
what the recipe needs (without a recipe: the backends installed here). The Ascend parts
(pyACL, the CANN toolkit, driver, firmware, npu-smi) are checked one by one where the recipe
runs on Ascend (backend `acl`, or the `CANNExecutionProvider`) or pyACL is installed; those
not found are then MISSING. Elsewhere the parts not found are one line, "not used". FAIL
means the given recipe cannot run here, and `exit_status` turns that into a non-zero exit.
The probes are module attributes so tests can replace them.
"""

from __future__ import annotations

import enum
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from inferchain.backends.openvino_options import CAPABILITIES, properties
from inferchain.backends.probe import (
    RuntimeProbe,
    probe_acl,
    probe_onnxruntime,
    probe_openvino,
    unknown_provider,
)
from inferchain.config import Recipe, load_recipe, recipe_file
from inferchain.errors import ConfigError, MissingDependency
from inferchain.pipeline import pipeline_class
from inferchain.tools.table import render

ASCEND = Path("/usr/local/Ascend")  # CANN's default install root
NPU_SMI = "npu-smi"
NPU_SMI_TIMEOUT_S = 10.0
CANN_EP = "CANNExecutionProvider"  # onnxruntime's provider for Ascend NPUs
_VERSION = re.compile(r"^\s*(?:\w+_)?version\s*[=:]\s*\[?([^\]\s:]+)", re.IGNORECASE | re.MULTILINE)


class Status(enum.StrEnum):
    """How one check came out."""

    OK = "OK"
    WARN = "WARN"  # works, but not as asked (e.g. a provider falls back to CPU)
    MISSING = "MISSING"  # not on this machine, and what is checked needs it
    NOT_USED = "not used"  # not on this machine, and nothing checked needs it
    FAIL = "FAIL"  # the recipe given cannot run here


@attrs.frozen
class Check:
    """One line of the doctor's table."""

    name: str
    status: Status
    detail: str
    output: str = ""  # full text of a tool's output (npu-smi), shown with --verbose


def read_version(path: Path) -> str | None:
    """The version in a CANN `version.info` / `version.cfg` (`Version=...`, `x_version=[...]`)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = _VERSION.search(text)
    if match:
        return match.group(1)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first or None


def toolkit_roots() -> list[Path]:
    """Where the CANN toolkit may be: $ASCEND_TOOLKIT_HOME, $ASCEND_HOME_PATH, the default."""
    roots = [os.environ.get("ASCEND_TOOLKIT_HOME"), os.environ.get("ASCEND_HOME_PATH")]
    found = [Path(r) for r in roots if r]
    return [*found, ASCEND / "ascend-toolkit" / "latest"]


def cann_check() -> Check:
    """The CANN toolkit version from version.cfg or */version.info."""
    for root in toolkit_roots():
        for candidate in [root / "version.cfg", *sorted(root.glob("*/version.info"))]:
            version = read_version(candidate) if candidate.is_file() else None
            if version:
                return Check("CANN toolkit", Status.OK, f"{version} ({candidate})")
    where = ", ".join(str(r) for r in toolkit_roots())
    return Check("CANN toolkit", Status.MISSING, f"no version.cfg or */version.info in {where}")


def version_file_check(name: str, path: Path) -> Check:
    """A component whose version sits in one file (driver, firmware)."""
    version = read_version(path) if path.is_file() else None
    if version is None:
        return Check(name, Status.MISSING, f"no {path}")
    return Check(name, Status.OK, f"{version} ({path})")


def npu_smi_check() -> Check:
    """`npu-smi info`, when the tool is on PATH (bounded by NPU_SMI_TIMEOUT_S)."""
    tool = shutil.which(NPU_SMI)
    if tool is None:
        return Check("npu-smi", Status.MISSING, f"{NPU_SMI} is not on PATH")
    try:
        done = subprocess.run(
            [tool, "info"], capture_output=True, text=True, timeout=NPU_SMI_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return Check("npu-smi", Status.WARN, f"`npu-smi info` timed out after {NPU_SMI_TIMEOUT_S}s")
    except OSError as e:
        return Check("npu-smi", Status.WARN, f"`npu-smi info` could not run: {e}")
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        detail = f"`npu-smi info` exited {done.returncode}: {reason[0] if reason else ''}"
        return Check("npu-smi", Status.WARN, detail.strip(), done.stdout + done.stderr)
    match = re.search(r"Version:\s*(\S+)", done.stdout)
    detail = f"version {match.group(1)}" if match else "ran"
    return Check("npu-smi", Status.OK, f"{detail} ({tool})", done.stdout)


def runtime_checks(ort: RuntimeProbe) -> list[Check]:
    """Python, numpy, onnxruntime and its providers."""
    checks = [
        Check("python", Status.OK, f"{platform.python_version()} ({platform.machine()})"),
        Check("numpy", Status.OK, np.__version__),
    ]
    if ort.available:
        checks.append(Check("onnxruntime", Status.OK, ort.version or "?"))
        checks.append(Check("providers", Status.OK, ", ".join(ort.providers)))
    else:
        checks.append(Check("onnxruntime", Status.MISSING, ort.detail))
    return checks


def openvino_check(ov: RuntimeProbe) -> Check:
    """OpenVINO's version and what its CPU plugin can run here (bf16 needs AMX/AVX512_BF16)."""
    if not ov.available:
        return Check(
            "openvino", Status.MISSING, f"{ov.detail} (pip install 'inferchain[openvino]')"
        )
    return Check("openvino", Status.OK, f"{ov.version}; {ov.detail}")


def ascend_user(recipe: Recipe | None, acl: RuntimeProbe) -> str | None:
    """What here needs the Ascend parts: the recipe (backend acl, or onnxruntime's CANN
    provider), or without a recipe an installed pyACL; None when nothing does."""
    if recipe is None:
        return "the installed pyACL" if acl.available else None
    if recipe.backend == "acl":
        return f"recipe {recipe.name} (backend acl)"
    cann = CANN_EP in recipe.provider_names
    return f"recipe {recipe.name} (CANNExecutionProvider)" if cann else None


def ascend_checks(acl: RuntimeProbe, user: str | None) -> list[Check]:
    """pyACL, the CANN toolkit, driver, firmware and npu-smi, each as found; with no `user`
    (nothing here needs them) the ones not found are one "not used" line."""
    checks = [
        Check("pyACL", Status.OK if acl.available else Status.MISSING, acl.detail),
        cann_check(),
        version_file_check("Ascend driver", ASCEND / "driver" / "version.info"),
        version_file_check("Ascend firmware", ASCEND / "firmware" / "version.info"),
        npu_smi_check(),
    ]
    if user is not None:
        return checks
    found = [c for c in checks if c.status is not Status.MISSING]
    absent = [c.name for c in checks if c.status is Status.MISSING]
    if absent:
        detail = (
            f"{', '.join(absent)}: not on this machine; nothing here needs them (a recipe with "
            f"backend: acl or the {CANN_EP} does)"
        )
        found.append(Check("Ascend", Status.NOT_USED, detail))
    return found


def recipe_checks(recipe: Recipe, ort: RuntimeProbe, acl: RuntimeProbe) -> list[Check]:
    """Whether `recipe`'s backend, each provider it asks for and its pipeline (with what
    the pipeline imports) can run here: the checks `init()` makes before loading a model."""
    return [*_backend_checks(recipe, ort, acl), *pipeline_checks(recipe)]


def pipeline_checks(recipe: Recipe) -> list[Check]:
    """The recipe's pipeline file imports, its class is there, and so is every module it
    `requires` (`inferchain.pipeline.pipeline_class`, as `init()` checks it)."""
    if not recipe.pipeline:
        return []
    try:
        cls = pipeline_class(recipe)
    except (ConfigError, MissingDependency) as e:
        return [Check("  pipeline", Status.FAIL, str(e))]
    also = f"; {', '.join(cls.requires)} import" if cls.requires else ""
    return [Check("  pipeline", Status.OK, f"{recipe.pipeline} imports{also}")]


def _backend_checks(recipe: Recipe, ort: RuntimeProbe, acl: RuntimeProbe) -> list[Check]:
    name = f"recipe {recipe.name}"
    if recipe.backend == "openvino":
        return openvino_recipe_checks(recipe, probe_openvino())
    if recipe.backend == "acl":
        if not acl.available:
            return [Check(name, Status.FAIL, "backend acl needs pyACL, which does not import")]
        return [Check(name, Status.OK, "backend acl: pyACL imports")]
    if not ort.available:
        return [Check(name, Status.FAIL, "backend onnxruntime needs onnxruntime")]
    checks = [Check(name, Status.OK, "backend onnxruntime")]
    for m in recipe.models:
        if m.precision != "f32":
            detail = f"precision {m.precision}: onnxruntime runs the file's own types (openvino?)"
            checks.append(Check(f"  {m.name}", Status.FAIL, detail))
    for entry in recipe.providers:
        provider = entry if isinstance(entry, str) else next(iter(entry), "?")
        wrong = unknown_provider(provider, ort.known_providers)
        if wrong is not None:
            checks.append(Check(f"  {provider}", Status.FAIL, wrong))
        elif provider in ort.providers:
            checks.append(Check(f"  {provider}", Status.OK, "available"))
        else:
            detail = "not in this onnxruntime build: runs on CPUExecutionProvider instead"
            checks.append(Check(f"  {provider}", Status.WARN, detail))
    return checks


def openvino_recipe_checks(recipe: Recipe, ov: RuntimeProbe) -> list[Check]:
    """Whether OpenVINO is here, the properties each model gets from the recipe's session
    options (threads, streams, precision) or the key it refuses, and whether this CPU runs
    each model's precision."""
    name = f"recipe {recipe.name}"
    if not ov.available:
        return [Check(name, Status.FAIL, "backend openvino needs openvino, which does not import")]
    checks = [Check(name, Status.OK, "backend openvino")]
    for m in recipe.models:
        try:
            props = properties(m.session_options or recipe.session_options, m.precision, "")
        except ConfigError as e:
            checks.append(Check(f"  {m.name}", Status.FAIL, str(e)))
            continue
        threads = props.get("INFERENCE_NUM_THREADS", "default")
        detail = f"threads {threads}, streams {props['NUM_STREAMS']}, precision {m.precision}"
        if CAPABILITIES[m.precision] not in ov.capabilities:
            detail += f": this CPU cannot run {m.precision} (it can: {', '.join(ov.capabilities)})"
            checks.append(Check(f"  {m.name}", Status.FAIL, detail))
        else:
            checks.append(Check(f"  {m.name}", Status.OK, detail))
    return checks


def diagnose(recipe: Recipe | str | Path | None = None) -> list[Check]:
    """The checks of what `recipe` needs (without one: of the backends installed here),
    and whether it can run here.

    `recipe` may be a path: a recipe that does not load here (a package of its models not
    installed, a wrong key) is then a FAIL line of its own; a path that is no recipe at all
    raises ConfigError.
    """
    if isinstance(recipe, str | Path):
        recipe, failed = load_check(recipe)
        if failed is not None:
            return [*diagnose(None), failed]
    ort, acl = probe_onnxruntime(), probe_acl()
    checks = runtime_checks(ort) + ascend_checks(acl, ascend_user(recipe, acl))
    ov = probe_openvino()
    if ov.available or (recipe is not None and recipe.backend == "openvino"):
        checks.append(openvino_check(ov))
    if recipe is not None:
        checks += recipe_checks(recipe, ort, acl)
    return checks


def load_check(path: str | Path) -> tuple[Recipe | None, Check | None]:
    """The recipe at `path`, or the FAIL line saying why it does not load here."""
    recipe_file(path)  # no recipe there: bad input (ConfigError), not a failed check
    try:
        return load_recipe(path), None
    except ConfigError as e:
        return None, Check(f"recipe {path}", Status.FAIL, str(e))


def exit_status(checks: Sequence[Check]) -> int:
    """1 when a check FAILed (the recipe cannot run here), else 0."""
    return 1 if any(c.status is Status.FAIL for c in checks) else 0


def format_checks(checks: Sequence[Check], verbose: bool = False) -> str:
    """The table; with `verbose`, tools' full output below it."""
    text = render(
        ["check", "status", "detail"], [[c.name, c.status.value, c.detail] for c in checks]
    )
    if verbose:
        for c in checks:
            if c.output:
                text += f"\n\n{c.name}:\n{c.output.rstrip()}"
    return text
