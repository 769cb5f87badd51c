"""What `inferchain run` did, counted as it goes, for its closing summary line."""

from __future__ import annotations

import argparse
from collections import Counter

import attrs


@attrs.define
class Tally:
    """Items of one run: done now, failed (by the error's type), skipped as done before."""

    before: int = 0  # inputs with a result from an earlier run (--resume): skipped
    beyond: int = 0  # inputs left out by --limit
    done: int = 0  # results written by this run
    failed: Counter[str] = attrs.field(factory=Counter)  # error type name -> items

    def add(self, error: str | None) -> None:
        """One item written: a result (`error` None), or an error line `Type: message`."""
        if error is None:
            self.done += 1
        else:
            self.failed[error.partition(":")[0]] += 1

    @property
    def num_failed(self) -> int:
        return sum(self.failed.values())

    def line(self, seconds: float, where: str) -> str:
        """`N done, F failed (Kind n, ...), S skipped as done before, T s, R items/s; ...`."""
        ran = self.done + self.num_failed
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.failed.items()))
        failed = f"{self.num_failed} failed" + (f" ({kinds})" if kinds else "")
        beyond = f", {self.beyond} beyond --limit" if self.beyond else ""
        rate = ran / seconds if seconds > 0 else 0.0
        return (
            f"{self.done} done, {failed}, {self.before} skipped as done before{beyond}; "
            f"{seconds:.2f}s, {rate:.1f} items/s; results in {where}"
        )


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value
