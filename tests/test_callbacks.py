"""User code cannot stop the framework: whatever a done-callback or a `callback=` raises
(`SystemExit`, `KeyboardInterrupt` too) is logged where it is called, the request's other
listeners, the engine and the callback thread go on, and a callback that never returns
delays `close(drain_timeout=...)` by that bound at most."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import inferchain_threads, mlp_recipe

import inferchain as ic
from inferchain.core.request import Request, RequestState

ITEM = np.ones(64, np.float32)


def exits(_: object) -> None:
    raise SystemExit(3)


def test_a_base_exception_in_a_done_callback_stops_nothing(mlp_path: Path) -> None:
    seen: list[int] = []
    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        first = oi.submit("m", ITEM)
        first.add_done_callback(exits)
        first.add_done_callback(lambda r: seen.append(r.id))  # after the one that exits
        assert first.wait(30)
        later = [oi.submit("m", ITEM) for _ in range(5)]
        assert oi.wait_all(timeout=30), "the engine stopped after a done-callback's SystemExit"
        assert all(r.state is RequestState.DONE for r in later)
        assert oi.wait_all(timeout=30)
    assert seen == [first.id]


def test_a_base_exception_in_a_callback_stops_no_later_callback(mlp_path: Path) -> None:
    ran: list[int] = []
    all_ran = threading.Event()

    def record(r: ic.Request) -> None:
        ran.append(r.id)
        if len(ran) == 3:
            all_ran.set()

    with ic.OfflineInference(mlp_recipe(mlp_path)) as oi:
        oi.submit("m", ITEM, callback=exits).wait(30)
        oi.submit("m", ITEM, callback=lambda r: (_ for _ in ()).throw(KeyboardInterrupt()))
        for _ in range(3):
            oi.submit("m", ITEM, callback=record)
        assert all_ran.wait(30), f"callbacks after a SystemExit did not run: {ran}"


def test_close_is_bounded_when_a_callback_never_returns(mlp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()

    def blocks(_: ic.Request) -> None:
        entered.set()
        release.wait()

    oi = ic.OfflineInference(mlp_recipe(mlp_path)).init()
    oi.submit("m", ITEM, callback=blocks)
    assert entered.wait(30)
    closer = threading.Thread(target=oi.close, kwargs={"drain_timeout": 0.2})
    closer.start()
    closer.join(timeout=60)
    stuck = closer.is_alive()
    release.set()  # the callback ends, and with it its thread
    closer.join()
    assert not stuck, "close(drain_timeout=0.2) waited for a callback that never returned"
    for t in inferchain_threads():
        t.join(timeout=30)
    assert not inferchain_threads()


def test_keyboard_interrupt_from_a_listener_is_raised_again_on_the_callers_thread() -> None:
    """After the request's other listeners ran; on a framework thread it is only logged."""
    here = Request(1, "m")
    ran: list[str] = []
    here.add_done_listener(lambda r: (_ for _ in ()).throw(KeyboardInterrupt()))
    here.add_done_listener(lambda r: ran.append("second"))
    with pytest.raises(KeyboardInterrupt):
        here.transition(RequestState.CANCELLED)
    assert ran == ["second"]
    with pytest.raises(KeyboardInterrupt):  # already terminal: runs at once, here
        here.add_done_callback(lambda r: (_ for _ in ()).throw(KeyboardInterrupt()))

    there = Request(2, "m")
    there.add_done_callback(lambda r: (_ for _ in ()).throw(KeyboardInterrupt()))
    there.add_done_listener(lambda r: ran.append("third"))
    errors: list[BaseException] = []

    def end() -> None:
        try:
            there.transition(RequestState.CANCELLED)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=end, name="inferchain-test")
    thread.start()
    thread.join()
    assert errors == [] and ran == ["second", "third"]
