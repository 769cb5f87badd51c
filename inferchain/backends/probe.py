"""Which device runtimes this process can use, asked of the runtimes themselves.

Only `inferchain/backends/*` imports onnxruntime or acl; `inferchain doctor` asks here.
Importing pyACL does not initialise it: no device is touched.
"""

from __future__ import annotations

import importlib

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


def probe_onnxruntime() -> RuntimeProbe:
    """onnxruntime's version and the execution providers this build has."""
    try:
        ort = importlib.import_module("onnxruntime")
        providers = tuple(ort.get_available_providers())
    except Exception as e:  # ImportError, or a broken native library
        return RuntimeProbe("onnxruntime", False, detail=f"{type(e).__name__}: {e}")
    version = str(getattr(ort, "__version__", "?"))
    return RuntimeProbe("onnxruntime", True, version, ", ".join(providers), providers)


def probe_acl() -> RuntimeProbe:
    """Whether pyACL (`import acl`, shipped with CANN) imports, and from where."""
    from inferchain.backends.acl_api import CANN_SETUP, import_acl

    try:
        module = import_acl()
    except LoadError as e:
        reason = str(e).split(". ")[0]  # the first sentence; the rest is the remedy below
        return RuntimeProbe("pyACL", False, detail=f"{reason} (CANN: `{CANN_SETUP}`)")
    return RuntimeProbe("pyACL", True, detail=str(getattr(module, "__file__", "built-in")))
