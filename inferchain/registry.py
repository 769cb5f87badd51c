"""The models' registry: each model's workers, what `init()` learnt, the `from:` checks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import numpy as np

from inferchain.backends.base import Backend, Session
from inferchain.config import ModelConfig, Recipe, split_from
from inferchain.core.state_pool import StatePool
from inferchain.core.step_batcher import STEP_COHORTS, StepBatcher
from inferchain.core.worker import ModelWorker, Outbox
from inferchain.core.workers import stop_all
from inferchain.errors import ConfigError
from inferchain.inputs import InputSpec
from inferchain.layout import Layout
from inferchain.memory import MemoryPlan, plan
from inferchain.metrics import ModelMetrics
from inferchain.shapes import ShapePolicy
from inferchain.tensors import ModelInfo


@attrs.define
class LoadedModel:
    """One model of a running OfflineInference."""

    config: ModelConfig
    workers: list[ModelWorker]  # one per instance, each with its own thread and session
    spec: InputSpec  # what one item must look like (checked at submit)
    shapes: ShapePolicy  # which batch an item joins
    info: ModelInfo  # inputs, outputs, metadata
    memory: MemoryPlan  # its row of the memory budget table
    pool: StatePool | None = None  # a stateful model's sequence lanes (recipe `state:`)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.info.outputs)

    @property
    def step_names(self) -> tuple[str, ...]:
        """The outputs a sequence step gives: all but the carried ones where the state
        stays in device lanes."""
        pool = self.pool
        if pool is None or not pool.on_device:
            return self.output_names
        carried = {out for out, _, _ in pool.carried}
        return tuple(n for i, n in enumerate(self.output_names) if i not in carried)


def load_models(recipe: Recipe, backend: Backend, outbox: Outbox) -> dict[str, LoadedModel]:
    """Start every worker (all models load at once; each posts its results to `outbox`),
    read each model's description, check its memory plan and warm its shapes up. On any
    failure, stop what started and re-raise."""
    workers = {
        m.name: [ModelWorker(m, i, backend, recipe.device, outbox) for i in range(m.instances)]
        for m in recipe.models
    }
    try:
        for w in all_workers(workers.values()):
            w.start()
        models = {m.name: _describe(m, workers[m.name]) for m in recipe.models}
        check_handovers(recipe, models)
        for model in models.values():
            model.pool = state_pool(model, recipe)
            for w in model.workers:
                w.pool = model.pool
        for model in models.values():  # warm-up runs on every worker thread at once
            # the state may live in each session's device lanes (with several instances,
            # each keeps the sequences of its partition of the lanes)
            device_state = model.pool is not None
            for w in model.workers:  # the first one checks what the model really returns
                w.prepare(
                    model.shapes,
                    warm=model.config.warmup,
                    device_state=device_state,
                    probe=w.index == 0,
                )
            pool = model.pool
            if pool is not None and all(w.state_on_device for w in model.workers):
                pool.on_device = True
                pool.max_rows = min(pool.size, model.config.batch_rows)
                pool.partition(len(model.workers))
    except ConfigError as e:  # checked against a loaded model: name the recipe file too
        stop_all(all_workers(workers.values()))
        source = str(recipe.source)
        raise (e if str(e).startswith(source) else ConfigError(f"{source}: {e}")) from e
    except BaseException:
        stop_all(all_workers(workers.values()))
        raise
    return models


def check_handovers(recipe: Recipe, models: Mapping[str, LoadedModel]) -> None:
    """Every `from:` against the loaded models: the producer has the output, with its rows
    on axis 0 and a fixed item shape, and the consumer's input takes that shape and dtype.
    `ConfigError` naming the key, the models, the expected and the actual else."""
    for i, consumer in enumerate(recipe.models):
        for name, config in consumer.inputs.items():
            if config.from_output is None:
                continue
            where = f"key 'models[{i}].inputs.{name}.from'"
            found = split_from(config.from_output, models)
            assert found is not None  # checked by Recipe.from_dict
            producer, output = models[found[0]], found[1]
            outputs = {t.name: t for t in producer.info.outputs}
            if output not in outputs:
                raise ConfigError(
                    f"{where}: model {found[0]!r} has no output {output!r} (outputs: "
                    f"{list(outputs)})"
                )
            given = producer.config.outputs.get(output)
            if given is not None and given.batch_axis != 0:
                raise ConfigError(
                    f"{where}: output {config.from_output!r} has its rows on axis "
                    f"{given.batch_axis}; a hand-over takes rows on axis 0"
                )
            made = outputs[output]
            item = made.shape[1:] if made.shape else None
            spec = _consumer_spec(models[consumer.name], name, where)
            shape, dtype = spec
            if item is None or None in item or None in shape:
                raise ConfigError(
                    f"{where}: {config.from_output!r} ({made.describe()}) and input {name!r} "
                    f"of model {consumer.name!r} need fixed item shapes to hand rows over"
                )
            if tuple(item) != tuple(shape) or made.dtype != dtype:
                raise ConfigError(
                    f"{where}: model {consumer.name!r} input {name!r} expects "
                    f"{dtype.name}{list(shape)} per item, output {config.from_output!r} gives "
                    f"{made.dtype.name}{list(item)}"
                )


def _consumer_spec(
    model: LoadedModel, name: str, where: str
) -> tuple[tuple[int | None, ...], np.dtype[Any]]:
    """The item shape and dtype the consumer's input `name` takes."""
    spec = model.spec
    if name not in spec.names:
        raise ConfigError(
            f"{where}: {name!r} is not an input of model {model.config.name!r} (inputs: "
            f"{list(spec.names)})"
        )
    k = spec.names.index(name)
    return tuple(spec.shapes[k]), spec.dtypes[k]


