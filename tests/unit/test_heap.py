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
    if s.thresholds_before is not None:
        gc.set_threshold(*s.thresholds_before)


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
    threshold = gc.get_threshold()
    assert not s.settle("joined") and gc.get_freeze_count() == 0 and gc.get_threshold() == threshold
    assert not heap.Settler().claimed  # only the command line and forked role processes claim the process


def test_settle_freezes_what_lives_and_collects_what_does_not(settler: heap.Settler) -> None:
    dead = Node()
    gone = weakref.ref(dead)
    del dead
    alive = [Node() for _ in range(1000)]
    assert any(o is alive[0] for o in gc.get_objects())  # tracked: every full collection walks it
    before = gc.get_threshold()
    assert settler.settle("joined")
    assert gc.get_threshold() == heap.THRESHOLDS and settler.thresholds_before == before
    assert gone() is None  # the garbage cycle was collected before the freeze
    assert gc.get_freeze_count() >= len(alive) and settler.last_frozen >= len(alive)
    assert not any(o is alive[0] for o in gc.get_objects())  # frozen: no collection walks it any more
    assert alive[0].me is alive[0]


def test_a_frozen_cycle_that_becomes_garbage_is_reclaimed_once_a_session_ended(settler: heap.Settler) -> None:
    session = Node()
    ref = weakref.ref(session)
    assert settler.settle("joined")
    t0 = settler.settled_at
    assert t0 is not None
    del session  # the session ended: its cycle is garbage, but frozen
    gc.collect()
    assert ref() is not None  # the cost of freezing: not reclaimed while frozen
    assert settler.tidy("quiet", now=t0 + heap.TIDY_MIN_S) == "young"  # no session ended: it stays frozen
    assert ref() is not None
    settler.session_ended()
    assert settler.tidy("quiet", now=t0 + heap.TIDY_MIN_S + 1) is None  # too soon after the last tidy
    assert settler.tidy("quiet", now=t0 + heap.RESETTLE_MIN_S / 2) == "young"  # too soon for a full settle
    assert ref() is not None
    assert settler.tidy("quiet", now=t0 + heap.RESETTLE_MIN_S) == "full"
    assert ref() is None and not settler.stale and settler.settles == 2


def test_a_tidy_freezes_what_the_round_left_and_collects_its_garbage(settler: heap.Settler) -> None:
    assert settler.settle("joined")
    t0 = settler.settled_at
    assert t0 is not None
    frozen = gc.get_freeze_count()
    rows = [Node() for _ in range(500)]  # what a round leaves that lives on (its meter rows)
    temp = Node()  # and a cycle that dies before the quiet point
    ref = weakref.ref(temp)
    del temp
    assert any(o is rows[0] for o in gc.get_objects())
    assert settler.tidy("after round 1", now=t0 + heap.TIDY_MIN_S) == "young"
    assert ref() is None  # collected (it was never frozen)
    assert not any(o is rows[0] for o in gc.get_objects()) and gc.get_freeze_count() >= frozen + len(rows)
    assert settler.settles == 1 and settler.tidies == 1


def test_frozen_objects_grown_twofold_make_the_tidy_a_full_settle(settler: heap.Settler) -> None:
    assert settler.settle("joined")
    t0 = settler.settled_at
    assert t0 is not None
    keep = [Node() for _ in range(settler.last_frozen * heap.GROWTH)]  # the frozen set will have doubled
    dead = Node()
    ref = weakref.ref(dead)
    assert settler.tidy("round 1", now=t0 + heap.TIDY_MIN_S) == "young"  # dead is frozen with the rest
    del dead
    assert settler.tidy("round 2", now=t0 + 2 * heap.TIDY_MIN_S) == "full"
    assert ref() is None and len(keep) > 0


def test_nothing_before_the_first_settle(settler: heap.Settler) -> None:
    settler.session_ended()
    assert settler.tidy("quiet", now=1e12) is None
    assert gc.get_freeze_count() == 0
