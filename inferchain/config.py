"""Recipes: the YAML that says which models run, how, and with which pipeline.

`load_recipe()` validates everything on load: an unknown key or a wrong type is a
`ConfigError` that names the key and the file. The records are frozen; overrides make a new
recipe. `import_recipe_module()` imports a recipe folder's own modules (its pipeline's).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import math
import reprlib
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import attrs

from inferchain.errors import ConfigError
from inferchain.extras import install_hint
from inferchain.recipe_yaml import parse_yaml

_ORT_LEVELS = ("disable", "basic", "extended", "all")
_STRATEGIES = ("fixed", "dynamic", "buckets", "auto", "longest")
BACKENDS = ("onnxruntime", "openvino", "acl")  # what a recipe's `backend:` may name
PRECISIONS = ("f32", "bf16", "f16")  # what a model's `precision:` may ask for


class _Schema:
    """Typed construction from plain dicts; `KEYS` maps key -> expected type."""

    KEYS: ClassVar[Mapping[str, object]] = {}
    FIELDS: ClassVar[Mapping[str, str]] = {}  # key -> attribute, where they differ ("from")

    @classmethod
    def from_dict(cls, data: object, where: str, source: Path) -> Any:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: {where or 'recipe'} must be a mapping, got {_tn(data)}")
        kwargs = {}
        for key, value in data.items():
            path = f"{where}.{key}" if where else str(key)
            if key not in cls.KEYS:
                raise ConfigError(f"{source}: unknown key {path!r}{_did_you_mean(key, cls.KEYS)}")
            kwargs[cls.FIELDS.get(key, key)] = _coerce(value, cls.KEYS[key], path, source)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{source}: {where or 'recipe'}: {e}") from None


def _did_you_mean(key: object, known: Iterable[str]) -> str:
    """` (did you mean `max_batch_size`?; known: ...)` for a misspelled key."""
    names = sorted(known)
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?; " if close else ""
    return f" ({hint}known: {', '.join(names)})"


def _tn(value: object) -> str:
    return type(value).__name__


_SHORT = reprlib.Repr()  # a value in a message: bounded, however large (YAML aliases) it is
_SHORT.maxstring = _SHORT.maxother = 120
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 6
_SHORT.maxlevel = 2


def _show(value: object) -> str:
    """`TYPE REPR` of a value for a message, its repr cut short."""
    return f"{_tn(value)} {_SHORT.repr(value)}"


@attrs.frozen
class _NamesTo:
    """A key's type: a mapping of names (of a model's inputs or outputs) to `schema` records."""

    schema: type[_Schema]
    what: str  # what the names are, for messages: "input", "output"


def _coerce(value: object, spec: object, path: str, source: Path) -> object:
    if isinstance(spec, type) and issubclass(spec, _Schema):
        return spec.from_dict(value, path, source)
    if isinstance(spec, _NamesTo):
        return _names_to(value, spec, path, source)
    if isinstance(spec, tuple):  # alternatives, e.g. (float, None)
        if value is None and None in spec:
            return None
        for option in spec:
            if option is not None and _is(value, option):
                return _coerce(value, option, path, source)
        names = " or ".join("null" if s is None else getattr(s, "__name__", str(s)) for s in spec)
        raise ConfigError(f"{source}: key {path!r} must be {names}, got {_show(value)}")
    if spec is float and _is(value, int):
        return float(value)  # type: ignore[arg-type]
    if not _is(value, spec):
        name = getattr(spec, "__name__", str(spec))
        raise ConfigError(f"{source}: key {path!r} must be {name}, got {_show(value)}")
    if spec is list:
        return tuple(value)  # type: ignore[arg-type]
    return value


def _names_to(value: object, spec: _NamesTo, path: str, source: Path) -> dict[str, Any]:
    keys = ", ".join(sorted(spec.schema.KEYS))
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{source}: key {path!r} must be a mapping of {spec.what} names to {{{keys}}}, "
            f"got {_show(value)}"
        )
    out = {}
    for name, entry in value.items():
        if not isinstance(name, str):
            raise ConfigError(f"{source}: key {path!r}: {spec.what} name {name!r} is not a string")
        out[name] = spec.schema.from_dict(entry, f"{path}.{name}", source)
    return out


def _is(value: object, spec: object) -> bool:
    if (isinstance(spec, type) and issubclass(spec, _Schema)) or isinstance(spec, _NamesTo):
        return isinstance(value, Mapping)
    if spec is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if spec is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(spec, type) and isinstance(value, spec)


def _finite(name: str, value: float | None) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value} (NaN or infinity)")


def _positive(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    _finite(attribute.name, value)
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


def _non_negative(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    _finite(attribute.name, value)
    if value is not None and value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


def _share(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    _finite(attribute.name, value)
    if value is not None and not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be between 0 and 1, got {value}")


MAX_THREADS = 1024  # threads, processes, instances, streams one recipe key may ask for


def _threads(low: int) -> Any:
    """A count of threads (or processes, instances, streams, device blocks kept for a
    hand-over: each a resource made at `init()`) from `low` to `MAX_THREADS`."""

    def check(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
        if value is not None and not low <= value <= MAX_THREADS:
            raise ValueError(f"{attribute.name} must be from {low} to {MAX_THREADS}, got {value}")

    return check


def _a_name(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
    """A recipe's name names its default output folder (`out/NAME`): a name, not a path."""
    if not value or value in (".", "..") or any(c in value for c in "/\\\0"):
        raise ValueError(
            f"{attribute.name} must be a name (no '/', '\\', NUL; not '.' or '..'), got {value!r}"
        )


