"""`threads: auto`: a recipe's instances, session threads and host workers chosen for the
cores this process may use, at `OfflineInference(...)`.

The plan, on a CPU (backend `onnxruntime` with CPU providers only, or `openvino`):

- every session runs one intra-op and one inter-op thread that do not spin: a batch of many
  rows keeps a one-thread session busy, a thread pool per session only adds synchronisation,
  and a spinning thread takes the core the host threads (decode, pre-processing, steps of
  sequences) need;
- every model gets one instance per core (at most `MAX_INSTANCES`): an instance with no work
  sleeps, so the models of a pipeline each use every core in turn;
- the pipeline's host steps get a thread per core (at most `MAX_HOST_WORKERS`), except where
  a model batches `fill` (its batches follow the order items come in: the caller's thread).

Measured on 2 cores (benchmarks/bench_orientation.py and the OCR recipe, `oi.run`, one
process per setting, interleaved): two one-thread instances 1.00, one two-thread instance
that does not spin 0.94, one that spins 0.82, two two-thread instances 0.89; OCR with every
model at two instances 1.02x the det 1 / cls 1 / rec 2 set by hand.

A recipe on a device (acl, or onnxruntime with a CUDA or CANN provider) keeps what it says:
there the device runs the model, and its instances and streams are the device's. What the
plan chose and why is `OfflineInference.thread_plan` (`inferchain info` prints it).
"""

from __future__ import annotations

import os

import attrs

from inferchain.config import Recipe, SessionOptions

MAX_INSTANCES = 16  # a session (and its buffers) per instance: past this, say `instances:`
MAX_HOST_WORKERS = 16


@attrs.frozen
class ThreadPlan:
    """What `threads: auto` chose for a recipe on `cores` cores, and why."""

    cores: int
    instances: dict[str, int]  # model -> instances
    host_workers: int | None  # None: the recipe's or the pipeline's own
    why: str

    def lines(self) -> list[str]:
        """The plan as `inferchain info` prints it."""
        models = ", ".join(f"{m} x{n}" for m, n in self.instances.items())
        host = "as the recipe says" if self.host_workers is None else str(self.host_workers)
        return [
            f"threads: auto on {self.cores} cores: instances {models or '(as written)'}; "
            f"host workers {host}",
            f"  why: {self.why}",
        ]


def visible_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def on_cpu(recipe: Recipe) -> bool:
    """The recipe's models run on the host's cores (not on a device)."""
    if recipe.backend == "openvino":
        return True
    if recipe.backend != "onnxruntime":
        return False
    return all(name == "CPUExecutionProvider" for name in recipe.provider_names)


def plan(recipe: Recipe, cores: int) -> ThreadPlan:
    """The plan for `recipe` on `cores` cores (see the module docstring)."""
    if not on_cpu(recipe):
        why = f"backend {recipe.backend} with {list(recipe.providers)}: a device runs the models"
        return ThreadPlan(cores, {}, None, why + "; instances and streams as written")
    per_model = min(max(cores, 1), MAX_INSTANCES)
    instances = {m.name: per_model for m in recipe.models}
    host: int | None = recipe.host_workers
    if host is None and recipe.pipeline:
        fill = any(m.batching == "fill" for m in recipe.models)
        host = 0 if fill else min(max(cores, 2), MAX_HOST_WORKERS)
    why = (
        "one-thread sessions that do not spin, one instance per core for every model "
        f"(at most {MAX_INSTANCES}); host steps on a thread per core"
    )
    if host == 0:
        why += " (a model batches `fill`: on the caller's thread, in input order)"
    return ThreadPlan(cores, instances, host, why)


def planned(recipe: Recipe, cores: int | None = None) -> tuple[Recipe, ThreadPlan | None]:
    """`recipe` with its `threads: auto` plan applied (and the plan), or as it is."""
    if recipe.threads != "auto":
        return recipe, None
    chosen = plan(recipe, visible_cores() if cores is None else cores)
    if not chosen.instances:
        return recipe, chosen
    models = tuple(
        attrs.evolve(
            m,
            instances=chosen.instances[m.name],
            session_options=None if m.session_options is None else _one_thread(m.session_options),
        )
        for m in recipe.models
    )
    recipe = attrs.evolve(
        recipe,
        models=models,
        session_options=_one_thread(recipe.session_options),
        host_workers=chosen.host_workers,
    )
    return recipe, chosen


def _one_thread(options: SessionOptions) -> SessionOptions:
    return attrs.evolve(
        options, intra_op_num_threads=1, inter_op_num_threads=1, allow_spinning=False
    )
