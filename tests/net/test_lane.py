"""The bulk lane (transport/lane.py): bundle payloads on a second connection per session, counted as before.

A parent hub on loopback (the asyncio server the PS and the edges serve on) calls a fake child (a ChildSession
whose tasks the test reads and answers); a 2 MiB bundle goes down in the Task and comes back, doubled, in the
Result. Each test says what it checks: that the lane carried the payloads, that every byte count per link is
the one without the lane, the fallbacks, a refused impostor, a peer that dies mid-payload, and mutual TLS.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from fedhop.common.engine.api import Reply
from fedhop.common.engine.base import Failure
from fedhop.common.spec import RunSpec
from fedhop.common.wire.messages import Message, chunk_frames_bytes, message_frames, result_frame
from fedhop.common.wire.meter import WIRE_KIND
from fedhop.transport import lane as lane_mod
from fedhop.transport.certs import init_folder
from fedhop.transport.channels import add_port, make_server
from fedhop.transport.child import ChildSession
from fedhop.transport.credentials import PLAINTEXT, Security
from fedhop.transport.session import ParentHub
from tests.net.hubs import parent_with_children, take_task
from tests.waiting import wait_until

CHUNK = 256 << 10
CALL_ID = 1 << 57
SHAPE = (512, 1024)  # 2 MiB of float32: over the lane's default 1 MiB floor
SIZES = {"client-0": 10, "client-1": 20}


def make_spec() -> RunSpec:
    return RunSpec.parse({"name": "lane", "device": "cpu", "topology": {"clients": 2},
                          "data": {"dataset": "digits"}, "model": {"name": "mlp", "hidden": [8]},
                          "transport": {"chunk_bytes": CHUNK, "round_deadline_s": 60}})


def weights() -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))


def answer(child: ChildSession, msg: Message) -> None:
    """Reply with the task's bundle doubled (a Result message, sent as a real child sends it)."""
    out = {k: v * 2 for k, v in msg.bundle.items()}
    child.send(message_frames(result_frame(msg.call_id, {"n": 1}, has_bundle=True), out, CHUNK))


def exchange(hub: ParentHub, children: Mapping[str, ChildSession], node: str = "client-0") -> tuple[Reply, int]:
    """One call down and its reply back; (the reply, the bytes each way on a lane: the chunk frames')."""
    call = hub.call(node, "test.lane", {"w": weights()}, {"a": 1}, 0, 60)
    assert not isinstance(call, Failure), call
    answer(children[node], take_task(children[node]))
    assert call.done.wait(60)
    assert isinstance(call.result, Reply), call.result
    return call.result, chunk_frames_bytes(call.call_id, weights().numel() * 4, CHUNK)


def counted(hub: ParentHub) -> list[dict]:
    """The hub's meter rows, the wire level left out (a connection's TCP bytes differ by design)."""
    return [r for r in hub.meter.rows() if r["kind"] != WIRE_KIND]


def test_the_lane_carries_the_payloads_and_every_count_is_the_one_without_it() -> None:
    """Both directions go on the lane (its byte counters), the reply is right, and the meter's rows (messages,
    payload and message bytes per link, kind and phase) are identical with the lane on and off."""
    rows = {}
    for lane in (True, False):
        with parent_with_children(make_spec(), SIZES, lane=lane) as (hub, children, _):
            reply, nbytes = exchange(hub, children)
            assert torch.equal(reply.bundle["w"], weights() * 2)
            link = hub.roster.links["client-0"]
            if lane:
                assert link.lane is not None and children["client-0"]._stream.lane is not None
                assert children["client-0"]._stream.lane.received_bytes == nbytes  # the task's payload
                wait_until(lambda link=link, n=nbytes: link.lane.sent_bytes == n, "the lane writer to finish")
                assert link.lane.received_bytes == nbytes  # the reply's payload
                assert link.lane.remote in hub._child_addresses()  # its TCP counters are the child's link's
            else:
                assert link.lane is None and children["client-0"]._stream.lane is None
            rows[lane] = counted(hub)
    assert rows[True] == rows[False]
    assert any(r["payload_bytes"] == weights().numel() * 4 and r["phase"] == "reply" for r in rows[True])


def test_a_reply_refused_at_its_header_is_dropped_from_the_lane_which_stays_in_step() -> None:
    """The same checks as on the stream: a reply of the wrong shape fails at its header, before its bytes are
    decoded; its chunk frames are read off the lane and dropped, and the next call uses the lane as before."""
    with parent_with_children(make_spec(), SIZES, lane=True) as (hub, children, _):
        call = hub.call("client-0", "test.lane", {"w": weights()}, {}, 0, 60, expect={"w": torch.zeros(4, 4)})
        assert not isinstance(call, Failure)
        answer(children["client-0"], take_task(children["client-0"]))
        assert call.done.wait(30) and isinstance(call.result, Failure)
        assert "refused at its header" in call.result.reason and "(512, 1024)" in call.result.reason
        reply, nbytes = exchange(hub, children)
        assert torch.equal(reply.bundle["w"], weights() * 2)
        assert hub.roster.links["client-0"].lane.received_bytes == 2 * nbytes