def _severity(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and not 0 <= value <= 4:
        raise ValueError(
            f"{attribute.name} must be 0 (verbose), 1 (info), 2 (warning), 3 (error) or "
            f"4 (fatal), got {value}"
        )


def _names_to_names(_: object, attribute: attrs.Attribute[Any], value: dict[str, Any]) -> None:
    bad = {k: v for k, v in value.items() if not (isinstance(k, str) and isinstance(v, str))}
    if bad:
        shown = _SHORT.repr(bad)
        raise ValueError(f"{attribute.name} must map output names to input names, got {shown}")


def _backend_files(_: object, attribute: attrs.Attribute[Any], value: dict[str, Any]) -> None:
    bad = {k: v for k, v in value.items() if not (k in BACKENDS and isinstance(v, str))}
    if bad:
        known = ", ".join(BACKENDS)
        raise ValueError(
            f"{attribute.name} must map backends ({known}) to model files, got {_SHORT.repr(bad)}"
        )


def _names(_: object, attribute: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    bad = [v for v in value if not isinstance(v, str)]
    if bad or len(set(value)) != len(value):
        shown = _SHORT.repr(list(value))
        raise ValueError(f"{attribute.name} must list distinct input names, got {shown}")


def _one_of(*options: str) -> Any:
    def check(_: object, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in options:
            known = ", ".join(options)
            raise ValueError(f"{attribute.name} must be one of {known}, got {_SHORT.repr(value)}")

    return check


@attrs.frozen
class SessionOptions(_Schema):
    """ONNX Runtime session options; OpenVINO takes those that mean the same to it and
    refuses the rest (`inferchain.backends.openvino`); acl ignores them. 0 threads = the
    runtime's default."""

    KEYS: ClassVar[Mapping[str, object]] = {
        "intra_op_num_threads": int,
        "inter_op_num_threads": int,
        "graph_optimization_level": str,
        "execution_mode": str,
        "allow_spinning": bool,
        "log_severity_level": (int, None),
    }
    intra_op_num_threads: int = attrs.field(default=0, validator=_threads(0))
    inter_op_num_threads: int = attrs.field(default=0, validator=_threads(0))
    graph_optimization_level: str = attrs.field(default="all", validator=_one_of(*_ORT_LEVELS))
    execution_mode: str = attrs.field(
        default="sequential", validator=_one_of("sequential", "parallel")
    )
    # idle intra-op threads spin for new work (ONNX Runtime's default); false: they sleep,
    # leaving the cores to the host's Python (steps of sequences) and to other models
    allow_spinning: bool = True
    # onnxruntime's own log for this session: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal;
    # None follows the process default (`inferchain --log-level` sets it)
    log_severity_level: int | None = attrs.field(default=None, validator=_severity)


@attrs.frozen
class ToleranceConfig(_Schema):
    """How far a model's outputs at a lower `precision` may be from its outputs at f32, on
    its `reference:` inputs (or seeded random ones): the measures `inferchain compare`
    reports. Each output must pass every measure given; null leaves one out."""

    KEYS: ClassVar[Mapping[str, object]] = {
        "rtol": (float, None),
        "atol": (float, None),
        "cosine": (float, None),
        "top_k": (int, None),
        "agreement": float,
    }
    # elementwise: |low - f32| <= atol + rtol * |f32| (both null: not checked)
    rtol: float | None = attrs.field(default=1e-2, validator=_non_negative)
    atol: float | None = attrs.field(default=1e-2, validator=_non_negative)
    # the least cosine similarity of each output with f32's
    cosine: float | None = attrs.field(default=None, validator=_share)
    # classifiers: the k best classes (last axis) of a row, in order, the same as at f32 ...
    top_k: int | None = attrs.field(default=None, validator=_positive)
    # ... on at least this share of the rows (1.0: every row)
    agreement: float = attrs.field(default=1.0, validator=_share)

    @property
    def elementwise(self) -> bool:
        """Whether elements are checked one by one (`rtol` or `atol` given)."""
        return self.rtol is not None or self.atol is not None


@attrs.frozen
class ShapesConfig(_Schema):
    """How a model's variable input shapes are grouped into batches."""

    KEYS: ClassVar[Mapping[str, object]] = {
        "strategy": str,
        "buckets": (list, None),
        "pad_value": float,
        "num_buckets": int,
        "sample": int,
        "crop_outputs": (list, None),
    }
    strategy: str = attrs.field(default="dynamic", validator=_one_of(*_STRATEGIES))
    buckets: tuple[Any, ...] | None = None  # per bucket, the item shape of each input
    pad_value: float = 0.0
    num_buckets: int = attrs.field(default=4, validator=_positive)  # for `auto`
    sample: int = attrs.field(default=256, validator=_positive)  # for `auto`
    crop_outputs: tuple[Any, ...] | None = None  # outputs whose dims follow the input's


@attrs.frozen
class InputConfig(_Schema):
    """Where one model input holds the rows of a batch (recipe key `inputs: {NAME: {...}}`).

    Inside inferchain an item never has the batch dimension: its shape is the model's shape
    without `batch_axis`. An unbatched input (`batched: false`) takes one value for the whole
    batch, as the model declares it; rows share a batch only when that value is equal. `pad`
    is what padding fills this input with (shape strategies that pad). `from: MODEL.OUTPUT`
    says the input takes an earlier model's output unchanged: on acl that output stays in
    device memory for it (`inferchain.handover`); `batches` is how many of the producer's
    batches of it may wait there for their consumers at once (default 16).
    """

    KEYS: ClassVar[Mapping[str, object]] = {
        "batch_axis": int,
        "batched": bool,
        "pad": (float, bool, None),
        "from": (str, None),
        "batches": (int, None),
    }
    FIELDS: ClassVar[Mapping[str, str]] = {"from": "from_output"}
    batch_axis: int = attrs.field(default=0, validator=_non_negative)  # the model's dim of rows
    batched: bool = True  # False: one value per batch (e.g. a sampling rate), no batch dim
    # the value padded rows get in this input (default: the model's `shapes.pad_value`);
    # true / false for a mask
    pad: float | bool | None = None
    from_output: str | None = None  # recipe key `from`: "MODEL.OUTPUT" of an earlier model
    batches: int | None = attrs.field(default=None, validator=_threads(1))  # kept on the device

    def __attrs_post_init__(self) -> None:
        if not self.batched and self.batch_axis != 0:
            raise ValueError(
                f"batch_axis {self.batch_axis} given for an input with batched: false "
                "(an unbatched input has no batch axis)"
            )
        if self.from_output is None:
            if self.batches is not None:
                raise ValueError("batches is the number kept for `from:`, given without it")
        elif not self.batched or self.batch_axis != 0:
            raise ValueError(
                f"from {self.from_output!r}: an input taking another model's output has its "
                "rows on axis 0 (no batch_axis, not batched: false)"
            )


@attrs.frozen
class OutputConfig(_Schema):
    """Where one model output holds the rows of a batch (recipe key `outputs: {NAME: {...}}`);
    inferchain moves them to axis 0 before it splits the outputs by row."""

    KEYS: ClassVar[Mapping[str, object]] = {"batch_axis": int}
    batch_axis: int = attrs.field(default=0, validator=_non_negative)  # the model's dim of rows


@attrs.frozen
class HealthConfig(_Schema):
    """When a worker counts as unhealthy, and what its model's requests do meanwhile."""

    KEYS: ClassVar[Mapping[str, object]] = {"max_failures": int, "while_unhealthy": str}
    max_failures: int = attrs.field(default=3, validator=_positive)  # failed batches in a row
    while_unhealthy: str = attrs.field(default="wait", validator=_one_of("wait", "fail"))


@attrs.frozen
class SchedulerConfig(_Schema):
    """The Scheduler's knobs; times in milliseconds or seconds as named."""

    KEYS: ClassVar[Mapping[str, object]] = {
        "max_queue_size": int,
        "interval_ms": float,
        "aging_s": (float, None),
        "drain_timeout_s": float,
    }
    max_queue_size: int = attrs.field(default=10000, validator=_positive)  # WAITING requests
    interval_ms: float = attrs.field(default=2.0, validator=_positive)  # no effect now
    aging_s: float | None = attrs.field(default=10.0, validator=_positive)  # +1 prio per aging_s
    drain_timeout_s: float = attrs.field(default=30.0, validator=_non_negative)  # close()


@attrs.frozen
class ModelConfig(_Schema):
    """One model of a recipe."""

    KEYS: ClassVar[Mapping[str, object]] = {
        "name": str,
        "path": str,
        "instances": int,
        "streams": (int, None),
        "completion": str,
        "max_batch_size": int,
        "max_queue_delay_ms": float,
        "priority": int,
        "slots": (int, None),
        "shapes": ShapesConfig,
        "warmup": bool,
        "memory_budget_mb": (float, None),
        "timeout_s": (float, None),
        "session_options": (SessionOptions, None),
        "health": HealthConfig,
        "nonfinite": str,
        "inputs": _NamesTo(InputConfig, "input"),
        "outputs": _NamesTo(OutputConfig, "output"),
        "state": dict,
        "state_init": str,
        "max_sequences": int,
        "constant": list,
        "batching": str,
        "deterministic": (bool, None),
        "batch_invariant": bool,
        "params": dict,
        "precision": str,
        "tolerance": ToleranceConfig,
        "reference": (str, None),
        "paths": dict,
    }
    name: str
    path: str  # file path (absolute after load) or pkg://package/relative/path
    instances: int = attrs.field(default=1, validator=_threads(1))  # workers for this model
    # batches in flight per worker, each with its own device buffers and stream; None = the
    # backend's default (acl: 2, onnxruntime: 1), filled in by Recipe.from_dict
    streams: int | None = attrs.field(default=None, validator=_threads(1))
    # how a worker learns a batch is done (acl): `sync`, rt.synchronize_stream at collect;
    # `callback`, a stream callback run by the session's report thread (onnxruntime: no effect)
    completion: str = attrs.field(default="sync", validator=_one_of("sync", "callback"))
    max_batch_size: int = attrs.field(default=8, validator=_non_negative)  # 0 = no batching
    max_queue_delay_ms: float = attrs.field(default=5.0, validator=_non_negative)
    priority: int = 0  # default priority of this model's requests
    slots: int | None = attrs.field(default=None, validator=_positive)  # READY+RUNNING cap
    shapes: ShapesConfig = attrs.field(factory=ShapesConfig)
    warmup: bool = True
    memory_budget_mb: float | None = attrs.field(default=None, validator=_positive)
    timeout_s: float | None = attrs.field(default=None, validator=_positive)  # default deadline
    session_options: SessionOptions | None = None  # overrides the recipe's
    health: HealthConfig = attrs.field(factory=HealthConfig)
    nonfinite: str = attrs.field(default="allow", validator=_one_of("allow", "reject"))  # NaN/inf
    # batch axis or unbatched, by input / output name; names not given: rows on axis 0. The
    # names are checked against the loaded model (`inferchain.layout.Layout.of`).
    inputs: Mapping[str, InputConfig] = attrs.field(factory=dict)
    outputs: Mapping[str, OutputConfig] = attrs.field(factory=dict)
    # a stateful model: output -> input carried from one step of a sequence to the next
    state: dict[str, str] = attrs.field(factory=dict, validator=_names_to_names)
    state_init: str = attrs.field(default="zeros", validator=_one_of("zeros"))  # at open
    max_sequences: int = attrs.field(default=64, validator=_positive)  # live = state lanes
    # a stateful model's inputs that keep one value over a sequence (given at every step;
    # on acl each sequence's value goes to the device once and stays in its lanes)
    constant: tuple[str, ...] = attrs.field(default=(), validator=_names)
    # window: a batch leaves full, after max_queue_delay_ms, or at once on an idle worker;
    # fill: only full, or at a flush (`OfflineInference.flush()`, the end of a run's input,
    # wait_all, close): batches of consecutive rows, the same for the same inputs
    batching: str = attrs.field(default="window", validator=_one_of("window", "wait", "fill"))
    # every batch at one shape: `batch_rows` rows (padded) of items each padded to a shape of
    # its own (`shapes.buckets`), so a row's outputs never depend on what shares its batch
    # (docs/recipes.md); None: the recipe's `deterministic` (filled in by Recipe.from_dict)
    deterministic: bool | None = None
    # measured: a row's outputs do not depend on what shares its batch, as the pipeline
    # forms its batches, on the recipe's backend (`inferchain compare --batch-invariance`
    # finds it so without --deterministic, and fails naming the claim where not): a resume
    # gives its rows their bytes without `deterministic`
    batch_invariant: bool = False
    params: dict[str, Any] = attrs.field(factory=dict)  # free-form, for the pipeline
    # the arithmetic the backend runs the model in; below f32 it is checked at init()
    # against f32 on `reference` within `tolerance` (docs/precision.md)
    precision: str = attrs.field(default="f32", validator=_one_of(*PRECISIONS))
    tolerance: ToleranceConfig = attrs.field(factory=ToleranceConfig)
    # an .npz of typical inputs, by input name with the batch dim (absolute after load)
    reference: str | None = None
    # backend -> the model file it loads instead of `path` (e.g. an export it reads)
    paths: dict[str, str] = attrs.field(factory=dict, validator=_backend_files)
    # not a key: filled in by Recipe.from_dict from the later models' `from:` inputs, this
    # model's outputs they take, each with the batches of it kept on the device for them
    handed: Mapping[str, int] = attrs.field(factory=dict)

    @property
    def batch_rows(self) -> int:
        """Rows in one batch buffer: `max_batch_size`, or 1 for a model that does not batch."""
        return max(self.max_batch_size, 1)

    @property
    def fixed_rows(self) -> int | None:
        """The rows every batch runs at (`deterministic`), or None where a batch runs at
        its own rows (or the model's fixed batch, the backend's to know)."""
        return self.batch_rows if self.deterministic and self.max_batch_size > 0 else None

    def pads_to(self, fixed: int | None) -> int | None:
        """The rows a session of this model pads every batch to: the model file's fixed
        batch (`fixed`, the session's `max_batch_size`), else `fixed_rows`."""
        return fixed if fixed is not None else self.fixed_rows

    @property
    def num_slots(self) -> int:
        """Requests of this model that may be READY or RUNNING at once."""
        return self.slots if self.slots is not None else 40 * self.instances * self.batch_rows


@attrs.frozen
class Recipe(_Schema):
    """A whole recipe: backend, scheduler settings, models and the optional pipeline."""

    KEYS: ClassVar[Mapping[str, object]] = {
        "name": str,
        "backend": str,
        "device": int,
        "providers": list,
        "session_options": SessionOptions,
        "scheduler": SchedulerConfig,
        "models": list,
        "pipeline": (str, None),
        "threads": str,
        "host_workers": (int, None),
        "host_processes": (int, None),
        "inputs": (str, None),
        "extra": (str, None),
        "deterministic": bool,
        "params": dict,
    }
    name: str = attrs.field(validator=_a_name)
    models: tuple[ModelConfig, ...]
    backend: str = attrs.field(default="onnxruntime", validator=_one_of(*BACKENDS))
    device: int = attrs.field(default=0, validator=_non_negative)
    providers: tuple[Any, ...] = ("CPUExecutionProvider",)  # str or {name: {options}}
    session_options: SessionOptions = attrs.field(factory=SessionOptions)
    scheduler: SchedulerConfig = attrs.field(factory=SchedulerConfig)
    pipeline: str | None = None  # "file.py:ClassName" relative to the recipe's folder
    # `auto`: instances, session threads and host workers chosen for the cores at
    # OfflineInference(...) where the models run on the CPU (`inferchain.threads`);
    # `manual`: as written
    threads: str = attrs.field(default="manual", validator=_one_of("auto", "manual"))
    # threads for the pipeline's host steps beside the models (None: the pipeline's own, else
    # the default; 0: the caller's thread)
    host_workers: int | None = attrs.field(default=None, validator=_threads(0))
    # processes for host code that holds the GIL (`Pipeline.in_process`); None: the cores
    host_processes: int | None = attrs.field(default=None, validator=_threads(1))
    inputs: str | None = None  # default inputs for `inferchain run`, relative to the folder
    # the inferchain extra that installs what the recipe needs (its models' packages, its
    # pipeline's imports): named with its pins when something is missing
    extra: str | None = None
    # every model `deterministic` unless it says otherwise (`inferchain run --deterministic`)
    deterministic: bool = False
    params: dict[str, Any] = attrs.field(factory=dict)  # free-form, for the pipeline
    source: Path = Path("<memory>")  # the YAML file it came from

    @property
    def root(self) -> Path:
        """The recipe's folder: relative paths in the recipe are relative to it."""
        return self.source.parent

    @property
    def provider_names(self) -> list[str]:
        """The names of `providers` (an entry is a name or {name: options})."""
        return [p if isinstance(p, str) else next(iter(p), "") for p in self.providers]

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        known = ", ".join(m.name for m in self.models)
        raise ConfigError(f"{self.source}: no model named {name!r} (models: {known})")

    @classmethod
    def from_dict(cls, data: object, where: str = "", source: Path = Path("<memory>")) -> Recipe:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: a recipe must be a mapping, got {_tn(data)}")
        raw = dict(data)
        models = raw.get("models")
        if not isinstance(models, list) or not models:
            raise ConfigError(f"{source}: key 'models' must be a non-empty list")
        backend = raw.get("backend", "onnxruntime")
        extra = raw.get("extra")
        hint = install_hint(extra) if isinstance(extra, str) else ""
        raw["models"] = [
            _resolve_streams(
                _resolve_model(
                    ModelConfig.from_dict(m, f"models[{i}]", source), source, i, hint, backend
                ),
                backend,
                source,
                i,
            )
            for i, m in enumerate(models)
        ]
        names = [m.name for m in raw["models"]]
        if len(set(names)) != len(names):
            raise ConfigError(f"{source}: model names must be unique, got {names}")
        raw["models"] = _resolve_handovers(raw["models"], source)
        every = raw.get("deterministic", False)
        raw["models"] = [
            attrs.evolve(m, deterministic=every is True) if m.deterministic is None else m
            for m in raw["models"]
        ]
        for i, p in enumerate(raw.get("providers") or ()):
            if not isinstance(p, str | dict):
                raise ConfigError(f"{source}: key 'providers[{i}]' must be str or mapping")
        recipe: Recipe = super().from_dict(raw, where, source)
        return attrs.evolve(recipe, source=source)


def _resolve_model(
    model: ModelConfig, source: Path, index: int, hint: str, backend: object
) -> ModelConfig:
    """Resolve a model's path (its `paths:` entry for `backend` where it has one) and its
    `reference`: pkg:// to the installed package's file, relative to the recipe (`hint`:
    how to install a missing package)."""
    key = f"models[{index}].path"
    if str(backend) in model.paths:
        key = f"models[{index}].paths.{backend}"
    where = f"{source}: key {key!r}"
    path = resolve_path(model.paths.get(str(backend), model.path), source.parent, where, hint=hint)
    reference = model.reference
    if reference is not None:
        what = f"{source}: key 'models[{index}].reference'"
        reference = str(resolve_path(reference, source.parent, what, kind="reference file"))
    return attrs.evolve(model, path=str(path), reference=reference)


DEFAULT_STREAMS = {"acl": 2}  # per backend; others run one batch per worker at a time


def _resolve_streams(model: ModelConfig, backend: object, source: Path, index: int) -> ModelConfig:
    """Fill in the backend's default `streams`; more than one needs a backend that overlaps
    batches (acl)."""
    default = DEFAULT_STREAMS.get(str(backend), 1)
    if model.streams is None:
        return attrs.evolve(model, streams=default)
    if model.streams > 1 and str(backend) not in DEFAULT_STREAMS:
        raise ConfigError(
            f"{source}: key 'models[{index}].streams' is {model.streams}, but backend "
            f"{backend!r} runs one batch per worker at a time (streams > 1 needs backend acl)"
        )
    return model


DEFAULT_HANDOVER_BATCHES = 16  # a producer's batches of a handed output kept on the device


def split_from(text: str, models: Iterable[str]) -> tuple[str, str] | None:
    """`MODEL.OUTPUT` of a `from:` key as (model, output), the model one of `models` (the
    longest that matches: output names may hold dots too); None if none does."""
    found = [m for m in models if text.startswith(m + ".") and len(text) > len(m) + 1]
    if not found:
        return None
    model = max(found, key=len)
    return model, text[len(model) + 1 :]


def _resolve_handovers(models: list[ModelConfig], source: Path) -> list[ModelConfig]:
    """Check every input's `from:` (an earlier model's output, both models batching) and
    fill in each producer's `handed` outputs."""
    handed: dict[str, dict[str, int]] = {}
    for i, model in enumerate(models):
        for name, config in model.inputs.items():
            if config.from_output is None:
                continue
            where = f"{source}: key 'models[{i}].inputs.{name}.from'"
            earlier = [m.name for m in models[:i]]
            found = split_from(config.from_output, earlier)
            if found is None:
                raise ConfigError(
                    f"{where}: {config.from_output!r} must be MODEL.OUTPUT naming an earlier "
                    f"model's output (models before {model.name!r}: {earlier or 'none'})"
                )
            producer, output = found
            for m in (model, models[earlier.index(producer)]):
                if m.max_batch_size <= 0:
                    raise ConfigError(
                        f"{where}: model {m.name!r} does not batch (max_batch_size: 0); a "
                        "hand-over is of rows of batches"
                    )
            batches = config.batches or DEFAULT_HANDOVER_BATCHES
            outputs = handed.setdefault(producer, {})
            outputs[output] = max(outputs.get(output, 0), batches)
    return [attrs.evolve(m, handed=handed[m.name]) if m.name in handed else m for m in models]


PKG = "pkg://"
MODEL_SUFFIXES = {".onnx": "onnxruntime", ".om": "acl"}  # model file -> its backend


def package_file(url: str, what: str, hint: str = "") -> Path:
    """The path `pkg://PACKAGE/relative/path` names inside an installed package.

    Found from the package's import spec (its search locations), without importing it:
    importing could fail, pull in heavy dependencies or take long.
    """
    package, _, rel = url[len(PKG) :].partition("/")
    if not package or not rel:
        raise ConfigError(f"{what}: {url!r} is not of the form pkg://PACKAGE/relative/path")
    top, *subpackages = package.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        how = hint or f"pip install {top}"
        raise ConfigError(f"{what}: package {top!r} of {url!r} is not installed: {how}")
    roots = list(spec.submodule_search_locations or ())
    if not roots:
        raise ConfigError(f"{what}: {top!r} of {url!r} is a module, not a package with files")
    candidates = [Path(root, *subpackages, rel) for root in roots]
    return next((c for c in candidates if c.exists()), candidates[0])


def resolve_path(
    path: str, root: Path, what: str, kind: str = "model file", hint: str = ""
) -> Path:
    """A file path for `pkg://package/rel/path`, an absolute path, or one relative to `root`;
    ConfigError naming `what` when nothing is there (`hint`: see `package_file`)."""
    if path.startswith(PKG):
        resolved = package_file(path, what, hint)
    else:
        resolved = Path(path) if Path(path).is_absolute() else root / path
    if not resolved.exists():
        raise ConfigError(f"{what}: {kind} {path!r} does not exist ({resolved})")
    return resolved


def recipe_file(path: str | Path) -> Path:
    """The YAML file of a recipe given as a folder, a YAML file or a pkg:// path to either."""
    text = str(path)
    p = package_file(text, text) if text.startswith(PKG) else Path(path)
    source = p / "recipe.yaml" if p.is_dir() else p
    if p.is_dir() and not source.is_file():
        raise ConfigError(f"{p}: no recipe.yaml in this folder")
    if not source.is_file():
        raise ConfigError(f"{text}: recipe not found (a folder with recipe.yaml or a YAML file)")
    if source.suffix.lower() in MODEL_SUFFIXES:
        raise ConfigError(
            f"{text}: a model file, not a recipe (a folder with recipe.yaml or a YAML file); "
            "`inferchain info` and `inferchain compare` take model files"
        )
    return source


def deterministic(recipe: Recipe) -> Recipe:
    """`recipe` with every model `deterministic` (`inferchain run --deterministic`)."""
    models = tuple(attrs.evolve(m, deterministic=True) for m in recipe.models)
    return attrs.evolve(recipe, models=models, deterministic=True)


def load_recipe(path: str | Path, **overrides: Any) -> Recipe:
    """Load and validate a recipe from a folder holding `recipe.yaml`, from a YAML file, or
    from a `pkg://package/path` to either.

    Keyword overrides replace top-level keys (`backend="acl"`); mappings are merged
    (`scheduler={"aging_s": None}`), and `models={"det": {"instances": 2}}` updates models
    by name.
    """
    source = recipe_file(path)
    try:
        data = parse_yaml(source.read_text(encoding="utf-8"), source)
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not a recipe (not UTF-8 YAML text)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a recipe must be a mapping, got {_tn(data)}")
    return Recipe.from_dict(apply_overrides(data, overrides, source), "", source.resolve())


RECIPE_PACKAGE = (
    "inferchain_recipes"  # the package a recipe folder is imported under (a digest of its path)
)


def import_recipe_module(recipe: Recipe | str | Path, name: str = "pipeline") -> ModuleType:
    """The module `name` (`pipeline`, or any sibling file's stem) of a recipe's folder, e.g.
    `ic.import_recipe_module("recipes/vad").VadSteps`.

    `recipe` is a Recipe, or a recipe folder or YAML file (or a `pkg://` path to either).
    The folder is imported as a package, so its files may import each other (`from . import
    boxes`); the same folder gives the same modules each time, as `init()` imports them.
    """
    root = recipe.root if isinstance(recipe, Recipe) else recipe_file(recipe).resolve().parent
    digest = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]
    package = f"{RECIPE_PACKAGE}.r{digest}"
    if RECIPE_PACKAGE not in sys.modules:
        sys.modules[RECIPE_PACKAGE] = ModuleType(RECIPE_PACKAGE)
    if package not in sys.modules:
        module = ModuleType(package)
        module.__path__ = [str(root)]
        sys.modules[package] = module
    return importlib.import_module(f"{package}.{name}")


def apply_overrides(
    data: dict[str, Any], overrides: Mapping[str, Any], source: Path
) -> dict[str, Any]:
    """`data` with `overrides` applied (see `load_recipe`)."""
    out = dict(data)
    for key, value in overrides.items():
        if key == "models" and isinstance(value, Mapping):
            models = [dict(m) for m in out.get("models", [])]
            by_name = {m.get("name"): m for m in models}
            for name, update in value.items():
                if name not in by_name:
                    raise ConfigError(f"{source}: override for unknown model {name!r}")
                by_name[name].update(update)
            out["models"] = models
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out
