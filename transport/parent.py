"""The parent side of ``Parent.Session`` (DESIGN.md section 4), served by the PS and by every edge.

A child (edge or client) dials its parent and keeps one bidirectional stream: Hello -> Welcome (the RunSpec),
then Ready (its subtree joined, with data sizes). The parent pushes Task messages down the stream and the
child answers with Result messages; at the end the parent sends Bye and the child answers Bye with its byte
meter and missing log. :class:`NetComm` is the networked :class:`~fedhop.common.engine.api.Comm`: a scatter
becomes Task messages on the children's streams, a hand-off an ``Edge.HandOff`` stream to a neighbour edge,
a describe an ``Edge.Describe`` call.

Byte meter: a parent counts both directions of each of its parent-child links (so a killed child loses
nothing from the table); hand-offs and describes are counted by the caller.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import torch

from fedhop.common.engine.api import NodeContext, NodeId, Reply, Scalar
from fedhop.common.engine.base import BaseComm, Failure, HandOffError, MissingLog
from fedhop.common.engine.topology import Topology
from fedhop.common.spec import RunSpec
from fedhop.common.wire.bundle import Bundle, payload_bytes
from fedhop.common.wire.codec import CodecError
from fedhop.common.wire.frames import (
    CALL_ID_BASE,
    DESCRIBE,
    HANDOFF,
    MAX_MESSAGE,
    PROTOCOL_VERSION,
    BadFrame,
    FrameError,
    Message,
    MessageAssembler,
    error_frame,
    frame_size,
    get_scalars,
    message_frames,
    meter_rows_from_pb,
    missing_from_pb,
    on_host,
    parse_frame_lenient,
    put_scalars,
    serialize_frame,
    task_frame,
    to_device,
)
from fedhop.common.wire.meter import ByteMeter
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.parent")

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]
SERVER_OPTIONS = [
    *GRPC_OPTIONS,
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
    ("grpc.http2.max_pings_without_data", 0),
]
ROLES = {"client": pb.ROLE_CLIENT, "edge": pb.ROLE_EDGE, "server": pb.ROLE_SERVER}
ROLE_NAMES = {v: k for k, v in ROLES.items()}
NODE_HEADER = "fedhop-node"  # gRPC metadata: who calls (Edge.HandOff, Edge.Describe)
SLOT_HEADER = "fedhop-slot"  # gRPC metadata: the hand-off's inbox slot
_CLOSE = object()


def make_server(max_workers: int) -> grpc.Server:
    return grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                       options=SERVER_OPTIONS)


@dataclass
class Call:
    """One Task sent to one child, waiting for its Result."""

    call_id: int
    node: NodeId
    task: str
    round: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Reply | Failure | None = None

    def finish(self, result: Reply | Failure) -> None:
        if self.result is None:
            self.result = result
            self.done.set()


class ChildLink:
    """One child's session, seen from the parent: an outbound frame queue and what the child said."""

    def __init__(self, peer: str) -> None:
        self.peer = peer  # the transport address, for log lines
        self.node_id: NodeId | None = None
        self.role = ""
        self.address = ""  # an edge's Edge service
        self.alive = True
        self.ready = threading.Event()
        self.data_sizes: dict[NodeId, int] = {}
        self.bye = threading.Event()
        self.bye_rows: list[dict] = []
        self.bye_missing: list[dict] = []
        self._q: queue.Queue = queue.Queue()

    @property
    def name(self) -> str:
        return self.node_id or f"unidentified peer {self.peer}"

    def send(self, frames: Iterable[pb.Frame | bytes], on_sent: Callable[[int], None] | None = None) -> None:
        self._q.put((frames, on_sent))

    def close(self) -> None:
        self._q.put(_CLOSE)

    def outgoing(self) -> Iterator[pb.Frame | bytes]:
        """The response stream: frames in queue order; a message's frames are never interleaved."""
        while True:
            item = self._q.get()
            if item is _CLOSE:
                return
            frames, on_sent = item
            n = 0
            try:
                for f in frames:
                    n += frame_size(f)
                    yield f
            except CodecError as e:  # a bundle that cannot travel: the call fails on the parent
                log.error("cannot send to %s: %s", self.name, e)
                continue
            if on_sent is not None:
                on_sent(n)