def test_a_lane_that_cannot_be_opened_leaves_the_bundles_on_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The offer names a port where nothing listens: the child goes on without a lane, and so does the call; the
    process does not dial that port again (a firewall that drops it would cost every session the timeout)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # closed again: connections there are refused
    monkeypatch.setattr(lane_mod, "_UNREACHABLE", set())  # the port is remembered as unreachable: not for others
    real = lane_mod.LaneOffer.metadata
    monkeypatch.setattr(lane_mod.LaneOffer, "metadata",
                        lambda self: real(lane_mod.LaneOffer(dead, self.token, self.min_bytes)))
    with parent_with_children(make_spec(), SIZES, lane=True) as (hub, children, _):
        reply, _ = exchange(hub, children)
        assert torch.equal(reply.bundle["w"], weights() * 2)
        assert children["client-0"]._stream.lane is None and hub.roster.links["client-0"].lane is None
        assert sorted(lane_mod._UNREACHABLE) == [("127.0.0.1", dead)]  # remembered: client-1 did not wait again


def test_lanes_beyond_the_file_descriptor_budget_are_not_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parent offers as many lanes as a quarter of its file descriptors (here: one): the other session keeps
    its bundles on the stream, and both calls work."""
    monkeypatch.setattr(lane_mod, "max_lanes", lambda: 1)
    with parent_with_children(make_spec(), SIZES, lane=True) as (hub, children, _):
        has = {n: hub.roster.links[n].lane is not None for n in SIZES}
        assert sorted(has.values()) == [False, True]
        for node in SIZES:
            reply, _ = exchange(hub, children, node)
            assert torch.equal(reply.bundle["w"], weights() * 2)
            assert (children[node]._stream.lane is not None) == has[node]


def test_an_impostor_on_the_lane_port_is_refused_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A connection with a wrong token is refused with a log line; the sessions and their lanes go on."""
    with parent_with_children(make_spec(), SIZES, lane=True) as (hub, children, _):
        assert hub._lanes is not None
        with caplog.at_level(logging.WARNING, logger="fedhop.lane"), \
                socket.create_connection(("127.0.0.1", hub._lanes.port), timeout=10) as s:
            s.sendall(lane_mod.MAGIC + b"0" * lane_mod.TOKEN_CHARS)
            assert s.recv(1) == b""  # closed without the OK byte
        assert "refused a bulk-lane connection" in caplog.text and "unknown or used token" in caplog.text
        reply, nbytes = exchange(hub, children)
        assert torch.equal(reply.bundle["w"], weights() * 2)
        assert hub.roster.links["client-0"].lane.received_bytes == nbytes


