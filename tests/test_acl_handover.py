"""Device-to-device chaining (recipe `inputs: {x: {from: embed.y}}`): a two-model chain whose
second model takes the first's output unchanged. On onnxruntime the array is handed over as
it is; on acl (FakeAcl) it stays in device memory as `DeviceTensor`s, with the same results,
and the copy counters show the host round trip gone. Blocks are never reused or freed while a
consumer may still copy from them."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.backends.acl import AclBackend, AclSession
from inferchain.driver import PipelineDriver
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_mlp64

WIDTH = 64  # embed.y: 64 float32 a row, 256 bytes (a multiple of memcpy_async's 64)
CLASSES = 10  # head.y
BATCH = 8
ITEMS = 40
# bytes per item of the chain on acl, as the fake's copy counters count them: x in, y out
# and in again, head.y out; with the hand-over, y moves on the device (out of embed's
# buffer into a block, from the block into head's buffer) and never crosses to the host
UNCHAINED = {"h2d": 4 * (WIDTH + WIDTH), "d2h": 4 * (WIDTH + CLASSES), "d2d": 0}
CHAINED = {"h2d": 4 * WIDTH, "d2h": 4 * CLASSES, "d2d": 4 * (WIDTH + WIDTH)}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("chain")
    embed = write_mlp64(folder / "embed.onnx", out_features=WIDTH, seed=1)
    head = write_mlp64(folder / "head.onnx", out_features=CLASSES, seed=2)
    return embed, head


def chain(
    models: tuple[Path, Path],
    chained: bool = True,
    backend: str = "acl",
    head: dict[str, Any] | None = None,
    **both: Any,
) -> ic.Recipe:
    """embed -> head; `head`: keys of head's input x besides `from`; `both`: model keys."""
    taken: dict[str, Any] = {"from": "embed.y"} if chained else {}
    return recipe(
        {"name": "embed", "path": str(models[0]), "max_batch_size": BATCH, **both},
        {
            "name": "head",
            "path": str(models[1]),
            "max_batch_size": BATCH,
            "inputs": {"x": {**taken, **(head or {})}} if taken or head else {},
            **both,
        },
        backend=backend,
    )


class Chain(ic.Pipeline):
    """embed, then head on embed's `y` as it came back (a DeviceTensor on acl)."""

    def process(self, x: np.ndarray) -> ic.Process:
        out = yield self.submit("embed", x)
        result = yield self.submit("head", {"x": out["y"]})
        return result["y"]


def items(n: int = ITEMS, seed: int = 0) -> list[np.ndarray]:
    return list(np.random.default_rng(seed).standard_normal((n, 64)).astype(np.float32))


def run_chain(r: ic.Recipe, xs: list[np.ndarray], fake: FakeAcl | None = None) -> np.ndarray:
    with ic.OfflineInference(r, acl_module=fake) as oi:
        results = list(PipelineDriver(Chain(oi)).run(xs))
    return np.stack(results)


def per_item(fake: FakeAcl, before: dict[str, tuple[int, int]], n: int) -> dict[str, float]:
    after = fake.copies()
    return {k: (after[k][1] - before[k][1]) / n for k in ("h2d", "d2h", "d2d")}


def reference(models: tuple[Path, Path], xs: list[np.ndarray]) -> np.ndarray:
    """The two models by hand on onnxruntime, the output handed over as an array."""
    import onnxruntime as ort

    embed, head = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in models)
    y = embed.run(None, {"x": np.stack(xs)})[0]
    out: np.ndarray = head.run(None, {"x": y})[0]
    return out


def no_leaks(fake: FakeAcl) -> None:
    assert all(v == 0 for v in fake.live_handles().values()), fake.live_handles()
    assert fake.errors == [], fake.errors[:3]


# -- onnxruntime: a plain hand-over --------------------------------------------------------


def test_on_onnxruntime_the_output_is_handed_over_as_an_array(models: tuple[Path, Path]) -> None:
    xs = items()
    expected = reference(models, xs)
    chained = run_chain(chain(models, backend="onnxruntime"), xs)
    unchained = run_chain(chain(models, chained=False, backend="onnxruntime"), xs)
    np.testing.assert_allclose(chained, expected, rtol=1e-5, atol=1e-6)
    assert np.array_equal(chained, unchained)
    with ic.OfflineInference(chain(models, backend="onnxruntime")) as oi:
        y = oi.infer("embed", xs[0])["y"]
        assert type(y) is np.ndarray
        assert oi.model_info("head").inputs[0].name == "x"


