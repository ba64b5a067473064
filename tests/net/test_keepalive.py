"""Issue 19: a parent's keep-alives. A session quiet for a third of ``transport.keepalive_timeout_s`` (at least
``transport.keepalive_s``) gets one, a session that was sent anything within that gets none (a keep-alive every
``keepalive_s`` to each quiet session was ~10 frames per client and round at 10,000 clients), and a child still
takes a parent that sends nothing for ``keepalive_timeout_s`` for stalled and re-joins, while keep-alives keep it
joined to a live one."""

from __future__ import annotations

import threading
import time

from fedhop.client.host import run_clients
from fedhop.common.engine.base import MissingLog
from fedhop.common.exit_codes import ExitCode
from fedhop.common.topology import build_topology
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.aio_server import make_loop_server
from fedhop.transport.channels import add_port
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.parent import serve_parent
from fedhop.transport.session import HubConfig, ParentHub
from fedhop.transport.session.link import ChildLink, Roster
from fedhop.transport.session.liveness import Liveness, keepalive_interval
from tests.specs import DIGITS, run_spec
from tests.waiting import wait_until


def _spec(transport: dict, clients: int = 2):
    return run_spec("fedavg", {}, clients=clients, edges=0, name="keepalive", rounds=1, data=DIGITS,
                    model={"name": "mlp", "hidden": [4]}, transport=transport)


def test_a_quiet_session_gets_a_keepalive_per_third_of_the_timeout_a_busy_one_none() -> None:
    # the rule on a simulated clock (no threads, no sockets): 120 s of ticks every keepalive_s / 2, the transport
    # taking each queued frame at the tick; "busy" is sent something every second, "quiet" nothing
    spec = _spec({"keepalive_s": 5.0, "keepalive_timeout_s": 30.0})
    t = spec.transport
    topo = build_topology(spec.topology, spec.seed)
    roster = Roster()
    liveness = Liveness(HubConfig(topo.server, spec, topo, "keepalive-run"), roster, None, None)  # type: ignore[arg-type]
    quiet, busy = ChildLink("quiet"), ChildLink("busy")
    roster.links = {"client-0": quiet, "client-1": busy}
    start = quiet.last_sent = busy.last_sent = 1000.0
    heard: dict[str, list[float]] = {"quiet": [start], "busy": [start]}
    tick, every = t.keepalive_s / 2, keepalive_interval(t)
    assert every == 10.0  # 30 s / 3 (more than keepalive_s)
    span, now, sent = 120.0, start, 0
    while now < start + span:
        now += tick
        busy.last_sent = now - (now - start) % 1.0  # sent a task chunk within the last second
        sent += liveness.keepalive_tick(now, every)
        for link in (quiet, busy):
            while (item := link.poll()) is not None:
                heard[link.peer].append(now)
                assert list(link.sent_frames(item)) and link.idle()
    assert len(heard["busy"]) == 1, "a session sent something within the interval gets no keep-alive"
    keepalives = len(heard["quiet"]) - 1
    assert sent == keepalives
    # one per 10 s of quiet (a keep-alive per keepalive_s, as before, was 24 here)
    assert keepalives <= span / (t.keepalive_timeout_s / 3), heard["quiet"]
    gaps = [b - a for a, b in zip(heard["quiet"], heard["quiet"][1:], strict=False)]
    assert max(gaps) <= every + tick < t.keepalive_timeout_s / 2, gaps  # a live parent never looks stalled


def test_keepalives_keep_a_quiet_child_joined_and_a_silent_parent_is_left(caplog) -> None:
    # a real PS hub and a client host of 2 ids over loopback: no tasks come, so the keep-alives alone keep the
    # children from taking the parent for stalled; once the parent stops sending them (stalled, to a child),
    # each child notices within keepalive_timeout_s and dials again (refused while its old session is still
    # open at the hub: it gives up after transport.reconnect_s)
    timeout_s = 1.2
    spec = _spec({"keepalive_s": 0.1, "keepalive_timeout_s": timeout_s, "reconnect_s": 0.5})
    assert keepalive_interval(spec.transport) == timeout_s / 3
    topo = build_topology(spec.topology, spec.seed)
    hub = ParentHub(HubConfig(topo.server, spec, topo, "keepalive-run"), ByteMeter(), MissingLog())
    sent: list[int] = []
    tick = hub.liveness.keepalive_tick

    def counted(now: float, quiet_s: float) -> int:
        sent.append(tick(now, quiet_s))
        return sent[-1]

    hub.liveness.keepalive_tick = counted  # type: ignore[method-assign]
    server = make_loop_server()
    serve_parent(hub, server)
    addr = f"127.0.0.1:{add_port(server, '127.0.0.1:0')}"
    server.start()
    outcome: list[int] = []
    host = threading.Thread(target=lambda: outcome.append(run_clients(list(topo.clients),
                                                                      NodeConfig("host", addr, connect_timeout_s=30))),
                            name="keepalive-host", daemon=True)

    def noticed() -> set[str]:
        return {n for n in topo.clients for r in caplog.records
                if r.getMessage().startswith(f"{n}: nothing from parent") and "stalled or gone" in r.getMessage()}

    try:
        host.start()
        wait_until(lambda: len(hub.data_sizes()) == len(topo.clients), "both ids Ready", timeout=60)
        with hub.roster.lock:
            first = dict(hub.roster.links)
        # 3 keepalive timeouts of quiet: 9 keep-alives per child at one per timeout / 3
        wait_until(lambda: sum(sent) >= 9 * len(first), "the keep-alives of 3 timeouts of quiet", timeout=60)
        assert not noticed(), "a child took its parent for stalled although it sent keep-alives"
        with hub.roster.lock:
            assert hub.roster.links == first
        assert all(link.alive for link in first.values())
        hub.liveness.stop()  # the parent goes silent: its children must notice within keepalive_timeout_s
        silent = time.monotonic()
        wait_until(lambda: noticed() == set(topo.clients), "each child to notice its silent parent", timeout=60)
        # its last frame came at most an interval and a tick before the silence began
        early = timeout_s - keepalive_interval(spec.transport) - spec.transport.keepalive_s - 0.05
        assert time.monotonic() - silent >= early, "a child took its parent for stalled too early"
    finally:
        server.stop(0)
        hub.shutdown(1.0, finished=True)
        host.join(30)
    # the host ended: its ids re-joined and heard the Bye (OK), or gave the parent up (PARENT_LOST)
    assert not host.is_alive() and outcome and outcome[0] in (ExitCode.OK, ExitCode.PARENT_LOST), outcome