def describe(model: ModelConfig, session: Session) -> tuple[ModelInfo, ShapePolicy, MemoryPlan]:
    """What a loaded session tells about `model`: its IO, its shape policy (with the layout
    of its batch axes), its memory plan (every known bucket counted). `init()` and
    `inferchain info` both use it."""
    layout = Layout.of(model, session.inputs, session.outputs)
    shapes = ShapePolicy(model, session.inputs, session.outputs, layout)
    info = ModelInfo(
        model.name,
        session.inputs,
        session.outputs,
        model.max_batch_size,
        model.instances,
        dict(session.metadata),
    )
    memory = plan(model, session.inputs, session.outputs, shapes.warm_keys(), layout)
    return info, shapes, memory


def _describe(model: ModelConfig, workers: list[ModelWorker]) -> LoadedModel:
    sessions = [w.wait_ready() for w in workers]  # every instance must have loaded
    session = sessions[0]
    info, shapes, memory = describe(model, session)
    memory.check()
    if model.max_batch_size > 0:
        shapes.layout.check_batchable(model.name, session.inputs)
    return LoadedModel(
        config=model,
        workers=workers,
        spec=InputSpec(
            model.name,
            session.inputs,
            batching=model.max_batch_size > 0,
            reject_nonfinite=model.nonfinite == "reject",
            layout=shapes.layout,
            handed=session.handed_inputs,
        ),
        shapes=shapes,
        info=info,
        memory=memory,
    )


def state_pool(model: LoadedModel, recipe: Recipe) -> StatePool | None:
    """The lanes of a model with `state:` pairs, checked against the loaded model."""
    config = model.config
    if not config.state:
        if config.constant:
            raise ConfigError(
                f"{recipe.source}: model {config.name!r} key 'constant': inputs constant over "
                "a sequence need a stateful model (key 'state')"
            )
        return None
    where = f"{recipe.source}: model {config.name!r} key 'state'"
    outputs = model.output_names
    spec = model.spec
    carried = []
    for out, name in config.state.items():
        if out not in outputs:
            raise ConfigError(
                f"{where}: {out!r} is not an output of the model (outputs: {list(outputs)})"
            )
        if name not in spec.names:
            raise ConfigError(
                f"{where}: {name!r} is not an input of the model (inputs: {list(spec.names)})"
            )
        i = spec.names.index(name)
        if None in spec.shapes[i]:
            raise ConfigError(
                f"{where}: input {name!r} has a dynamic item shape {spec.shapes[i]}; a carried "
                "state needs a fixed one"
            )
        carried.append((outputs.index(out), i, name))
    shapes = [tuple(int(d) for d in spec.shapes[i]) for _, i, _ in carried]  # type: ignore[arg-type]
    dtypes = [spec.dtypes[i] for _, i, _ in carried]
    constant = _constant_inputs(model, recipe, {i for _, i, _ in carried})
    return StatePool(config.name, carried, shapes, dtypes, config.max_sequences, constant)


def _constant_inputs(model: LoadedModel, recipe: Recipe, carried: set[int]) -> list[int]:
    """The indices of the recipe's `constant:` inputs, checked against the loaded model."""
    where = f"{recipe.source}: model {model.config.name!r} key 'constant'"
    names = model.spec.names
    found = []
    for name in model.config.constant:
        if name not in names:
            raise ConfigError(
                f"{where}: {name!r} is not an input of the model (inputs: {list(names)})"
            )
        i = names.index(name)
        if i in carried:
            raise ConfigError(f"{where}: {name!r} is a carried input (key 'state'), not a constant")
        if i in model.spec.unbatched:
            raise ConfigError(f"{where}: {name!r} is unbatched (batched: false), not per sequence")
        found.append(i)
    return found


def step_batcher(model: LoadedModel, metrics: ModelMetrics) -> StepBatcher:
    """The step queue of a stateful model (after `state_pool`)."""
    assert model.pool is not None
    config = model.config
    return StepBatcher(
        model.pool,
        model.spec,
        names=model.step_names,
        shapes=model.shapes,
        batch_rows=config.batch_rows,
        delay_s=config.max_queue_delay_ms / 1000.0,
        cohorts=max(STEP_COHORTS, config.instances),
        record=metrics.record_steps_formed,
    )


def all_workers(groups: Iterable[list[ModelWorker]]) -> list[ModelWorker]:
    return [w for group in groups for w in group]
