"""The in-flight window: one rule for what `oi.map` (rows of Works) and a pipeline's driver
(items) keep in flight."""

from __future__ import annotations

from inferchain.in_flight import Window


def test_a_unit_enters_while_its_cost_fits_and_an_empty_window_takes_any() -> None:
    w = Window(8)
    assert w.fits(20) and not w.full(20)  # empty: a Work of more rows than the limit runs alone
    w.enter(20)
    assert not w.fits(1) and w.full(1)
    w.leave(20)
    w.enter(5)
    assert w.fits(3) and not w.fits(4)
    w.enter(3)
    assert w.full()
    w.leave(3)
    assert w.fits(3)


def test_a_window_of_items_holds_at_most_its_limit() -> None:
    w = Window(2)
    w.enter()
    w.enter()
    assert w.full() and w.used == 2
    assert Window(0).limit == 1  # at least one unit always
