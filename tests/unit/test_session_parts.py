"""The session's parts seen from outside, driven without sockets: an edge's :class:`PendingHub` (sessions that
come before the run is known) and the hub's one :class:`HubListener`."""

from __future__ import annotations

import logging
import threading

import pytest

from fedhop.common.engine.base import MissingLog
from fedhop.common.spec import RunSpec
from fedhop.common.topology import build_topology
from fedhop.common.wire.messages import PROTOCOL_VERSION
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.session import HubConfig, HubListener, ParentHub, PendingHub, hello_frame
from fedhop.transport.session.pending import HELD_FRAMES
from fedhop.v1 import fedhop_pb2 as pb
from tests.unit.hostile import RUN_ID, configured_hub, drain, errors, join, spec_for
from tests.waiting import wait_until


def hub_for(spec: RunSpec) -> ParentHub:
    topo = build_topology(spec.topology, spec.seed)
    return ParentHub(HubConfig(topo.server, spec, topo, RUN_ID), ByteMeter(), MissingLog())


def test_a_hello_before_the_run_is_known_waits_for_the_hub_and_is_welcomed() -> None:
    spec = spec_for(clients=2, max_bundle_bytes=1 << 20)
    pending = PendingHub("ps")
    link = pending.open("ipv4:127.0.0.1:1")
    answer: list[bool] = []
    said = threading.Thread(target=lambda: answer.append(pending.on_frame(link, hello_frame("client-0", "client",
                                                                                          "", {}, ""))))
    said.start()
    hub = hub_for(spec)
    try:
        pending.serve(hub)
        said.join(10)
        assert answer == [True]
        frames, closed = drain(link)
        assert [f.WhichOneof("body") for f in frames] == ["welcome"] and not closed
        assert frames[0].welcome.run_id == RUN_ID
        assert link.asm.max_bytes == 1 << 20  # the hub's caps, not the defaults the session was opened with
        assert pending.hub is hub and pending.open("ipv4:127.0.0.1:2").asm.max_bytes == 1 << 20
    finally:
        hub.shutdown(0.0, finished=True)


def test_a_hello_waits_for_the_run_no_longer_than_run_wait_s(caplog) -> None:
    caplog.set_level(logging.WARNING, "fedhop.session")
    pending = PendingHub("ps", run_wait_s=0.05)
    link = pending.open("ipv4:10.0.0.1:1")
    assert pending.on_frame(link, hello_frame("client-0", "client", "", {}, ""))  # held, not waited for
    wait_until(lambda: not link.alive, "the held Hello to be refused at run_wait_s", timeout=10)
    frames, closed = drain(link)
    assert errors(frames) == ["ps has not joined a run yet"] and closed and not link.alive
    assert "ps: rejected ipv4:10.0.0.1:1: ps has not joined a run yet" in caplog.text


def test_a_held_hello_holds_no_thread_and_its_sessions_later_frames_follow_it_to_the_hub() -> None:
    # the edge's servicer hands frames to PendingHub.on_frame in a small pool: a Hello that waited there for the
    # run would hold a pool thread; it is kept instead, with what its session sends after it, in order
    spec = spec_for(clients=3)
    pending = PendingHub("ps")  # the default wait (10 minutes): on_frame must not wait for it
    links = [pending.open(f"ipv4:127.0.0.1:{i}") for i in range(3)]
    for i, link in enumerate(links):
        assert pending.on_frame(link, hello_frame(f"client-{i}", "client", "", {}, ""))
        assert drain(link) == ([], False)  # nothing said yet: no Welcome, no refusal
    ready = pb.Frame()
    ready.ready.data_sizes["client-0"] = 7
    assert pending.on_frame(links[0], ready)  # before its Welcome: held behind its Hello
    pending.lost(links[2], "the child closed its stream")  # gone before the run: never welcomed
    hub = hub_for(spec)
    try:
        assert pending.calls.arrived(links[0], pb.Frame(call_id=5)) is None  # no call pending before the hub
        pending.serve(hub)
        for link in links[:2]:
            frames, closed = drain(link)
            assert [f.WhichOneof("body") for f in frames] == ["welcome"] and not closed
        assert hub.data_sizes() == {"client-0": 7}  # its Ready came after its Hello, as sent
        assert set(hub.roster.links) == {"client-0", "client-1"}
        assert pending.on_frame(links[1], pb.Frame())  # the hub's from now on (a keep-alive)
    finally:
        hub.shutdown(0.0, finished=True)


