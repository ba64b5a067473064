"""Issue 19: a process fedhop owns settles its heap (``common/heap.py``): what survived a full collection is frozen,
so later collections do not walk a federation's sessions again; a frozen cycle that became garbage is reclaimed
when the process settles again after sessions ended."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from fedhop.common import heap


@pytest.fixture
def settler() -> Iterator[heap.Settler]:
    s = heap.Settler()
    s.own({})
    yield s
    gc.unfreeze()  # the test process's heap as it was


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_the_environment_turns_it_on_or_off_and_a_bad_value_is_named() -> None:
    assert heap.enabled_by({}) and heap.enabled_by({heap.ENV: ""}) and heap.enabled_by({heap.ENV: "1"})
    assert not heap.enabled_by({heap.ENV: "0"})
    with pytest.raises(ValueError, match="FEDHOP_GC_FREEZE='yes'"):
        heap.enabled_by({heap.ENV: "yes"})


def test_a_process_that_is_not_owned_or_turned_off_keeps_its_collector() -> None:
    s = heap.Settler()  # never own()ed: a library caller's process
    assert not s.settle("joined") and gc.get_freeze_count() == 0
    s.own({heap.ENV: "0"})
    assert not s.settle("joined") and gc.get_freeze_count() == 0
    assert not heap.Settler().claimed  # only the command line and forked role processes claim the process


def test_settle_freezes_what_lives_and_collects_what_does_not(settler: heap.Settler) -> None:
    dead = Node()
    gone = weakref.ref(dead)
    del dead
    alive = [Node() for _ in range(1000)]
    assert any(o is alive[0] for o in gc.get_objects())  # tracked: every full collection walks it
    assert settler.settle("joined")
    assert gone() is None  # the garbage cycle was collected before the freeze
    assert gc.get_freeze_count() >= len(alive) and settler.last_frozen >= len(alive)
    assert not any(o is alive[0] for o in gc.get_objects())  # frozen: no collection walks it any more
    assert alive[0].me is alive[0]


def test_a_frozen_cycle_that_becomes_garbage_is_reclaimed_by_the_next_settle(settler: heap.Settler) -> None:
    session = Node()
    ref = weakref.ref(session)
    assert settler.settle("joined")
    settled_at = settler.settled_at
    assert settled_at is not None
    del session  # the session ended: its cycle is garbage, but frozen
    gc.collect()
    assert ref() is not None  # the cost of freezing: not reclaimed while frozen
    assert not settler.maybe_resettle("ended", now=settled_at + heap.RESETTLE_MIN_S)  # no session ended: stays
    settler.session_ended()
    assert not settler.maybe_resettle("ended", now=settled_at + heap.RESETTLE_MIN_S / 2)  # too soon
    assert ref() is not None
    assert settler.maybe_resettle("ended", now=settled_at + heap.RESETTLE_MIN_S)
    assert ref() is None and not settler.stale and settler.settles == 2


def test_no_resettle_before_the_first_settle(settler: heap.Settler) -> None:
    settler.session_ended()
    assert not settler.maybe_resettle("ended", now=1e12)
    assert gc.get_freeze_count() == 0
