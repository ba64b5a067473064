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


def test_handshake_timers_are_one_thread_for_any_number_of_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    # a threading.Timer per session was a thread per joining child (667 threads in a PS while 1,000 joined)
    from fedhop.transport.session import liveness
    from fedhop.transport.session.liveness import Deadlines

    timers = Deadlines("test-deadlines")
    fired: list[int] = []
    done = threading.Event()
    before = threading.active_count()
    n = 500
    go = threading.Event()
    timers.call_later(0.0, go.wait, 30)  # holds the timer thread until every callback is scheduled
    base = time.monotonic()
    # the timers' clock stands still while they are scheduled: a test thread descheduled between two calls (a
    # loaded machine) must not shift one time past the next, 0.5 ms later
    monkeypatch.setattr(liveness, "time", type("Frozen", (), {"monotonic": staticmethod(lambda: base)}))
    for k in reversed(range(n)):  # scheduled last first: they run in the order of their times
        timers.call_later(0.0005 * k, lambda k=k: (fired.append(k), len(fired) == n and done.set()))
    monkeypatch.setattr(liveness, "time", time)
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


def test_collect_takes_each_reply_in_log_time_not_a_scan_of_the_calls_in_flight(monkeypatch) -> None:
    # submit / collect (FedBuff-like): each collected reply rebuilt a map of every submitted call and scanned them
    # all twice (their expiries, the soonest): O(n) a reply, O(n^2) for n; now a heap of the expiries
    from types import SimpleNamespace

    import torch

    from fedhop.common.wire.messages import result_frame
    from fedhop.transport.netcomm import NetComm
    from tests.unit.hostile import configured_hub, drain, join, spec_for

    n = 300
    spec = spec_for(clients=n)
    with configured_hub(spec) as (hub, topo):
        links = {f"client-{k}": join(hub, f"client-{k}", peer=f"ipv4:127.0.0.1:{20000 + k}") for k in range(n)}
        sizes = hub.start()
        comm = NetComm(topo.server, topo, hub.missing, hub, spec)
        comm.bind(SimpleNamespace(sizes=sizes, round=0, device=torch.device("cpu"), spec=spec))
        looked = [0]
        in_flight = NetComm._in_flight

        def counted(self: NetComm, node: str, call_id: int):  # noqa: ANN202
            looked[0] += 1
            return in_flight(self, node, call_id)

        monkeypatch.setattr(NetComm, "_in_flight", counted)
        silent = "client-7"
        for node in links:
            comm.submit(node, "fedavg.train", deadline_s=60.0 if node != silent else 0.3)
        for node, link in reversed(links.items()):  # answered last first; the silent one never answers
            if node != silent:
                task = next(f for f in drain(link)[0] if f.WhichOneof("body") == "task")
                hub.on_frame(link, result_frame(task.call_id, {"n": 10}, has_bundle=False))
        got = comm.collect(n, deadline_s=30.0)
        assert [t for t, _, _ in got] == [f"client-{k}" for k in reversed(range(n)) if f"client-{k}" != silent]
        assert comm.in_flight() == ()  # the silent child's call expired at its deadline and was taken as failed
        assert [e["node"] for e in hub.missing.entries] == [silent]
        assert looked[0] <= 4 * n  # a scan per reply would be ~n^2 = 90,000
