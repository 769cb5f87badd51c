"""pyACL's constants, its error codes by name, and turning return codes into BackendErrors.

pyACL exports functions only, so every program defines these itself (as the official samples
do). Shared by the acl backend and by `inferchain doctor`.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from inferchain.errors import BackendError, LoadError

ACL_SUCCESS = 0
ACL_DEVICE, ACL_HOST = 0, 1  # rt.get_run_mode
ACL_MEM_MALLOC_HUGE_FIRST, ACL_MEM_MALLOC_HUGE_ONLY, ACL_MEM_MALLOC_NORMAL_ONLY = 0, 1, 2
ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE = 0, 1
ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_DEVICE_TO_DEVICE = 2, 3
ACL_ERROR_REPEAT_INITIALIZE = 100002
DYNAMIC_INPUT_NAME = "ascend_mbatch_shape_data"  # the extra input of dynamic batch/HW models
CANN_SETUP = "source /usr/local/Ascend/ascend-toolkit/set_env.sh"

ACL_DTYPES: dict[int, np.dtype[Any]] = {  # aclDataType -> numpy (BF16, 27, has no numpy type)
    0: np.dtype(np.float32),
    1: np.dtype(np.float16),
    2: np.dtype(np.int8),
    3: np.dtype(np.int32),
    4: np.dtype(np.uint8),
    6: np.dtype(np.int16),
    7: np.dtype(np.uint16),
    8: np.dtype(np.uint32),
    9: np.dtype(np.int64),
    10: np.dtype(np.uint64),
    11: np.dtype(np.float64),
    12: np.dtype(np.bool_),
}

ERROR_NAMES: dict[int, str] = {
    100000: "ACL_ERROR_INVALID_PARAM",
    100001: "ACL_ERROR_UNINITIALIZE",
    100002: "ACL_ERROR_REPEAT_INITIALIZE",
    100003: "ACL_ERROR_INVALID_FILE",
    100011: "ACL_ERROR_INVALID_MODEL_ID",
    100017: "ACL_ERROR_MODEL_INPUT_NOT_MATCH",
    100018: "ACL_ERROR_MODEL_OUTPUT_NOT_MATCH",
    100019: "ACL_ERROR_MODEL_NOT_DYNAMIC",
    100037: "ACL_ERROR_REPEAT_FINALIZE",
    200000: "ACL_ERROR_BAD_ALLOC",
    200005: "ACL_ERROR_INVALID_RESOURCE_HANDLE",
    107000: "ACL_ERROR_RT_PARAM_INVALID",
    107001: "ACL_ERROR_RT_INVALID_DEVICEID",
    107002: "ACL_ERROR_RT_CONTEXT_NULL",
    107003: "ACL_ERROR_RT_STREAM_CONTEXT",
    107004: "ACL_ERROR_RT_MODEL_CONTEXT",
    107019: "ACL_ERROR_RT_WAIT_TIMEOUT",
    107020: "ACL_ERROR_RT_TASK_TIMEOUT",
    207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
    507014: "ACL_ERROR_RT_AICORE_TIMEOUT",
    507015: "ACL_ERROR_RT_AICORE_EXCEPTION",
    145013: "ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID",
    145021: "ACL_ERROR_GE_SHAPE_INVALID",
    500000: "ACL_ERROR_INTERNAL_ERROR",
}


def error_name(code: int) -> str:
    """The symbolic name of an ACL return code ("ACL_ERROR_UNKNOWN" for codes not listed)."""
    return ERROR_NAMES.get(code, "ACL_ERROR_UNKNOWN")


def acl_error(acl: Any, code: int, what: str) -> BackendError:
    """A BackendError for `what` returning `code`, with the runtime's own last message."""
    try:
        detail = str(acl.get_recent_err_msg() or "").strip()
    except Exception:  # the message is a courtesy; never mask the real error
        detail = ""
    name = error_name(code)
    message = f"{what} failed: {name} ({code})" + (f": {detail}" if detail else "")
    return BackendError(message, code=code, name=name)


def null_error(acl: Any, what: str) -> BackendError:
    """A BackendError for a call that returned a NULL handle (such calls have no code)."""
    error = acl_error(acl, 0, what)
    message = str(error).replace(f"failed: {error.name} (0)", "returned NULL")
    return BackendError(message, name="ACL_NULL_HANDLE")


def check(acl: Any, ret: int, what: str) -> None:
    """Raise `acl_error` unless `ret` is ACL_SUCCESS."""
    if ret != ACL_SUCCESS:
        raise acl_error(acl, ret, what)


def import_acl() -> Any:
    """The real pyACL module, or a LoadError saying how to get it."""
    try:
        module = importlib.import_module("acl")
    except ImportError as e:
        raise LoadError(
            f"pyACL (module 'acl', shipped with Huawei CANN) is not importable: {e}. Install the "
            f"CANN toolkit and run `{CANN_SETUP}` before starting Python. (The PyPI package "
            "named 'acl' is unrelated; do not pip install it.)",
            name="ACL_NOT_FOUND",
        ) from e
    if not all(hasattr(module, attr) for attr in ("rt", "mdl", "init")):
        raise LoadError(
            f"the 'acl' module at {getattr(module, '__file__', '?')} is not pyACL (PyPI's 'acl' "
            f"is an unrelated package: pip uninstall acl, then `{CANN_SETUP}`)",
            name="ACL_NOT_FOUND",
        )
    return module