def test_a_session_that_floods_before_its_welcome_is_refused_not_held() -> None:
    pending = PendingHub("ps")
    link = pending.open("ipv4:10.0.0.4:4")
    assert pending.on_frame(link, hello_frame("client-0", "client", "", {}, ""))
    for _ in range(HELD_FRAMES - 1):  # the Hello and what follows it, up to the cap: held
        assert pending.on_frame(link, pb.Frame())
    assert not pending.on_frame(link, pb.Frame())
    frames, closed = drain(link)
    assert errors(frames) == [f"more than {HELD_FRAMES} frames before the Welcome"] and closed and not link.alive
    hub = hub_for(spec_for(clients=1))
    try:
        pending.serve(hub)  # nothing of it is handed to the hub
        assert hub.roster.links == {}
    finally:
        hub.shutdown(0.0, finished=True)


@pytest.mark.parametrize("first, refusal", [
    (pb.Frame(), "the first frame of a session must be Hello, got keep-alive"),
    (pb.Frame(hello=pb.Hello(protocol=PROTOCOL_VERSION + 1, node_id="client-0")),
     f"protocol {PROTOCOL_VERSION + 1} is not this node's protocol {PROTOCOL_VERSION}"),
])
def test_a_bad_first_frame_is_refused_at_once_before_the_run_is_known(first: pb.Frame, refusal: str) -> None:
    pending = PendingHub("ps")  # the default wait (10 minutes): a refusal that waited would hang the test
    link = pending.open("ipv4:10.0.0.2:2")
    assert not pending.on_frame(link, first)
    assert errors(drain(link)[0]) == [refusal]


def test_a_session_lost_before_the_run_is_known_is_closed() -> None:
    pending = PendingHub("ps")
    link = pending.open("ipv4:10.0.0.3:3")
    pending.lost(link, "the child closed its stream")
    assert not link.alive and drain(link)[1]


def test_a_pending_hub_is_served_by_its_own_node_s_hub_only() -> None:
    hub = hub_for(spec_for())
    try:
        with pytest.raises(ValueError, match="the hub of ps cannot serve edge-0's sessions"):
            PendingHub("edge-0").serve(hub)
    finally:
        hub.shutdown(0.0, finished=True)


class Heard(HubListener):
    """Everything a hub tells its node, in order."""

    def __init__(self) -> None:
        self.news: list[tuple] = []

    def child_joined(self, node: str, role: str) -> None:
        self.news.append(("joined", node, role))

    def child_ready(self, node: str, sizes: dict[str, int]) -> None:
        self.news.append(("ready", node, sizes))

    def sizes_changed(self) -> None:
        self.news.append(("sizes",))

    def child_lost(self, node: str, why: str) -> None:
        self.news.append(("lost", node, why))


def test_the_listener_hears_joins_readies_late_sizes_and_losses() -> None:
    heard = Heard()
    with configured_hub(spec_for(clients=2), listener=heard) as (hub, _):
        first = join(hub, "client-0", size=4)
        assert heard.news == [("joined", "client-0", "client"), ("ready", "client-0", {"client-0": 4})]
        hub.start()
        join(hub, "client-1", peer="ipv4:127.0.0.1:2", size=6)  # after the start: its sizes change the cluster's
        assert heard.news[2:] == [("joined", "client-1", "client"), ("ready", "client-1", {"client-1": 6}),
                                  ("sizes",)]
        hub.lost(first, "stream broken (UNAVAILABLE)")
        assert heard.news[5:] == [("lost", "client-0", "stream broken (UNAVAILABLE)")]