# -- acl: on the device --------------------------------------------------------------------


@pytest.mark.parametrize("completion", ["sync", "callback"])
def test_on_acl_the_chain_stays_on_the_device_with_the_same_results(
    models: tuple[Path, Path], completion: str, no_thread_leak: None
) -> None:
    """Bytes per item pinned before (unchained: y to the host and back) and after."""
    xs = items()
    expected = run_chain(chain(models, chained=False, backend="onnxruntime"), xs)
    figures = {}
    for chained in (False, True):
        r = chain(models, chained, completion=completion)
        fake = FakeAcl.for_recipe(r)
        with ic.OfflineInference(r, acl_module=fake) as oi:
            before = fake.copies()  # after the warm-ups
            got = np.stack(list(PipelineDriver(Chain(oi)).run(xs)))
            figures[chained] = per_item(fake, before, len(xs))
        assert np.array_equal(got, expected), chained
        no_leaks(fake)
    assert figures[False] == UNCHAINED
    assert figures[True] == CHAINED


def test_a_device_tensor_checks_and_reads_back(models: tuple[Path, Path]) -> None:
    xs = items(3)
    with ic.OfflineInference(chain(models, backend="onnxruntime")) as oi:
        host = [oi.infer("embed", x)["y"] for x in xs]
    r = chain(models)
    fake = FakeAcl.for_recipe(r)
    with ic.OfflineInference(r, acl_module=fake) as oi:
        tensors = [oi.infer("embed", x)["y"] for x in xs]
        t = tensors[0]
        assert isinstance(t, ic.DeviceTensor)
        assert (t.source, t.shape, t.dtype, t.nbytes) == ("embed.y", (WIDTH,), np.float32, 256)
        assert t.alive and "on the device" in repr(t)
        for got, want in zip(tensors, host, strict=True):
            assert np.array_equal(np.asarray(got), want)  # one device-to-host copy each
        with pytest.raises(TypeError, match="does not pickle"):
            pickle.dumps(t)
        # the single-Work path of the engine (map: one Work of rows of tensors)
        mapped = [o["y"] for o in oi.map("head", tensors)]
        direct = [oi.infer("head", {"x": h})["y"] for h in host]
        assert np.array_equal(np.stack(mapped), np.stack(direct))
        # a producer's column of rows (map_batches) goes on as one array of rows
        (column,) = [b["y"] for b in oi.map_batches("embed", np.stack(xs))]
        assert column.dtype == object and len(column) == len(xs)
        (heads,) = [b["y"] for b in oi.map_batches("head", column)]
        assert np.array_equal(heads, np.stack(direct))
        with pytest.raises(ic.InvalidInput, match=r"model 'embed' input 'x' takes host arrays"):
            oi.submit("embed", t)
    assert not t.alive and "released" in repr(t)
    with pytest.raises(ic.BackendError, match="gone"):
        t.numpy()
    no_leaks(fake)


