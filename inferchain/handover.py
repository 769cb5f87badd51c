"""Model outputs handed to a later model without a trip through the host.

A recipe declares it on the consuming model's input (`inputs: {x: {from: embed.y}}`: input
`x` takes output `y` of the earlier model `embed` unchanged). Where the backend can keep the
output in device memory (acl), each row of it comes back as a `DeviceTensor`, a handle that a
pipeline passes to the next model's `submit` as it would pass the array; that model's input is
then filled on the device (a device-to-device copy), and the output never goes to the host.
Elsewhere (onnxruntime) the output is a plain array and is handed over as it is. Either way
the results are the same. (`init()` checks each `from:` against the loaded models:
`registry.check_handovers`.)

A DeviceTensor keeps its device memory while anything refers to it (the request's outputs,
the consuming work, `np.asarray(t)` aside): the memory is reused only after the last
reference is gone, and never while a consumer's copy from it may still run.
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol

import numpy as np


class Holder(Protocol):
    """What keeps the device memory of some DeviceTensors (a backend's, e.g. one batch of a
    model's output on an acl device)."""

    @property
    def alive(self) -> bool:
        """False once the memory is gone (its session was closed or re-loaded)."""

    def fetch(self, row: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """A host copy of row `row`."""


class DeviceTensor:
    """One item's output of a model, kept in device memory for the model that takes it.

    Pass it to `submit` (or `infer`, `map`, ...) of the model whose input names its output
    in `from:`; that input is then filled on the device. `numpy()` (or `np.asarray(t)`)
    copies it to the host. It cannot be pickled: it lives in this process's device memory.
    """

    __slots__ = ("_holder", "_row", "dtype", "shape", "source")

    def __init__(
        self,
        source: str,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        holder: Holder,
        row: int,
    ) -> None:
        self.source = source  # "MODEL.OUTPUT" it is a row of
        self.shape = shape  # the item's shape (no batch dim)
        self.dtype = dtype
        self._holder = holder
        self._row = row  # its row in the holder's batch

    @property
    def holder(self) -> Holder:
        """What keeps its memory (for the backend that reads it)."""
        return self._holder

    @property
    def row(self) -> int:
        """Its row in the holder's batch."""
        return self._row

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def alive(self) -> bool:
        """False once its device memory is gone (its model's session closed or re-loaded)."""
        return self._holder.alive

    def numpy(self) -> np.ndarray:
        """A host copy (one device-to-host copy)."""
        return self._holder.fetch(self._row, self.shape, self.dtype)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"a DeviceTensor ({self.source}) lives in this process's device memory and does "
            "not pickle: np.asarray(tensor) gives a host copy"
        )

    def __repr__(self) -> str:
        where = "on the device" if self.alive else "released"
        return f"DeviceTensor({self.source}, {self.dtype.name}{list(self.shape)}, {where})"
