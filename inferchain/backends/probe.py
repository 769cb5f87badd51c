"""Which device runtimes this process can use, asked of the runtimes themselves.

Only `inferchain/backends/*` imports onnxruntime, openvino or acl; `inferchain doctor` asks
here.
Importing pyACL does not initialise it: no device is touched.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Sequence

import attrs

from inferchain.errors import LoadError


@attrs.frozen
class RuntimeProbe:
    """One runtime as found (or not) in this process."""

    name: str  # "onnxruntime", "pyACL"
    available: bool
    version: str | None = None
    detail: str = ""  # where it was found, or why it cannot be used
    providers: tuple[str, ...] = ()  # onnxruntime's execution providers in this build
    known_providers: tuple[str, ...] = ()  # every provider name onnxruntime knows, any build
    # openvino: what its CPU plugin can run here (OPTIMIZATION_CAPABILITIES: FP32, BF16, ...)
    capabilities: tuple[str, ...] = ()


def probe_onnxruntime() -> RuntimeProbe:
    """onnxruntime's version and the execution providers this build has."""
    try:
        ort = importlib.import_module("onnxruntime")
        providers = tuple(ort.get_available_providers())
        known = tuple(ort.get_all_providers())
    except Exception as e:  # ImportError, or a broken native library
        return RuntimeProbe("onnxruntime", False, detail=f"{type(e).__name__}: {e}")
    version = str(getattr(ort, "__version__", "?"))
    return RuntimeProbe("onnxruntime", True, version, ", ".join(providers), providers, known)


def probe_openvino() -> RuntimeProbe:
    """OpenVINO's version, its devices, and what its CPU plugin can run on this CPU."""
    try:
        ov = importlib.import_module("openvino")
        core = ov.Core()
        devices = tuple(core.available_devices)
        capabilities = tuple(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        cpu = str(core.get_property("CPU", "FULL_DEVICE_NAME"))
    except Exception as e:  # ImportError, or a plugin that does not start
        return RuntimeProbe("openvino", False, detail=f"{type(e).__name__}: {e}")
    version = str(getattr(ov, "__version__", "?")).split("-")[0]
    detail = f"CPU {cpu}: {', '.join(capabilities)}"
    return RuntimeProbe("openvino", True, version, detail, devices, capabilities=capabilities)


def unknown_provider(name: str, known: Sequence[str]) -> str | None:
    """Why `name` is not an execution provider at all (a misspelling, not one this build
    lacks), with the closest known name; None when onnxruntime knows it (or no list of
    known names is given)."""
    if not known or name in known:
        return None
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(known))}"
    return f"onnxruntime has no execution provider {name!r} ({hint})"


def probe_acl() -> RuntimeProbe:
    """Whether pyACL (`import acl`, shipped with CANN) imports, and from where."""
    from inferchain.backends.acl_api import CANN_SETUP, import_acl

    try:
        module = import_acl()
    except LoadError as e:
        reason = str(e).split(". ")[0]  # the first sentence; the rest is the remedy below
        return RuntimeProbe("pyACL", False, detail=f"{reason} (CANN: `{CANN_SETUP}`)")
    return RuntimeProbe("pyACL", True, detail=str(getattr(module, "__file__", "built-in")))
