"""Shape strategies: bucket choice, padding and cropping, auto buckets, warm-up per bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import recipe
from hypothesis import given
from hypothesis import strategies as st

import inferchain as ic
from inferchain.backends.onnxruntime import OnnxRuntimeBackend
from inferchain.shapes import derive_buckets, fits, padding_waste, size, smallest_fit
from inferchain.testing.faults import FaultyBackend
from inferchain.testing.onnx_models import write_image_model

BUCKETS = [((3, 8, 8),), ((3, 8, 16),), ((3, 16, 16),), ((3, 32, 32),)]
keys = st.tuples(st.integers(1, 32), st.integers(1, 32)).map(lambda hw: ((3, *hw),))


@given(keys)
def test_the_smallest_bucket_that_fits_is_chosen(key: Any) -> None:
    chosen = smallest_fit(key, BUCKETS)
    assert chosen is not None and fits(key, chosen)
    assert all(size(b) >= size(chosen) for b in BUCKETS if fits(key, b))


@given(st.lists(keys, min_size=1, max_size=60), st.integers(1, 5))
def test_derived_buckets_hold_the_sample_and_never_lose_to_one_bucket(
    sample: list[Any], k: int
) -> None:
    buckets = derive_buckets(sample, k)
    assert 1 <= len(buckets) <= k
    assert all(smallest_fit(key, buckets) is not None for key in sample)
    one = derive_buckets(sample, 1)
    assert padding_waste(sample, buckets) <= padding_waste(sample, one) + 1e-12


def test_auto_beats_one_max_size_bucket_on_a_skewed_workload() -> None:
    rng = np.random.default_rng(0)
    widths = np.minimum(rng.geometric(0.08, 500) * 8, 640)  # mostly short lines, a few long
    sample = [((3, 48, int(w)),) for w in widths]
    auto = derive_buckets(sample, 4)
    one = [((3, 48, int(widths.max())),)]
    assert padding_waste(sample, auto) < 0.5 * padding_waste(sample, one)


@pytest.fixture(scope="module")
def image_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """image float32[N, 3, H, W] -> scaled = image * 2 + 1 (follows H, W), mean over H, W."""
    return write_image_model(tmp_path_factory.mktemp("shapes") / "image.onnx")


def bucketed(path: Path, **shapes: Any) -> ic.Recipe:
    return recipe(
        {
            "name": "img",
            "path": str(path),
            "max_batch_size": 4,
            "shapes": {
                "strategy": "buckets",
                "buckets": [[3, 8, 8], [3, 16, 16]],
                "pad_value": 0.0,
                "crop_outputs": [{"output": "scaled", "input": "image", "dims": {1: 1, 2: 2}}],
                **shapes,
            },
        }
    )


@given(st.lists(st.tuples(st.integers(1, 16), st.integers(1, 16)), min_size=1, max_size=12))
def test_padding_never_changes_a_cropped_row(image_model: Path, sizes: list[Any]) -> None:
    items = [np.random.default_rng(h * 31 + w).random((3, h, w), np.float32) for h, w in sizes]
    with ic.OfflineInference(bucketed(image_model)) as oi:
        outs = [r.result(timeout=10) for r in [oi.submit("img", x) for x in items]]
        batch_keys = {b.shape_key for b in oi.metrics.models["img"].batches()}
    for x, out in zip(items, outs, strict=True):
        np.testing.assert_allclose(out["scaled"], x * 2 + 1, rtol=1e-6)
    assert batch_keys <= {((3, 8, 8),), ((3, 16, 16),)}


def test_an_item_no_bucket_holds_is_invalid(image_model: Path) -> None:
    with ic.OfflineInference(bucketed(image_model)) as oi:
        with pytest.raises(ic.InvalidInput, match=r"fit none of the buckets"):
            oi.submit("img", np.zeros((3, 17, 4), np.float32))
        assert oi.infer("img", np.zeros((3, 4, 4), np.float32))["scaled"].shape == (3, 4, 4)


def test_bad_bucket_config_is_a_config_error(image_model: Path) -> None:
    with pytest.raises(ic.ConfigError, match="does not match the item shapes"):
        ic.OfflineInference(bucketed(image_model, buckets=[[4, 8, 8]])).init()
    with pytest.raises(ic.ConfigError, match="needs `buckets`"):
        ic.OfflineInference(bucketed(image_model, buckets=None)).init()


def test_every_bucket_is_warmed_up_at_init(image_model: Path) -> None:
    r = bucketed(image_model)
    backend = FaultyBackend(OnnxRuntimeBackend(r))
    with ic.OfflineInference(r, backend=backend) as oi:
        # one run per bucket at the max batch, the output check's one-row run, and the
        # first bucket's max batch timed once more (its first run paid for the set-up)
        assert backend.counts["run"] == 2 + 1 + 1
        assert oi.memory["img"].buffer_bytes >= 4 * 3 * (8 * 8 + 16 * 16) * 4
    r = recipe(
        {
            "name": "img",
            "path": str(image_model),
            "max_batch_size": 4,
            "warmup": False,
            "shapes": {"strategy": "buckets", "buckets": [[3, 8, 8]]},
        }
    )
    backend = FaultyBackend(OnnxRuntimeBackend(r))
    with ic.OfflineInference(r, backend=backend):
        assert backend.counts["run"] == 0


def test_auto_strategy_switches_to_derived_buckets(image_model: Path) -> None:
    r = recipe(
        {
            "name": "img",
            "path": str(image_model),
            "max_batch_size": 4,
            "shapes": {"strategy": "auto", "sample": 20, "num_buckets": 2},
        }
    )
    rng = np.random.default_rng(1)
    with ic.OfflineInference(r) as oi:
        for _ in range(40):
            h, w = (int(v) for v in rng.integers(1, 12, 2))
            out = oi.infer("img", np.ones((3, h, w), np.float32))
            assert out["mean"].shape == (3,)
        policy = oi.shape_policy("img")  # the derived buckets are also logged
        assert 1 <= len(policy.buckets) <= 2
