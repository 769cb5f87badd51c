"""FakeAcl's argument parsing: pyACL's `PyArg_ParseTuple` formats, so a call that would raise
TypeError on the card raises it here too.

Every pyACL function is a C function that takes positional arguments only and parses them
with a format string (read from pyACL's C wrappers):

- `k` / `K` (pointers, handles, sizes): an `int` exactly (bool counts, it subclasses int);
  anything else, `numpy.int64` included, is `TypeError: argument N must be int, not T`.
  Negative values wrap around to unsigned 64 bits (no error).
- `i` (device ids, kinds, policies): anything with `__index__` (numpy ints pass), range
  checked to int32 (OverflowError beyond). `I` (model ids): same, wrapped to 32 bits.
- `s` (paths, names): a `str` without NUL characters; `None` is a TypeError.
- `O`: any object. A `|` makes the rest optional.
Keyword arguments are always a TypeError.
"""

from __future__ import annotations

import operator
from typing import Any

_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


def parse(name: str, fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """`args` converted as pyACL's `PyArg_ParseTuple(args, fmt)` would, or TypeError."""
    if kwargs:
        raise TypeError(f"acl.{name}() takes no keyword arguments")
    required, _, optional = fmt.partition("|")
    codes = required + optional
    if not len(required) <= len(args) <= len(codes):
        raise TypeError(_count_message(len(required), len(codes), len(args)))
    pairs = zip(codes, args, strict=False)  # optional codes may be left out
    return tuple(_convert(code, value, i) for i, (code, value) in enumerate(pairs, 1))


def _count_message(least: int, most: int, given: int) -> str:
    if least == most:
        plural = "" if least == 1 else "s"
        return f"function takes exactly {least} argument{plural} ({given} given)"
    if given < least:
        return f"function takes at least {least} arguments ({given} given)"
    return f"function takes at most {most} arguments ({given} given)"


def _convert(code: str, value: object, position: int) -> object:
    if code in "kK":
        if not isinstance(value, int):
            raise TypeError(f"argument {position} must be int, not {_type_name(value)}")
        return int(value) & _U64
    if code in "iI":
        if isinstance(value, float):
            raise TypeError("'float' object cannot be interpreted as an integer")
        number = operator.index(value)  # type: ignore[arg-type]  # TypeError as CPython's
        if code == "I":
            return number & _U32
        if number > _I32_MAX:
            raise OverflowError("signed integer is greater than maximum")
        if number < _I32_MIN:
            raise OverflowError("signed integer is less than minimum")
        return number
    if code == "s":
        if not isinstance(value, str):
            raise TypeError(f"argument {position} must be str, not {_type_name(value)}")
        if "\0" in value:
            raise ValueError("embedded null character")
        return value
    if code == "O":
        return value
    raise AssertionError(f"unknown format code {code!r}")  # a bug in the fake itself


def _type_name(value: object) -> str:
    if value is None:
        return "None"
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"
