"""The backend interface: everything device-specific sits behind these two small types.

Adding hardware means implementing `Backend` and `Session`; no other layer changes.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

import numpy as np

from inferchain.closing import Closing
from inferchain.config import ModelConfig
from inferchain.tensors import StateRows, TensorDesc


class Session(Closing, abc.ABC):
    """One loaded model instance, used only from its ModelWorker's thread.

    `run` is synchronous from the caller's point of view: it returns after the device work is
    complete and the outputs are on the host. The arrays it returns may be reused buffers,
    valid until the next `run` call; callers copy what they keep.
    """

    # in the order `run` takes them; the batch dim is on each input's batch axis (the
    # recipe's `inputs: {NAME: {batch_axis: K}}`, default 0; see `inferchain.layout`)
    inputs: tuple[TensorDesc, ...]
    outputs: tuple[TensorDesc, ...]  # in the order `run` returns them
    max_batch_size: int | None = None  # largest batch the loaded model accepts; None = any
    reuses_outputs: bool = True  # run() returns the same host buffers each call
    metadata: Mapping[str, str] = {}  # the model file's custom metadata, where it has any
    # how the runtime runs the model, as it reports it (e.g. {"threads": "1", "streams": "1",
    # "precision": "f32"}), for `inferchain info`; empty where it tells nothing
    settings: Mapping[str, str] = {}
    last_stages: Mapping[str, float] | None = None  # seconds per stage of the last run
    # (e.g. {"h2d": ..., "compute": ..., "d2h": ...}) where the backend can tell
    # inputs (indices) that `launch` also takes as rows of `inferchain.DeviceTensor`s (an
    # object array, one per row: the recipe's `from:` on a backend that keeps them on the
    # device); empty where outputs are handed over as plain arrays
    handed_inputs: frozenset[int] = frozenset()

    @abc.abstractmethod
    def run(self, inputs: Sequence[np.ndarray], batch_size: int) -> list[np.ndarray]:
        """Run one batch. `inputs` are in `self.inputs` order and in the model's layout:
        `batch_size` rows on each input's batch axis, an unbatched input's one value as the
        model declares it. `batch_size` 0: a model that does not batch; its inputs are whole
        and go to the runtime untouched.

        A model compiled for a fixed batch larger than `batch_size` is padded by the session;
        the outputs have at least `batch_size` rows on their batch axis, of which the first
        `batch_size` count.
        """

    def padded_rows(self, rows: int) -> int:
        """The rows the model runs for a batch of `rows` (a fixed batch, or the gear the
        batch takes); by default `rows` (nothing padded)."""
        return rows

    def take_device_spans(self) -> tuple[tuple[float, float], ...]:
        """When the device ran the batches collected since the last call: (start, end) in
        `time.perf_counter` seconds each, oldest first, from the device's own timeline (the
        acl backend's stream events); () where the backend cannot tell, and the worker's own
        times stand for the device's."""
        return ()

    # -- streams: batches in flight at once ------------------------------------------------
    #
    # A session with `num_streams` K > 1 keeps K independent sets of device buffers, each
    # with its own device stream, so the copies of one batch overlap the compute of another.
    # The ExecutionEngine assigns each batch a free stream of a worker; the worker calls
    # `launch(inputs, n, stream)`, may launch on other streams, and later `collect(stream)`.
    # `inputs` must stay untouched until that stream is collected. The default (K = 1) runs
    # the batch inside `collect`, so a backend that only implements `run` needs nothing more.

    num_streams: int = 1  # batches this session can have in flight at once
    _launched: tuple[Sequence[np.ndarray], int]  # the default launch: run at collect()

    def launch(
        self,
        inputs: Sequence[np.ndarray],
        batch_size: int,
        stream: int,
        state: StateRows | None = None,
    ) -> None:
        """Start one batch on `stream` (0 <= stream < num_streams) without waiting for it.

        `state` (only after `open_state` said yes): the batch is sequence steps whose
        carried inputs come from the session's device lanes (the host rows of those
        inputs count only where `state.fresh`), and whose carried outputs go back there;
        `collect` then returns only the outputs that are not carried."""
        if state is not None:
            raise TypeError(f"{type(self).__name__} keeps no sequence state")
        self._launched = (inputs, batch_size)

    def collect(self, stream: int) -> list[np.ndarray]:
        """Wait for the batch launched on `stream`; its outputs, as `run` returns them."""
        inputs, batch_size = self._launched
        return self.run(inputs, batch_size)

    # -- sequence state kept on the device ------------------------------------------------

    def open_state(
        self, carried: Sequence[tuple[int, int]], lanes: int, constant: Sequence[int] = ()
    ) -> bool:
        """Keep the carried state of `lanes` sequence lanes in device memory: `carried`
        is (output index, input index) per state pair. False (the default) where the
        session cannot: the state then stays in host memory and goes in and out with
        every step. `constant`: inputs (their indices) that keep one value over a
        sequence, which the session may keep in device lanes too, taking each sequence's
        value from its first step's rows (`StateRows.fresh`, at its `home` lane). Called on
        the session's thread, again after a re-load."""
        return False

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything the session holds, in the runtime's safe order."""


class Backend(abc.ABC):
    """One device runtime for the whole process (one runtime init, many models)."""

    name: str
    thread_affine: bool = True  # sessions must stay on the thread that loaded them (pyACL)

    @abc.abstractmethod
    def load(self, model: ModelConfig, device: int) -> Session:
        """Load one instance of `model` on `device`; called on the worker's own thread."""

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing global
        """Release process-wide runtime state after every session is closed."""
