"""Many clients (issue 19): what made a round superlinear in its clients, counted (never timed)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from fedhop.transport.reply_gate import ReplyGate
from tests.waiting import wait_until


@pytest.mark.parametrize("window", [0, 3])
def test_reply_gate_wakes_each_waiting_reply_once_in_canonical_order(window: int) -> None:
    # 2,000 replies whose Result frames all arrive at once, last first: one condition for every waiter woke each
    # of them at every settle (n^2 wake-ups, each scanning the scatter's order); each is now woken once, when
    # its place is free, and in canonical order
    n = 2000
    gate = ReplyGate(window)
    ids = list(range(100, 100 + n))
    for cid in ids:
        gate.add(cid)
    admitted: list[int] = []
    at_once = [cid for cid in reversed(ids) if gate.try_enter(cid, lambda cid=cid: admitted.append(cid))]
    assert at_once == [*ids[n - window:][::-1], ids[0]]  # the window's places (taken first), then the head
    assert admitted == []
    for cid in ids:  # folded in canonical order
        gate.settled(cid)
    assert admitted == [c for c in ids if c not in at_once]
    assert gate.wakeups == n - len(at_once)


def test_reply_gate_admits_a_waiting_reply_that_was_given_up_on_without_taking_a_place() -> None:
    gate = ReplyGate(window=0)
    for cid in (1, 2, 3):
        gate.add(cid)
    admitted: list[int] = []
    assert not gate.try_enter(3, lambda: admitted.append(3))
    gate.settled(3)  # the scatter gave up on 3 while its reader waited: the reader goes on (and drops it)
    assert admitted == [3]
    assert not gate.try_enter(2, lambda: admitted.append(2))  # 1 is still the head: 2 waits as before
    gate.settled(1)
    assert admitted == [3, 2]
    gate.open()
    assert gate.try_enter(7, lambda: None)


def test_handshake_timers_are_one_thread_for_any_number_of_sessions() -> None:
    # a threading.Timer per session was a thread per joining child (667 threads in a PS while 1,000 joined)
    from fedhop.transport.session.liveness import Deadlines

    timers = Deadlines("test-deadlines")
    fired: list[int] = []
    done = threading.Event()
    before = threading.active_count()
    n = 500
    go = threading.Event()
    timers.call_later(0.0, go.wait, 30)  # holds the timer thread until every callback is scheduled
    base = time.monotonic()
    for k in reversed(range(n)):  # scheduled last first: they run in the order of their times
        timers.call_later(base + 0.0005 * k - time.monotonic(),
                          lambda k=k: (fired.append(k), len(fired) == n and done.set()))
    assert threading.active_count() <= before + 1
    go.set()
    assert done.wait(30)
    assert fired == list(range(n))
    timers.call_later(0.0, lambda: 1 / 0)  # a failing callback is logged; the next ones still run
    timers.call_later(0.0, done.clear)
    wait_until(lambda: not done.is_set(), "the callback after a failing one to run")
    assert len(timers) == 0


def test_a_host_id_whose_handshake_timed_out_dials_again_once_another_id_is_in(monkeypatch) -> None:
    # 1,000 ids joining a loaded machine: one handshake past its 5 s (NOT_FEDHOP) ended the whole host of 500 ids
    import fedhop.client.main as client_main
    from fedhop.client.host import run_clients
    from fedhop.common.exit_codes import ExitCode
    from fedhop.transport.node_config import NodeConfig

    first_in = asyncio.Event()
    tries: dict[str, int] = {}

    async def fake_run_client(config, host, on_ready):
        tries[config.node_id] = tries.get(config.node_id, 0) + 1
        if config.node_id == "client-0":
            on_ready(config.node_id)
            first_in.set()
            return ExitCode.OK
        assert await asyncio.wait_for(first_in.wait(), 10)
        if tries[config.node_id] == 1:
            return ExitCode.NOT_FEDHOP
        on_ready(config.node_id)
        return ExitCode.OK

    monkeypatch.setattr(client_main, "run_client_async", fake_run_client)
    assert run_clients(["client-0", "client-1"], NodeConfig("host", "127.0.0.1:1")) == ExitCode.OK
    assert tries == {"client-0": 1, "client-1": 2}