class _Holder:
    alive = True

    def fetch(self, row: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        raise AssertionError("not read")


@pytest.mark.parametrize(
    ("shape", "dtype", "message"),
    [
        ((32,), np.float32, r"expected float32\(64\), got a DeviceTensor of embed.y \(float32\(32"),
        ((64,), np.float16, r"expected float32\(64\), got a DeviceTensor of embed.y \(float16\(64"),
    ],
)  # fmt: skip
def test_a_tensor_of_another_shape_or_dtype_is_refused_at_submit(
    models: tuple[Path, Path], shape: tuple[int, ...], dtype: Any, message: str
) -> None:
    r = chain(models)
    fake = FakeAcl.for_recipe(r)
    with ic.OfflineInference(r, acl_module=fake) as oi:
        wrong = ic.DeviceTensor("embed.y", shape, np.dtype(dtype), _Holder(), 0)
        with pytest.raises(ic.InvalidInput, match=rf"model 'head' input 'x': {message}"):
            oi.submit("head", {"x": wrong})
        assert oi.infer("head", {"x": np.zeros(64, np.float32)})["y"].shape == (CLASSES,)


def test_a_failing_producer_fails_its_items_cleanly(models: tuple[Path, Path]) -> None:
    """The first execution (embed's first batch: nothing else can run before it) fails:
    those items end with its error, the others with the right results, no block is lost."""
    xs = items()
    expected = run_chain(chain(models, chained=False, backend="onnxruntime"), xs)
    r = chain(models, warmup=False)
    fake = FakeAcl.for_recipe(r)
    fake.inject("mdl.execute_async", 507015, nth=1)
    with ic.OfflineInference(r, acl_module=fake) as oi:
        driver = PipelineDriver(Chain(oi), on_error="return")
        got = list(driver.run(xs))
        failed = [i for i, g in enumerate(got) if isinstance(g, BaseException)]
        assert failed and len(failed) <= BATCH
        assert all(isinstance(got[i], ic.BackendError) for i in failed)
        assert "ACL_ERROR_RT_AICORE_EXCEPTION" in str(got[failed[0]])
        for i, g in enumerate(got):
            if i not in failed:
                assert np.array_equal(g, expected[i])
        (session,) = [w.session for w in oi._models["embed"].workers]
        assert isinstance(session, AclSession)
        pool = next(iter(session._pools.values()))
        assert len(pool._free) == 16  # every block back
    assert all(v == 0 for v in fake.live_handles().values()), fake.live_handles()
    assert fake.errors == [("mdl.execute_async", 507015)]


def test_when_every_block_is_held_the_output_goes_through_the_host(
    models: tuple[Path, Path],
) -> None:
    r = chain(models, head={"batches": 1})
    fake = FakeAcl.for_recipe(r)
    xs = items(2)
    with ic.OfflineInference(r, acl_module=fake) as oi:
        first = oi.infer("embed", xs[0])["y"]  # holds the only block
        second = oi.infer("embed", xs[1])["y"]
        assert isinstance(first, ic.DeviceTensor) and type(second) is np.ndarray
        got = [oi.infer("head", {"x": y})["y"] for y in (first, second)]
        del first
        again = oi.infer("embed", xs[0])["y"]  # the block is free again
        assert isinstance(again, ic.DeviceTensor)
    with ic.OfflineInference(chain(models, backend="onnxruntime")) as oi:
        want = [oi.infer("head", {"x": oi.infer("embed", x)["y"]})["y"] for x in xs]
    assert np.array_equal(np.stack(got), np.stack(want))
    no_leaks(fake)


# -- lifetimes, on the sessions themselves -------------------------------------------------


@pytest.fixture
def sessions(models: tuple[Path, Path]) -> Iterator[tuple[FakeAcl, AclSession, AclSession]]:
    """embed (one block: every reuse is of that block) and head, loaded on this thread."""
    r = chain(models, head={"batches": 1})
    fake = FakeAcl.for_recipe(r)
    backend = AclBackend(r, acl_module=fake)
    embed, head = (backend.load(m, 0) for m in r.models)
    yield fake, embed, head
    head.close()
    embed.close()
    backend.close()


def _host(models: tuple[Path, Path], x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    embed, head = (ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in models)
    out: np.ndarray = head.run(None, {"x": embed.run(None, {"x": x})[0]})[0]
    return out


def test_a_block_is_not_reused_before_its_consumer_has_copied_it(
    models: tuple[Path, Path], sessions: tuple[FakeAcl, AclSession, AclSession]
) -> None:
    fake, embed, head = sessions
    a, b = (np.random.default_rng(s).standard_normal((4, 64)).astype(np.float32) for s in (1, 2))
    embed.launch([a], 4, 0)
    (tensors,) = embed.collect(0)
    assert tensors.dtype == object and all(isinstance(t, ic.DeviceTensor) for t in tensors)
    head.launch([tensors[::-1].copy()], 4, 0)  # in flight: its copies from the block too
    del tensors  # the head's launch alone keeps the block now
    embed.launch([b], 4, 1)
    (second,) = embed.collect(1)
    assert type(second) is np.ndarray  # the only block is still held: through the host
    (out,) = head.collect(0)
    np.testing.assert_allclose(out, _host(models, a)[::-1], rtol=1e-5, atol=1e-6)
    embed.launch([b], 4, 0)  # the block is free again
    (third,) = embed.collect(0)
    assert isinstance(third[0], ic.DeviceTensor)
    assert fake.errors == []


def test_a_block_read_by_a_consumer_outlives_its_producer(
    models: tuple[Path, Path], sessions: tuple[FakeAcl, AclSession, AclSession]
) -> None:
    """The producer closes (or re-loads) while a consumer's copy from its block is in
    flight: the block goes only once that copy is done; its tensors are then gone."""
    fake, embed, head = sessions
    a = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    embed.launch([a], 3, 0)
    (tensors,) = embed.collect(0)
    head.launch([tensors], 3, 0)
    embed.close()
    memory = fake.live_handles()["device_memory"]
    (out,) = head.collect(0)
    assert fake.live_handles()["device_memory"] == memory - 1  # the block, freed by the unpin
    np.testing.assert_allclose(out, _host(models, a), rtol=1e-5, atol=1e-6)
    with pytest.raises(ic.BackendError, match="is gone"):
        head.launch([tensors], 3, 1)
    assert fake.errors == []


def test_the_consumer_checks_what_it_copies(
    models: tuple[Path, Path], sessions: tuple[FakeAcl, AclSession, AclSession]
) -> None:
    _, embed, head = sessions
    foreign = np.empty(2, object)
    for r in (0, 1):  # one by one: numpy reads a list of them through __array__
        foreign[r] = ic.DeviceTensor("embed.y", (64,), np.dtype(np.float32), _Holder(), r)
    with pytest.raises(ic.BackendError, match="not a DeviceTensor of this acl runtime"):
        head.launch([foreign], 2, 0)
    embed.launch([np.zeros((2, 64), np.float32)], 2, 0)
    (tensors,) = embed.collect(0)
    tensors[1] = ic.DeviceTensor("embed.y", (32,), np.dtype(np.float32), tensors[0].holder, 1)
    with pytest.raises(ic.BackendError, match=r"head: input 'x' expects float32\[64\]"):
        head.launch([tensors], 2, 0)
    assert head.handed_inputs == frozenset({0}) and embed.handed_inputs == frozenset()


def test_unaligned_rows_go_through_the_host(tmp_path: Path) -> None:
    """40-byte rows cannot be copied at memcpy_async's 64-byte alignment: a plain array."""
    embed = write_mlp64(tmp_path / "e.onnx", out_features=10, seed=1)
    head = write_mlp64(tmp_path / "h.onnx", in_features=10, seed=2)
    r = chain((embed, head))
    fake = FakeAcl.for_recipe(r)
    with ic.OfflineInference(r, acl_module=fake) as oi:
        y = oi.infer("embed", np.ones(64, np.float32))["y"]
        assert type(y) is np.ndarray
        assert oi.infer("head", {"x": y})["y"].shape == (CLASSES,)
    no_leaks(fake)


# -- the recipe key ------------------------------------------------------------------------


def test_from_must_name_an_earlier_models_output(models: tuple[Path, Path]) -> None:
    with pytest.raises(ic.ConfigError, match=r"models\[1\].inputs.x.from.*'emb.y' must be "
                       r"MODEL.OUTPUT naming an earlier model's output \(models before "
                       r"'head': \['embed'\]\)"):  # fmt: skip
        recipe(
            {"name": "embed", "path": str(models[0])},
            {"name": "head", "path": str(models[1]), "inputs": {"x": {"from": "emb.y"}}},
        )
    with pytest.raises(ic.ConfigError, match="given without it"):
        chain(models, chained=False, head={"batches": 4})
    with pytest.raises(ic.ConfigError, match="rows on axis 0"):
        chain(models, head={"batch_axis": 1})
    with pytest.raises(ic.ConfigError, match="does not batch"):
        chain(models, max_batch_size=0)
    r = chain(models, head={"batches": 4})
    assert r.model("embed").handed == {"y": 4} and r.model("head").handed == {}


@pytest.mark.parametrize("backend", ["onnxruntime", "acl"])
def test_from_is_checked_against_the_loaded_models(
    models: tuple[Path, Path], tmp_path: Path, backend: str
) -> None:
    r = recipe(
        {"name": "embed", "path": str(models[0]), "max_batch_size": BATCH},
        {"name": "head", "path": str(models[1]), "inputs": {"x": {"from": "embed.z"}}},
        backend=backend,
    )
    fake = FakeAcl.for_recipe(r) if backend == "acl" else None
    with pytest.raises(ic.ConfigError, match=r"model 'embed' has no output 'z' \(outputs: \['y'"):
        ic.OfflineInference(r, acl_module=fake).init()
    narrow = write_mlp64(tmp_path / "narrow.onnx", out_features=16)
    r = chain((narrow, models[1]), backend=backend)
    fake = FakeAcl.for_recipe(r) if backend == "acl" else None
    with pytest.raises(ic.ConfigError, match=r"model 'head' input 'x' expects float32\[64\] per "
                       r"item, output 'embed.y' gives float32\[16\]"):  # fmt: skip
        ic.OfflineInference(r, acl_module=fake).init()