def test_a_child_dying_mid_payload_is_a_missing_reply_with_a_reason() -> None:
    """client-0 sends its Result and half its payload, then its lane and stream end: its call fails with the
    truncation named, its session ends (as a broken stream's), and client-1's reply of the same round comes in."""
    with parent_with_children(make_spec(), SIZES, lane=True) as (hub, children, _):
        dying, honest = children["client-0"], children["client-1"]
        call0 = hub.call("client-0", "test.lane", {"w": weights()}, {}, 0, 60)
        call1 = hub.call("client-1", "test.lane", {"w": weights()}, {}, 0, 60)
        assert not isinstance(call0, Failure) and not isinstance(call1, Failure)
        msg = take_task(dying)
        out = message_frames(result_frame(msg.call_id, {}, has_bundle=True), msg.bundle, CHUNK)
        dying.send(out.control_frames())
        lane = dying._stream.lane
        assert lane is not None
        chunks = list(out.lane_buffers())
        half = chunks[: len(chunks) // 2]
        for bufs in half:  # the first half of the chunk frames, as the lane's writer would write them
            for b in bufs:
                lane.sock.sendall(b)
        sent = sum(len(b) if isinstance(b, bytes) else b.nbytes for bufs in half for b in bufs)
        wait_until(lambda: hub.roster.links["client-0"].lane.received_bytes == sent, "the first half to arrive")
        lane.close()  # the peer dies: its lane ends mid-payload
        assert call0.done.wait(30)
        assert isinstance(call0.result, Failure) and "could not be decoded" in call0.result.reason
        assert "payload" in call0.result.reason or "truncated" in call0.result.reason, call0.result.reason
        wait_until(lambda: not hub.roster.links["client-0"].alive, "client-0's session to end")
        answer(honest, take_task(honest))
        assert call1.done.wait(30) and isinstance(call1.result, Reply)
        assert torch.equal(call1.result.bundle["w"], weights() * 2)


def test_a_lane_from_another_host_than_its_session_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """A session whose stream came through a proxy (another address than its lane's) gets no lane: the lane
    would skip the emulated link. The token alone is not enough."""
    with parent_with_children(make_spec(), SIZES, lane=True) as (hub, children, _):
        attached = []
        offer = hub._lanes.offer(attached.append, None, "client-x", "ipv4:10.1.2.3:5000")
        with caplog.at_level(logging.INFO, logger="fedhop.lane"):
            got = lane_mod.dial_lane(f"127.0.0.1:{offer.port}", offer, Security.insecure("client-x"), "client-x")
        assert got is None and attached == []
        assert "a proxy between them?" in caplog.text


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    init_folder(d, ["ps", "client-0", "client-1"])
    return d


def mtls(pki: Path) -> dict[str, Security]:
    return {n: Security.load(n, pki) for n in ("ps", "client-0", "client-1")}


def test_a_tls_lane_carries_the_payloads(pki: Path) -> None:
    """With mutual TLS the lane is TLS too (same certificates), and carries both payloads."""
    with parent_with_children(make_spec(), SIZES, lane=True, security=mtls(pki)) as (hub, children, _):
        reply, nbytes = exchange(hub, children)
        assert torch.equal(reply.bundle["w"], weights() * 2)
        lane = hub.roster.links["client-0"].lane
        assert lane is not None and lane.received_bytes == nbytes
        assert isinstance(lane.sock, ssl.SSLSocket)


def test_a_tls_lane_with_another_nodes_certificate_is_refused(pki: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A token presented with client-1's certificate on client-0's session's offer is refused and logged."""
    sec = mtls(pki)
    with parent_with_children(make_spec(), SIZES, lane=True, security=sec) as (hub, children, _):
        link = hub.roster.links["client-0"]
        offer = hub._lanes.offer(lambda lane: None, link.identity, link.name, link.peer)
        with caplog.at_level(logging.WARNING, logger="fedhop.lane"):
            got = lane_mod.dial_lane(f"127.0.0.1:{offer.port}", offer, sec["client-1"], "client-1")
        assert got is None
        assert "the certificate names 'client-1', the session is 'client-0'" in caplog.text


def test_the_lane_carries_the_very_bytes_of_the_chunk_frames() -> None:
    """``lane_buffers`` joined are the chunk frames the stream would have carried (tensors that cross chunk
    boundaries, a last short chunk), and ``message_bytes`` counts exactly the frames iterating yields."""
    g = torch.Generator().manual_seed(3)
    bundle = {"a": torch.randn(1000, generator=g), "b": torch.randn(3, 777, generator=g),
              "c": torch.arange(5, dtype=torch.int64)}
    msg = message_frames(result_frame(CALL_ID, {"n": 1}, has_bundle=True), bundle, 1024)
    frames = list(msg)
    assert isinstance(frames[2], bytes) and len(frames) > 4
    lane = b"".join(bytes(b) for bufs in msg.lane_buffers() for b in bufs)
    assert lane == b"".join(frames[2:])
    assert msg.message_bytes == frames[0].ByteSize() + frames[1].ByteSize() + len(lane)
    assert msg.control_frames() == frames[:2]


@pytest.mark.parametrize("value", ["", "80", "80 short 1", "0 " + "a" * 32 + " 1", "80 " + "a" * 32 + " 0",
                                   "x " + "a" * 32 + " 1"])
def test_an_unreadable_offer_is_no_offer(value: str) -> None:
    assert lane_mod.LaneOffer.parse([(lane_mod.LANE_METADATA, value)]) is None
    assert lane_mod.LaneOffer.parse([("other", "1 2 3")]) is None


def test_an_offer_reads_back() -> None:
    offer = lane_mod.LaneOffer(5000, "b" * 32, 1 << 20)
    assert lane_mod.LaneOffer.parse(offer.metadata()) == offer


@pytest.mark.parametrize(("stream", "lane", "same"), [
    ("10.0.0.7", "10.0.0.7", True), ("127.0.0.1", "::1", True), ("::ffff:10.0.0.7", "10.0.0.7", True),
    ("127.0.0.1", "10.0.0.7", False), ("10.0.0.8", "10.0.0.7", False), (None, "127.0.0.1", False)])
def test_a_lane_must_come_from_its_sessions_host(stream: str | None, lane: str, same: bool) -> None:
    assert lane_mod.same_host(stream, lane) is same


@pytest.mark.parametrize(("listen", "bound"), [("127.0.0.1:0", "127.0.0.1"), ("0.0.0.0:0", None)])
def test_the_lane_listener_binds_the_host_of_the_grpc_port(listen: str, bound: str | None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A PS listening on loopback opens no lane port on the machine's other interfaces; a wildcard --listen
    gives a wildcard lane listener (dual-stack where the machine has IPv6, else 0.0.0.0)."""
    monkeypatch.delenv(lane_mod.ENV_HOST, raising=False)
    monkeypatch.setattr(lane_mod, "_listen_host", None)
    server = make_server(2)
    try:
        add_port(server, listen)
        lanes = lane_mod.LaneServer("ps", PLAINTEXT)
        try:
            wildcard = "::" if socket.has_dualstack_ipv6() else "0.0.0.0"
            assert lanes._sock.getsockname()[0] == (bound or wildcard)
        finally:
            lanes.close()
    finally:
        server.stop(None)