class ParentHub:
    """Serves ``Parent.Session`` for one node (the PS or an edge): its children's sessions and calls."""

    def __init__(self, node_id: NodeId, meter: ByteMeter) -> None:
        self.node = node_id
        self.meter = meter
        self.configured = threading.Event()
        self.topology: Topology | None = None
        self.spec_json = ""
        self.run_id = ""
        self.chunk_bytes = 1 << 20
        self.max_bytes: int | None = None
        self.links: dict[NodeId, ChildLink] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._calls: dict[int, Call] = {}
        self._expired: dict[int, Call] = {}
        self._ids = itertools.count(CALL_ID_BASE)
        self.on_ready: Callable[[NodeId, dict[NodeId, int]], None] | None = None  # e.g. a progress bar's

    # -- set-up -------------------------------------------------------------------------------------------
    def configure(self, spec: RunSpec, topology: Topology, run_id: str) -> None:
        """Children may dial before this node knows the run (an edge before its Welcome); they wait."""
        self.topology = topology
        self.spec_json = spec.model_dump_json()
        self.run_id = run_id
        self.chunk_bytes = spec.transport.chunk_bytes
        self.max_bytes = spec.transport.max_bundle_bytes
        self.join_timeout_s = spec.transport.join_timeout_s
        self.configured.set()

    def register(self, server: grpc.Server) -> None:
        handler = grpc.stream_stream_rpc_method_handler(
            self.Session, request_deserializer=parse_frame_lenient, response_serializer=serialize_frame)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fedhop.v1.Parent",
                                                                             {"Session": handler}),))

    @property
    def children(self) -> tuple[NodeId, ...]:
        assert self.topology is not None
        return self.topology.children(self.node)

    def wait_ready(self, timeout_s: float, give_up: Callable[[], str | None] | None = None) -> list[NodeId]:
        """Wait until every child said Ready; returns the children that did not (in canonical order).

        ``give_up``, polled about once a second, ends the wait early when it returns a reason."""
        end = time.monotonic() + timeout_s
        with self._changed:
            while True:
                absent = [c for c in self.children if not (c in self.links and self.links[c].ready.is_set())]
                left = end - time.monotonic()
                if not absent or left <= 0 or (give_up is not None and give_up()):
                    return absent
                self._changed.wait(min(left, 1.0))

    def data_sizes(self) -> dict[NodeId, int]:
        """Clients' data sizes reported by the ready children (a client: its own; an edge: its cluster's)."""
        out: dict[NodeId, int] = {}
        with self._lock:
            for link in self.links.values():
                if link.ready.is_set():
                    out.update(link.data_sizes)
        return out

    def start_run(self, peers: Mapping[NodeId, str]) -> None:
        """Tell every connected child the run starts (edges: with the edges' addresses)."""
        f = pb.Frame()
        f.ready.SetInParent()
        for k, v in peers.items():
            f.ready.peers[k] = v
        for link in self._alive():
            link.send([f])

    def edge_addresses(self) -> dict[NodeId, str]:
        with self._lock:
            return {n: link.address for n, link in self.links.items() if link.role == "edge" and link.address}

    def _alive(self) -> list[ChildLink]:
        with self._lock:
            return [link for link in self.links.values() if link.alive]

    def shutdown(self, timeout_s: float) -> tuple[list[dict], list[dict]]:
        """Bye to every child; wait for their Bye (meter rows and missing logs), then close the streams."""
        links = self._alive()
        bye = pb.Frame()
        bye.bye.reason = "run finished"
        for link in links:
            link.send([bye])
        end = time.monotonic() + timeout_s
        rows: list[dict] = []
        missing: list[dict] = []
        for link in links:
            if link.bye.wait(max(0.0, end - time.monotonic())):
                rows += link.bye_rows
                missing += link.bye_missing
            else:
                log.warning("%s: no Bye from %s within %.0fs; its byte counts are lost", self.node, link.name,
                            timeout_s)
        for link in links:
            link.close()
        return rows, missing

    # -- the RPC ------------------------------------------------------------------------------------------
    def Session(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        link = ChildLink(context.peer())
        reader = threading.Thread(target=self._read, args=(link, request_iterator, context),
                                  name=f"session-{link.peer}", daemon=True)
        reader.start()
        yield from link.outgoing()

    def _read(self, link: ChildLink, frames: Iterator[Any], context: grpc.ServicerContext) -> None:
        asm = MessageAssembler(max_bytes=self.max_bytes)
        why = "the child closed its stream"
        try:
            for frame in frames:
                if link.node_id is None:
                    if not self._hello(link, frame):
                        return
                    continue
                if isinstance(frame, pb.Frame):
                    body = frame.WhichOneof("body")
                    if body is None:
                        continue  # keep-alive
                    if body == "hello":
                        self._complain(link, 0, pb.ERROR_CODE_BAD_REQUEST,
                                       f"duplicate Hello from {link.name} on an open session; ignored")
                        continue
                    if body == "ready":
                        self._ready(link, frame.ready)
                        continue
                    if body == "bye":
                        link.bye_rows = meter_rows_from_pb(frame.bye.meter)
                        link.bye_missing = missing_from_pb(frame.bye.missing)
                        link.bye.set()
                        continue
                    if body == "error" and frame.call_id == 0:
                        log.warning("%s: %s reports: %s", self.node, link.name, frame.error.message)
                        continue
                try:
                    msg = asm.feed(frame)
                except FrameError as e:
                    self._complain(link, e.call_id, pb.ERROR_CODE_BAD_REQUEST, f"{link.name}: {e}")
                    continue
                if msg is not None:
                    self._result(link, msg)
        except grpc.RpcError as e:
            why = f"stream broken ({e.code().name if hasattr(e, 'code') else e})"
        except Exception as e:  # never let one session take the node down
            why = f"session failed: {type(e).__name__}: {e}"
            log.exception("%s: session with %s failed", self.node, link.name)
        finally:
            self._lost(link, why)

    def _complain(self, link: ChildLink, call_id: int, code: int, message: str) -> None:
        log.warning("%s: %s", self.node, message)
        link.send([error_frame(call_id, code, message)])

    def _hello(self, link: ChildLink, frame: Any) -> bool:
        """Check the first frame of a session; answer Welcome, or Error and close."""
        def reject(code: int, message: str) -> bool:
            log.warning("%s: rejected %s: %s", self.node, link.peer, message)
            link.send([error_frame(0, code, message)])
            link.alive = False
            link.close()
            return False

        if not isinstance(frame, pb.Frame) or frame.WhichOneof("body") != "hello":
            what = frame.error if isinstance(frame, BadFrame) else type(frame).__name__
            if isinstance(frame, pb.Frame):
                what = frame.WhichOneof("body") or "keep-alive"
            return reject(pb.ERROR_CODE_BAD_REQUEST, f"the first frame of a session must be Hello, got {what}")
        hello = frame.hello
        if hello.protocol != PROTOCOL_VERSION:
            return reject(pb.ERROR_CODE_PROTOCOL_MISMATCH,
                          f"protocol {hello.protocol} is not this node's protocol {PROTOCOL_VERSION}")
        if not self.configured.wait(600):
            return reject(pb.ERROR_CODE_INTERNAL, f"{self.node} has not joined a run yet")
        node = hello.node_id
        if node not in self.children:
            return reject(pb.ERROR_CODE_BAD_REQUEST,
                          f"unknown node id {node!r}: the children of {self.node} are {list(self.children)}")
        assert self.topology is not None
        role = self.topology.role(node)
        if ROLE_NAMES.get(hello.role, "") != role:
            return reject(pb.ERROR_CODE_BAD_REQUEST,
                          f"{node} is a {role} in this run, but said Hello as {ROLE_NAMES.get(hello.role, '?')}")
        with self._changed:
            old = self.links.get(node)
            if old is not None and old.alive:
                return reject(pb.ERROR_CODE_BAD_REQUEST,
                              f"duplicate Hello: {node} is already connected (from {old.peer})")
            link.node_id, link.role, link.address = node, role, hello.address
            self.links[node] = link
            self._changed.notify_all()
        w = pb.Frame()
        w.welcome.node_id = node
        w.welcome.role = ROLES[role]
        w.welcome.parent_id = self.node
        w.welcome.run_id = self.run_id
        w.welcome.spec = self.spec_json
        w.welcome.spec_format = "json"
        link.send([w])
        log.info("%s: %s joined from %s", self.node, node, link.peer)
        return True

    def _ready(self, link: ChildLink, ready: pb.Ready) -> None:
        with self._changed:
            link.data_sizes = {k: int(v) for k, v in ready.data_sizes.items()}
            link.ready.set()
            self._changed.notify_all()
        log.info("%s: %s is ready (%d clients, %d samples)", self.node, link.name, len(link.data_sizes),
                 sum(link.data_sizes.values()))
        if self.on_ready is not None:
            self.on_ready(link.name, dict(link.data_sizes))

    def _lost(self, link: ChildLink, why: str) -> None:
        link.alive = False
        link.close()
        if link.node_id is None:
            return
        with self._changed:
            pending = [c for c in self._calls.values() if c.node == link.node_id]
            for c in pending:
                del self._calls[c.call_id]
            self._changed.notify_all()
        for c in pending:
            c.finish(Failure(f"connection to {link.node_id} lost: {why}"))
        if not link.bye.is_set():
            log.warning("%s: lost %s: %s", self.node, link.node_id, why)

    # -- calls --------------------------------------------------------------------------------------------
    def call(self, target: NodeId, task: str, bundle: Bundle, args: Mapping[str, Scalar], round_idx: int,
             deadline_s: float) -> Call | Failure:
        """Push one Task (and its bundle) to a child; the Result completes the returned :class:`Call`."""
        with self._lock:
            link = self.links.get(target)
        if link is None or not link.alive:
            return Failure(f"{target} is not connected")
        cid = next(self._ids)
        head = task_frame(cid, task, args, deadline_s=deadline_s, has_bundle=bool(bundle), round_idx=round_idx)
        try:
            frames = message_frames(head, bundle, self.chunk_bytes)
        except CodecError as e:
            return Failure(f"cannot send the bundle: {e}")
        call = Call(cid, target, task, round_idx)
        with self._lock:
            self._calls[cid] = call
        payload = payload_bytes(bundle)

        def sent(n: int) -> None:
            self.meter.record(self.node, target, task, "request", payload, n, round_idx)

        link.send(frames, sent)
        return call

    def expire(self, call: Call, why: str) -> None:
        """The caller stopped waiting: a reply that still comes is counted and dropped."""
        with self._lock:
            if self._calls.pop(call.call_id, None) is not None:
                self._expired[call.call_id] = call
        call.finish(Failure(why))

    def _result(self, link: ChildLink, msg: Message) -> None:
        with self._lock:
            info = self._calls.get(msg.call_id) or self._expired.get(msg.call_id)
            if info is not None and info.node == link.node_id:
                call = self._calls.pop(msg.call_id, None)
                late = self._expired.pop(msg.call_id, None) if call is None else None
            else:
                info = call = late = None
        if info is None:
            self._complain(link, msg.call_id, pb.ERROR_CODE_BAD_REQUEST,
                           f"{link.name} answered call {msg.call_id}, which is not pending for it")
            return
        self.meter.record(info.node, self.node, info.task, "reply", msg.payload_bytes, msg.message_bytes,
                          info.round)
        if late is not None:
            log.info("%s: late reply from %s to %s (round %d) dropped", self.node, info.node, info.task,
                     info.round + 1)
            return
        assert call is not None
        if msg.kind != "result":
            call.finish(Failure(f"{link.name} answered with a {msg.kind} frame instead of a Result"))
        elif not msg.head.result.ok:
            err = msg.head.result.error
            call.finish(Failure(f"{pb.ErrorCode.Name(err.code)}: {err.message}"))
        elif msg.error is not None:
            call.finish(Failure(f"reply from {link.name} could not be decoded: {msg.error}"))
        else:
            call.finish(Reply(msg.bundle, get_scalars(msg.head.result.scalars)))


class NetComm(BaseComm):
    """The networked :class:`~fedhop.common.engine.api.Comm` of one node (the PS or an edge)."""

    def __init__(self, node: NodeId, topology: Topology, missing: MissingLog, hub: ParentHub, spec: RunSpec,
                 peers: Mapping[NodeId, str] | None = None) -> None:
        super().__init__(node, topology, missing)
        self.hub = hub
        self.meter = hub.meter
        self.transport = spec.transport
        self.peers = peers if peers is not None else {}  # filled when the run starts (edges only)
        self.ctx: NodeContext | None = None
        self._channels: dict[str, grpc.Channel] = {}

    def current_round(self) -> int:
        return self.ctx.round if self.ctx is not None else -1

    def _exchange(self, targets: list[NodeId], task: str, bundle: Bundle, args: dict[str, Scalar],
                  deadline_s: float | None) -> dict[NodeId, Reply | Failure]:
        deadline = deadline_s if deadline_s is not None else self.transport.round_deadline_s
        rnd = self.current_round()
        snapshot = on_host(bundle)
        sent = {t: self.hub.call(t, task, snapshot, args, rnd, deadline) for t in targets}
        end = time.monotonic() + deadline
        out: dict[NodeId, Reply | Failure] = {}
        device = self.ctx.device if self.ctx is not None else torch.device("cpu")
        for t, c in sent.items():
            if isinstance(c, Failure):
                out[t] = c
                continue
            if not c.done.wait(max(0.0, end - time.monotonic())):
                self.hub.expire(c, f"no reply within the deadline of {deadline:g}s")
            r = c.result
            assert r is not None
            out[t] = Reply(to_device(r.bundle, device), r.scalars) if isinstance(r, Reply) else r
        return out

    # -- edge -> edge ---------------------------------------------------------------------------------------
    def _channel(self, peer: NodeId) -> grpc.Channel:
        if peer not in self.peers:
            raise HandOffError(f"{self.node} does not know the address of {peer} (known: {sorted(self.peers)})")
        addr = self.peers[peer]
        if addr not in self._channels:
            self._channels[addr] = grpc.insecure_channel(addr, options=GRPC_OPTIONS)
        return self._channels[addr]

    def hand_off(self, to: NodeId, slot: str, bundle: Bundle, scalars: Mapping[str, Scalar] | None = None) -> None:
        """Stream the bundle to the neighbour's ``Edge.HandOff``; retried on transport errors, acknowledged
        only once the neighbour holds and has validated the whole bundle."""
        self._check_peer(to)
        scalars = dict(scalars or {})
        snapshot = on_host(bundle)
        payload = payload_bytes(snapshot)
        rnd = self.current_round()
        call = self._channel(to).stream_unary("/fedhop.v1.Edge/HandOff", request_serializer=serialize_frame,
                                              response_deserializer=pb.Ack.FromString)
        last = ""
        for attempt in range(self.transport.handoff_retries + 1):
            head = task_frame(CALL_ID_BASE + attempt, HANDOFF, scalars, deadline_s=self.transport.rpc_timeout_s,
                              has_bundle=bool(snapshot))
            frames = message_frames(head, snapshot, self.transport.chunk_bytes)
            counted = [0]  # bytes of the frames gRPC has taken so far (the Ack may come before the
            #                iterator is asked for its end, so count each frame as it is handed over)

            def counting(frames: Iterable[Any] = frames, counted: list[int] = counted) -> Iterator[Any]:
                for f in frames:
                    counted[0] += frame_size(f)
                    yield f

            try:
                ack = call(counting(), timeout=self.transport.rpc_timeout_s,
                           metadata=((NODE_HEADER, self.node), (SLOT_HEADER, slot)))
            except grpc.RpcError as e:
                last = f"{e.code().name}: {e.details()}"
                if counted[0]:
                    self.meter.record(self.node, to, HANDOFF, "request", payload, counted[0], rnd)
                log.warning("%s: hand-off to %s failed (attempt %d): %s", self.node, to, attempt + 1, last)
                time.sleep(min(0.2 * 2 ** attempt, 2.0))
                continue
            self.meter.record(self.node, to, HANDOFF, "request", payload, counted[0], rnd)
            self.meter.record(to, self.node, HANDOFF, "reply", 0, ack.ByteSize(), rnd)
            if not ack.ok:
                reason = f"{to} rejected the hand-off from {self.node}: {ack.error.message}"
                self.missing.add(rnd, self.node, to, HANDOFF, reason)
                raise HandOffError(reason)
            return
        reason = f"hand-off {self.node} -> {to} failed after {self.transport.handoff_retries + 1} attempts: {last}"
        self.missing.add(rnd, self.node, to, HANDOFF, reason)
        raise HandOffError(reason)

    def describe(self, peers: list[NodeId]) -> dict[NodeId, dict[str, Scalar]]:
        out: dict[NodeId, dict[str, Scalar]] = {}
        rnd = self.current_round()
        for p in self.topology.sort(peers):
            self._check_peer(p)
            req = pb.DescribeRequest()
            call = self._channel(p).unary_unary("/fedhop.v1.Edge/Describe",
                                               request_serializer=pb.DescribeRequest.SerializeToString,
                                               response_deserializer=pb.DescribeReply.FromString)
            try:
                rep = call(req, timeout=self.transport.rpc_timeout_s, metadata=((NODE_HEADER, self.node),))
            except grpc.RpcError as e:  # an unreachable peer is absent from the answer, as in scatter
                self.missing.add(rnd, self.node, p, DESCRIBE, f"{e.code().name}: {e.details()}")
                continue
            self.meter.record(self.node, p, DESCRIBE, "request", 0, req.ByteSize(), rnd)
            self.meter.record(p, self.node, DESCRIBE, "reply", 0, rep.ByteSize(), rnd)
            out[p] = get_scalars(rep.info)
        return out

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()


def describe_reply(facts: Mapping[str, Scalar]) -> pb.DescribeReply:
    r = pb.DescribeReply()
    put_scalars(r.info, facts)
    return r
