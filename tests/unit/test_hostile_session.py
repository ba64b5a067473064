"""Hostile peers against the session protocol and the Edge service, driven without sockets (issue 9): a peer
that never says Hello, one that is not authenticated, replies to calls never sent, bundles beyond the per-peer
caps, refusals that would tell a stranger the topology, hand-offs into unused slots or stopped half-way, and a
client that never answers."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterable
from types import SimpleNamespace

import grpc
import pytest
import torch

from fedhop.common.engine.api import NodeContext
from fedhop.common.engine.base import Failure
from fedhop.common.engine.workspace import Workspace
from fedhop.common.spec import SpecError, TransportSpec
from fedhop.common.wire.budget import InflightBudget
from fedhop.common.wire.framing import bundle_frames, parse_frame
from fedhop.common.wire.messages import CALL_ID_BASE, HANDOFF, result_frame, task_frame
from fedhop.transport.credentials import Security
from fedhop.transport.netcomm import NetComm
from fedhop.transport.peer import NODE_HEADER, SLOT_HEADER, EdgeService
from fedhop.transport.session import hello_frame
from fedhop.v1 import fedhop_pb2 as pb
from tests.unit.hostile import RUN_ID, configured_hub, drain, errors, join, spec_for
from tests.waiting import wait_until

GiB = 1 << 30


def header_claiming(nbytes: int) -> pb.BundleHeader:
    return pb.BundleHeader(chunk_bytes=1 << 20, checksum_algorithm="none", total_bytes=nbytes,
                           tensors=[pb.TensorSpec(name="w", dtype="uint8", shape=[nbytes], nbytes=nbytes)])


# -- 1. handshake timeout --------------------------------------------------------------------------------------


def test_a_session_that_never_says_hello_is_closed_at_the_handshake_timeout(caplog) -> None:
    caplog.set_level(logging.WARNING, "fedhop.session")
    with configured_hub(spec_for(handshake_timeout_s=0.2)) as (hub, _):
        cancelled = threading.Event()
        link = hub.open("ipv4:10.9.8.7:4242", cancel=cancelled.set)
        assert cancelled.wait(5.0), "the transport's stream was not cancelled"
        frames, closed = drain(link)
        assert closed and not link.alive
        assert errors(frames) == ["no Hello within 0.2s"]
        assert "disconnected ipv4:10.9.8.7:4242: no Hello within transport.handshake_timeout_s = 0.2s" in caplog.text


def test_a_session_that_said_hello_outlives_the_handshake_timeout() -> None:
    with configured_hub(spec_for(handshake_timeout_s=0.2)) as (hub, _):
        cancelled = threading.Event()
        link = hub.open("ipv4:127.0.0.1:1", cancel=cancelled.set)
        assert hub.on_frame(link, hello_frame("client-0", "client", "", {}, ""))
        hub.liveness.hello_overdue(link)  # what the timer does when it fires
        assert link.alive and not cancelled.is_set()
        assert [f.WhichOneof("body") for f in drain(link)[0]] == ["welcome"]


def test_handshake_timeout_is_validated() -> None:
    with pytest.raises(SpecError, match="handshake_timeout_s"):
        spec_for(handshake_timeout_s=0)
    assert TransportSpec().handshake_timeout_s == 10.0


def test_an_unauthenticated_peer_is_refused_at_once_and_not_told_why(caplog) -> None:
    caplog.set_level(logging.WARNING, "fedhop.session")
    with configured_hub(spec_for(), security=Security("tls", "ps")) as (hub, _):
        link = hub.open("ipv4:10.0.0.66:999", None, "no verified client certificate on the connection")
        frames, closed = drain(link)
        assert closed and not link.alive  # no Hello is waited for: no server thread stays with it
        assert errors(frames) == ["unauthenticated peer"]
        assert "rejected ipv4:10.0.0.66:999: unauthenticated peer: no verified client certificate" in caplog.text


# -- 2. replies only to pending calls, per-peer caps --------------------------------------------------------------


def test_a_reply_to_a_call_never_sent_opens_no_bundle(allocations) -> None:
    with configured_hub(spec_for()) as (hub, _):
        link = join(hub, "client-0")
        for k in range(4):  # four 15 GiB bundles for calls the parent never sent
            cid = CALL_ID_BASE + 1000 + k
            assert hub.on_frame(link, result_frame(cid, {}, has_bundle=True))
            assert hub.on_frame(link, pb.Frame(call_id=cid, header=header_claiming(15 * GiB)))
            assert hub.on_frame(link, pb.Frame(call_id=cid, chunk=pb.Chunk(offset=0, data=b"x" * 1024)))
        frames, closed = drain(link)
        assert not closed and link.alive  # the child's session goes on; only the forged calls are refused
        refused = [f"client-0 answered call {CALL_ID_BASE + 1000 + k}, which is not pending for it" for k in range(4)]
        assert errors(frames) == [m for k, why in enumerate(refused) for m in (  # the head, then its header (issue 20)
            f"client-0: {why}",
            f"client-0: bundle header for call {CALL_ID_BASE + 1000 + k} refused ({why}); its chunks are dropped "
            "unread")]
        assert allocations == [] and link.asm.open_bundles == 0


def test_a_reply_to_another_childs_call_is_refused() -> None:
    with configured_hub(spec_for()) as (hub, _):
        a, b = join(hub, "client-0"), join(hub, "client-1", peer="ipv4:127.0.0.1:40001")
        hub.start()
        call = hub.call("client-0", "fedavg.train", {}, {}, 0, 30.0)
        assert not isinstance(call, Failure)
        drain(a)
        hub.on_frame(b, result_frame(call.call_id, {"n": 10}, has_bundle=False))
        assert errors(drain(b)[0]) == [f"client-1: client-1 answered call {call.call_id}, which is not pending for it"]
        assert not call.done.is_set()
        hub.on_frame(a, result_frame(call.call_id, {"n": 10}, has_bundle=False))
        assert call.done.is_set() and not isinstance(call.result, Failure)


def test_open_bundles_and_bytes_in_flight_are_capped_per_peer(allocations) -> None:
    spec = spec_for(max_bundle_bytes=1 << 20, max_open_bundles=1, max_inflight_bytes=1 << 20)
    with configured_hub(spec) as (hub, _):
        link = join(hub, "client-0")
        hub.start()
        c1, c2, c3 = (hub.call("client-0", "fedavg.train", {}, {}, 0, 30.0) for _ in range(3))
        drain(link)
        hub.on_frame(link, result_frame(c1.call_id, {}, has_bundle=True))
        hub.on_frame(link, pb.Frame(call_id=c1.call_id, header=header_claiming(1000)))
        assert allocations and link.asm.open_bundles == 1
        n = len(allocations)
        hub.on_frame(link, result_frame(c2.call_id, {}, has_bundle=True))  # a second bundle at once: over the cap
        hub.on_frame(link, pb.Frame(call_id=c2.call_id, header=header_claiming(1000)))
        assert c2.done.is_set() and "transport.max_open_bundles = 1" in c2.result.reason
        hub.on_frame(link, result_frame(c3.call_id, {}, has_bundle=True))  # over max_bundle_bytes: before allocating
        hub.on_frame(link, pb.Frame(call_id=c3.call_id, header=header_claiming((1 << 20) + 1)))
        assert c3.done.is_set() and "exceeds the limit" in c3.result.reason
        assert len(allocations) == n
        hub.lost(link, "test over")  # a session that ends releases what was arriving
        assert link.asm.open_bundles == 0 and link.asm.budget.in_flight == (0, 0)


def test_inflight_budget_counts_bytes_across_bundles() -> None:
    b = InflightBudget(max_open=4, max_bytes=100)
    assert b.reserve(60) is None
    assert "max_inflight_bytes = 100" in b.reserve(41)
    assert b.reserve(40) is None and b.in_flight == (2, 100)
    b.release(60)
    assert b.reserve(60) is None


def test_inflight_bytes_must_fit_the_largest_bundle() -> None:
    with pytest.raises(SpecError, match="max_inflight_bytes .* must be at least transport.max_bundle_bytes"):
        spec_for(max_bundle_bytes=1000, max_inflight_bytes=999)
    assert TransportSpec(max_bundle_bytes=1000).inflight_bytes() == 1000


# -- 4. refusals say little to strangers ---------------------------------------------------------------------------


def test_refusals_do_not_tell_a_stranger_the_topology(caplog) -> None:
    caplog.set_level(logging.WARNING, "fedhop.session")
    with configured_hub(spec_for(clients=3)) as (hub, topo):
        join(hub, "client-0", peer="ipv4:192.168.7.7:5000")
        said = []
        for hello in (hello_frame("client-9", "client", "", {}, ""),  # not a child
                      hello_frame("client-1", "edge", "", {}, ""),  # wrong role
                      hello_frame("client-0", "client", "", {}, "")):  # squatting a connected id
            link = hub.open("ipv4:10.6.6.6:6666")
            assert not hub.on_frame(link, hello)
            said += errors(drain(link)[0])
        assert len(said) == 3
        others = {"client-2", "192.168.7.7"}
        assert not any(o in m for m in said for o in others), said
        assert "(its children: ['client-0', 'client-1', 'client-2'])" in caplog.text  # the parent's log has it
        assert "(from ipv4:192.168.7.7:5000)" in caplog.text


# -- 3. hand-offs: unused slots, half-sent streams; a client that never answers -------------------------------------


class FakeContext:
    """The part of a grpc.aio.ServicerContext that EdgeService uses."""

    def __init__(self, sender: str, slot: str) -> None:
        self.md = ((NODE_HEADER, sender), (SLOT_HEADER, slot))
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self):
        return self.md

    def peer(self) -> str:
        return "ipv4:127.0.0.1:7777"

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise Aborted(details)  # as grpc.aio's abort: the handler ends here


class Aborted(Exception):
    pass


def hand_off(svc: EdgeService, frames: AsyncIterator | Iterable, context: FakeContext) -> pb.Ack:
    """``Edge.HandOff`` (a coroutine, as the edge's asyncio server runs it) on an event loop of its own."""
    async def stream() -> AsyncIterator:
        for f in frames:
            yield f

    return asyncio.run(svc.HandOff(frames if isinstance(frames, AsyncIterator) else stream(), context))


def edge_service(**transport) -> tuple[EdgeService, NodeContext]:
    spec = spec_for(clients=3, edges=3, algorithm="fedchs", **transport)
    ws = Workspace(spec, "cpu")
    svc = EdgeService("edge-0")
    ctx = NodeContext(node_id="edge-0", role="edge", ws=ws, comm=None)  # type: ignore[arg-type]
    svc.serve(ctx)
    return svc, ctx


def handoff_frames(bundle):
    head = task_frame(CALL_ID_BASE, HANDOFF, {}, deadline_s=5.0, has_bundle=True)
    return [head, *(parse_frame(f) if isinstance(f, bytes) else f for f in bundle_frames(CALL_ID_BASE, bundle, 4096))]


def test_a_hand_off_into_a_slot_the_algorithm_does_not_use_is_refused_unread() -> None:
    svc, ctx = edge_service()
    sender = ctx.neighbours[0]
    read = []

    def frames():
        read.append(1)
        yield from handoff_frames({"w": torch.ones(1000)})

    ack = hand_off(svc, frames(), FakeContext(sender, "junk-slot-17"))
    assert not ack.ok and "into slot 'junk-slot-17', which fedchs does not use" in ack.error.message
    assert read == [] and ctx.inbox == {}
    ack = hand_off(svc, handoff_frames({"w": torch.ones(3)}), FakeContext(sender, "model"))
    assert ack.ok and torch.equal(ctx.inbox["model"][0]["w"], torch.ones(3))


def test_a_half_sent_hand_off_is_cancelled_at_the_servers_deadline() -> None:
    svc, ctx = edge_service(rpc_timeout_s=0.2)
    sender = ctx.neighbours[0]
    context = FakeContext(sender, "model")
    frames = handoff_frames({"w": torch.ones(100_000)})

    async def half() -> AsyncIterator:
        for f in frames[:3]:  # the head, the header and one chunk; then nothing (as gRPC: until the call ends)
            yield f
        await asyncio.Event().wait()

    with pytest.raises(Aborted):
        hand_off(svc, half(), context)
    assert context.aborted is not None and context.aborted[0] == grpc.StatusCode.CANCELLED
    assert "not complete within transport.rpc_timeout_s = 0.2s" in context.aborted[1]
    assert ctx.inbox == {}
    assert svc._budgets[sender].in_flight == (0, 0)  # the bundle it held is released


def test_a_client_that_never_answers_is_missing_at_the_round_deadline() -> None:
    spec = spec_for(clients=2, round_deadline_s=0.3)
    with configured_hub(spec) as (hub, topo):
        silent, honest = join(hub, "client-0"), join(hub, "client-1", peer="ipv4:127.0.0.1:2")
        sizes = hub.start()
        comm = NetComm(topo.server, topo, hub.missing, hub, spec)
        comm.bind(SimpleNamespace(sizes=sizes, round=0, device=torch.device("cpu"), spec=spec))

        def answer() -> None:
            tasks: list[pb.Frame] = []
            wait_until(lambda: tasks.extend(f for f in drain(honest)[0] if f.WhichOneof("body") == "task") or tasks,
                       "a task for client-1", timeout=5.0, poll=0.01)
            hub.on_frame(honest, result_frame(tasks[0].call_id, {"n": 10}, has_bundle=False))

        t = threading.Thread(target=answer)
        t.start()
        got = comm.scatter(["client-0", "client-1"], "fedavg.train")
        t.join()
        assert list(got) == ["client-1"]
        entries = hub.missing.entries
        assert [(e["node"], e["by"]) for e in entries] == [("client-0", "ps")]
        assert "no reply within the deadline of 0.3s" in entries[0]["reason"]
        assert silent.alive  # still connected: a client that only stalled takes part again when it answers
    assert RUN_ID
