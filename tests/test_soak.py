"""A short soak (the long one is `make soak`): mixed models, random faults, nothing lost."""

from __future__ import annotations

from inferchain.testing.soak import run_soak


def test_short_soak_loses_nothing(no_thread_leak: None) -> None:
    report = run_soak(seconds=3.0, fail_p=0.02, seed=1)
    assert report.submitted > 1000
    assert report.lost == 0
    assert report.duplicates == 0
    assert report.injected_failures > 0
    assert {"DONE", "ERROR"} <= set(report.finished)
    assert report.rss_end - report.rss_start < 64 * 2**20  # flat enough for 3 s; 5 % in make soak
