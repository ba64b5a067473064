"""The session protocol of ``Parent.Session`` (DESIGN.md section 4), free of gRPC plumbing.

Parent side (:class:`ParentHub`, one per PS or edge), per child session (:class:`ChildLink`)::

    Hello -> checks (protocol, identity, role, late join, run) -> Welcome (the RunSpec)
    Ready (data sizes) -> the child is ready; admitted to calls at the next round boundary (:meth:`admit`)
    Task ... Result     (calls: :meth:`ParentHub.call`)
    Report              (byte-meter rows and missing entries since the last one; merged at once)
    Bye (finished?) -> the child's Bye (what it has not reported) -> close

A child whose stream broke re-joins with ``Hello.run_id`` set; the parent hands the node's id to the new
session (the old one is *superseded*: its calls stay pending and may still be answered on either session).
Child side (:class:`ChildProtocol`): Welcome / Ready / Task / Bye handling and the task worker; the gRPC
streams, dialing and re-joining are ``child.py``'s, the servicer is ``parent.py``'s.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedhop.common import timing
from fedhop.common.engine.api import NoAnswer, NodeContext, NodeId, Reply, Scalar, get_task, meter_kind
from fedhop.common.engine.base import Failure, MissingLog
from fedhop.common.engine.topology import Topology
from fedhop.common.spec import RunSpec, TransportSpec
from fedhop.common.testhooks import gate, released
from fedhop.common.wire.budget import InflightBudget
from fedhop.common.wire.bundle import Bundle, payload_bytes
from fedhop.common.wire.codec import CodecError
from fedhop.common.wire.control import (
    REPORT,
    ReportCursor,
    bye_frame,
    meter_rows_from_pb,
    missing_from_pb,
    report_frame,
)
from fedhop.common.wire.framing import BadFrame, ChunkFrame, frame_size
from fedhop.common.wire.messages import (
    CALL_ID_BASE,
    PROTOCOL_VERSION,
    FrameError,
    Message,
    MessageAssembler,
    error_frame,
    error_result_frame,
    message_frames,
    on_host,
    result_frame,
    task_frame,
)
from fedhop.common.wire.meter import ByteMeter
from fedhop.common.wire.scalars import get_scalars, put_scalars
from fedhop.transport.inbound import Rejection, accept_request, accept_result
from fedhop.transport.reply_gate import ReplyGate
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.session")

ROLES = {"client": pb.ROLE_CLIENT, "edge": pb.ROLE_EDGE, "server": pb.ROLE_SERVER}
ROLE_NAMES = {v: k for k, v in ROLES.items()}
CLOSE = object()  # end of an outbound frame queue
Frame = pb.Frame | ChunkFrame | BadFrame
_HOST = torch.device("cpu")
REJOIN_READY_WAIT_S = 5.0
EXPIRED_KEPT = 4096  # calls given up on whose late replies are still counted (older ones: refused)


@dataclass
class Call:
    """One Task sent to one child, waiting for its Result."""

    call_id: int
    node: NodeId
    task: str
    round: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Reply | Failure | None = None
    answered: threading.Event = field(default_factory=threading.Event)  # its Result frame arrived
    gate: ReplyGate | None = None  # a folding scatter's admission of replies (reply_gate.py)
    on_finish: Callable[[], None] | None = None  # called once the result is in (a caller waiting on several)

    def finish(self, result: Reply | Failure) -> None:
        if self.result is None:
            self.result = result
            self.done.set()
            if self.on_finish is not None:
                self.on_finish()


class ChildLink:
    """One child's session, seen from the parent: an outbound frame queue and what the child said."""

    def __init__(self, peer: str, max_bytes: int | None = None, identity: str | None = None,
                 unauthenticated: str = "") -> None:
        self.peer = peer  # the transport address, for log lines
        self.identity = identity  # the node id the peer's certificate or token proves (None: not verified)
        self.unauthenticated = unauthenticated  # why the peer could not be identified ("" where it was)
        self.node_id: NodeId | None = None
        self.role = ""
        self.address = ""  # an edge's Edge service
        self.alive = True
        self.superseded = False  # the node re-joined on another session
        self.ready = threading.Event()
        self.data_sizes: dict[NodeId, int] = {}
        self.bye = threading.Event()
        self.asm = MessageAssembler(max_bytes=max_bytes)  # replaced by the hub's, with its caps, at Hello
        self.hello_seen = threading.Event()  # the first frame arrived (the handshake timer stops)
        self.cancel: Callable[[], Any] | None = None  # ends the transport's stream (the servicer's)
        self._q: queue.Queue = queue.Queue()
        self.last_sent = time.monotonic()
        self.missed = 0  # consecutive rounds whose tasks this child left without any reply
        self.missed_round: int | None = None  # the last round counted in ``missed``
        self.heard_round = -1  # the latest round of a call this child replied to in full (late replies included)
        self.dropped = ""  # why the parent closed this session for silence ("" while it did not)

    @property
    def name(self) -> str:
        return self.node_id or f"unidentified peer {self.peer}"

    def send(self, frames: Iterable[pb.Frame | bytes], on_sent: Callable[[int], None] | None = None) -> None:
        self._q.put((frames, on_sent))

    def idle(self) -> bool:
        return self._q.empty()

    def close(self) -> None:
        self._q.put(CLOSE)

    def discard(self) -> None:
        """Forget the frames not sent yet (a dropped session's tasks: their bundles are freed)."""
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                return

    def heard(self, round_idx: int) -> None:
        """A whole reply to one of this child's calls (of round ``round_idx``) came in: it is not silent."""
        self.missed, self.missed_round = 0, None
        self.heard_round = max(self.heard_round, round_idx)

    def outgoing(self) -> Iterator[pb.Frame | bytes]:
        """The response stream: frames in queue order; a message's frames are never interleaved."""
        while True:
            item = self._q.get()
            if item is CLOSE:
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
            self.last_sent = time.monotonic()
            if on_sent is not None:
                on_sent(n)


class ParentHub:
    """The parent side of the session protocol for one node (the PS or an edge): its children's sessions,
    their calls, admission, keep-alives and reports."""

    def __init__(self, node_id: NodeId, meter: ByteMeter, missing: MissingLog | None = None,
                 security: Any = None) -> None:
        self.node = node_id
        timing.set_node(node_id)
        self.security = security  # transport.credentials.Security; None or insecure: Hellos are taken at their word
        self.meter = meter
        self.missing = missing if missing is not None else MissingLog()
        self.configured = threading.Event()
        self.topology: Topology | None = None
        self.spec: RunSpec | None = None
        self.spec_json = ""
        self.run_id = ""
        self.chunk_bytes = 1 << 20
        self.max_bytes: int | None = None
        self.links: dict[NodeId, ChildLink] = {}
        self.started = False  # the run started: later Hellos are late joiners
        self.admitted: set[NodeId] = set()
        self.sizes_at_ready: dict[NodeId, dict[NodeId, int]] = {}  # each child's data sizes at its latest Ready
        self.peers: dict[NodeId, str] = {}  # edge addresses sent with the start
        self.on_update: Callable[[], None] | None = None  # a late child became ready (an edge tells its parent)
        self.on_ready: Callable[[NodeId, dict[NodeId, int]], None] | None = None  # e.g. a progress bar's
        self.on_join: Callable[[NodeId, str], None] | None = None  # (node, role): for the run's events
        self.on_lost: Callable[[NodeId, str], None] | None = None  # (node, why)
        self.welcome_info: dict[str, Scalar] = {}  # sent in every Welcome (a resumed PS: resume_round)
        self.hello_info: dict[NodeId, dict[str, Any]] = {}  # what each child said in its last Hello
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._calls: dict[int, Call] = {}
        self._expired: OrderedDict[int, Call] = OrderedDict()  # calls given up on, for their late replies
        self.handshake_timeout_s = TransportSpec().handshake_timeout_s  # the spec's once configured
        self.max_open_bundles: int | None = None
        self.max_inflight_bytes: int | None = None
        self.drop_after_missed = TransportSpec().drop_after_missed
        self._ids = itertools.count(CALL_ID_BASE)
        self._stop = threading.Event()

    # -- set-up -------------------------------------------------------------------------------------------
    def configure(self, spec: RunSpec, topology: Topology, run_id: str) -> None:
        """Children may dial before this node knows the run (an edge before its Welcome); they wait."""
        self.topology = topology
        self.spec = spec
        self.spec_json = spec.model_dump_json()
        self.run_id = run_id
        self.chunk_bytes = spec.transport.chunk_bytes
        self.max_bytes = spec.transport.max_bundle_bytes
        self.handshake_timeout_s = spec.transport.handshake_timeout_s
        self.max_open_bundles = spec.transport.max_open_bundles
        self.max_inflight_bytes = spec.transport.inflight_bytes()
        self.drop_after_missed = spec.transport.drop_after_missed
        self.configured.set()
        threading.Thread(target=self._keepalive, args=(spec.transport.keepalive_s,), daemon=True,
                         name=f"{self.node}-keepalive").start()

    def _keepalive(self, every_s: float) -> None:
        """An empty frame to every child whose stream was quiet for ``every_s``: a child that hears nothing
        for transport.keepalive_timeout_s takes its parent for stalled or gone and re-joins."""
        while not self._stop.wait(every_s / 2):
            now = time.monotonic()
            for link in self._alive():
                if link.idle() and now - link.last_sent >= every_s:
                    link.last_sent = now
                    link.send([pb.Frame()])

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
                if not absent or left <= 0 or (give_up is not None and give_up()) or released(f"join-{self.node}"):
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

    def admit(self) -> dict[NodeId, int]:
        """A round boundary: every ready child may get calls from now on; returns the admitted children's
        data sizes (clients' sizes, as :meth:`data_sizes`), a consistent snapshot with the admission."""
        out: dict[NodeId, int] = {}
        with self._lock:
            for n, link in self.links.items():
                if link.ready.is_set() and link.alive and n not in self.admitted:
                    if self.started:
                        log.info("%s: %s admitted (joined late)", self.node, n)
                    self.admitted.add(n)
                if n in self.admitted and link.ready.is_set():
                    out.update(link.data_sizes)
                elif n in self.admitted and n in self.sizes_at_ready:
                    # re-joining (Hello seen, Ready not yet): its sizes stay what it reported last, so that a
                    # round begun meanwhile does not see its subtree as empty and reject its reply
                    out.update(self.sizes_at_ready[n])
        return out

    def start(self, peers: Mapping[NodeId, str] | None = None) -> dict[NodeId, int]:
        """The run starts: admit the ready children and tell them (edges: with the edges' addresses)."""
        self.peers = dict(peers or {})
        sizes = self.admit()
        self.started = True
        for link in self._alive():
            if link.ready.is_set():
                link.send([self._start_frame()])
        return sizes

    def _start_frame(self) -> pb.Frame:
        f = pb.Frame()
        f.ready.SetInParent()
        for k, v in self.peers.items():
            f.ready.peers[k] = v
        return f

    def edge_addresses(self) -> dict[NodeId, str]:
        with self._lock:
            return {n: link.address for n, link in self.links.items() if link.role == "edge" and link.address}

    def _alive(self) -> list[ChildLink]:
        with self._lock:
            return [link for link in self.links.values() if link.alive]

    def shutdown(self, timeout_s: float, *, finished: bool, reason: str = "run finished") -> None:
        """Bye (saying whether the run ``finished``) to every child; wait for their Bye, whose meter rows and
        missing entries are merged into this node's meter and missing log; then close the streams."""
        links = self._alive()
        for link in links:
            link.send([bye_frame(reason, finished=finished)])
        end = time.monotonic() + timeout_s
        for link in links:
            if not link.bye.wait(max(0.0, end - time.monotonic())):
                log.warning("%s: no Bye from %s within %.0fs; its unreported byte counts are lost", self.node,
                            link.name, timeout_s)
        for link in links:
            link.close()
        self._stop.set()

    # -- one session's frames -----------------------------------------------------------------------------
    @property
    def secure(self) -> bool:
        return self.security is not None and self.security.mode != "insecure"

    def open(self, peer: str, identity: str | None = None, unauthenticated: str = "",
             cancel: Callable[[], Any] | None = None) -> ChildLink:
        """A new session from ``peer``; ``identity``: the node id its certificate or token proves (the
        servicer's :func:`~fedhop.transport.credentials.peer_identity`), or why it could not be proved;
        ``cancel``: ends the transport's stream.

        A session holds a server thread while it lasts, so a peer holds none for long before it is known: with
        TLS or tokens, one that is not authenticated is refused at once (the reason is logged, not echoed);
        any peer that has not said Hello within ``transport.handshake_timeout_s`` is disconnected."""
        link = ChildLink(peer, self.max_bytes, identity, unauthenticated)
        link.cancel = cancel
        if self.secure and identity is None:
            log.warning("%s: rejected %s: unauthenticated peer: %s", self.node, peer, unauthenticated)
            self._end(link, pb.ERROR_CODE_BAD_REQUEST, "unauthenticated peer")
            return link
        timer = threading.Timer(self.handshake_timeout_s, self._hello_overdue, (link,))
        timer.daemon = True
        timer.start()
        return link

    def _hello_overdue(self, link: ChildLink) -> None:
        if link.hello_seen.is_set() or not link.alive:
            return
        log.warning("%s: disconnected %s: no Hello within transport.handshake_timeout_s = %gs", self.node, link.peer,
                    self.handshake_timeout_s)
        self._end(link, pb.ERROR_CODE_BAD_REQUEST, f"no Hello within {self.handshake_timeout_s:g}s")

    def _end(self, link: ChildLink, code: int, message: str) -> None:
        """End a session that was never accepted, or one dropped: one Error frame, then the stream ends."""
        link.send([error_frame(0, code, message)])
        link.alive = False
        link.close()
        link.asm.close()
        if link.cancel is not None:  # a peer that reads nothing must not hold the stream either
            t = threading.Timer(1.0, link.cancel)
            t.daemon = True
            t.start()

    def _assembler(self, link: ChildLink) -> MessageAssembler:
        """A child's frames become messages only for calls sent to it and pending, within its caps."""
        return MessageAssembler(self.max_bytes, budget=InflightBudget(self.max_open_bundles, self.max_inflight_bytes),
                                accept=lambda head: self._unexpected_reply(link, head))

    def _unexpected_reply(self, link: ChildLink, head: pb.Frame) -> str | None:
        """Why a Task/Result frame from ``link`` opens no message (None: it is a reply to a call of ours)."""
        if head.WhichOneof("body") != "result":
            return f"{link.name} sent a {head.WhichOneof('body')} frame; a child only answers calls"
        with self._lock:
            info = self._calls.get(head.call_id) or self._expired.get(head.call_id)
        if info is None or info.node != link.node_id:
            return f"{link.name} answered call {head.call_id}, which is not pending for it"
        return None

    def on_frame(self, link: ChildLink, frame: Frame) -> bool:
        """Handle one frame from a child; False ends the session (a refused Hello)."""
        if link.node_id is None:
            if not link.alive:
                return False
            link.hello_seen.set()
            return self._hello(link, frame)
        if isinstance(frame, pb.Frame):
            body = frame.WhichOneof("body")
            if body is None:
                return True  # keep-alive
            if body == "hello":
                self._complain(link, 0, pb.ERROR_CODE_BAD_REQUEST,
                               f"duplicate Hello from {link.name} on an open session; ignored")
                return True
            if body == "ready":
                self._ready(link, frame.ready)
                return True
            if body == "report":
                self._report(link, frame)
                return True
            if body == "bye":
                self.meter.merge(meter_rows_from_pb(frame.bye.meter))
                self.missing.entries.extend(missing_from_pb(frame.bye.missing))
                link.bye.set()
                return True
            if body == "error" and frame.call_id == 0:
                log.warning("%s: %s reports: %s", self.node, link.name, frame.error.message)
                return True
            if body == "result":
                self._answered(link, frame)
        try:
            msg = link.asm.feed(frame)
        except FrameError as e:
            self._complain(link, e.call_id, pb.ERROR_CODE_BAD_REQUEST, f"{link.name}: {e}")
            return True
        if msg is not None:
            self._result(link, msg)
        return True

    def _answered(self, link: ChildLink, frame: pb.Frame) -> None:
        """A Result frame of a pending call came in: mark the call answered; a reply of a folding scatter then
        waits for its turn (``ReplyGate``) before its bundle is read, holding this session's reader."""
        with self._lock:
            call = self._calls.get(frame.call_id)
        if call is None or call.node != link.node_id:
            return
        call.answered.set()
        if call.gate is not None and frame.result.has_bundle:
            call.gate.enter(call.call_id)

    def _complain(self, link: ChildLink, call_id: int, code: int, message: str) -> None:
        log.warning("%s: %s", self.node, message)
        link.send([error_frame(call_id, code, message)])

    def _hello(self, link: ChildLink, frame: Frame) -> bool:
        """Check the first frame of a session; answer Welcome, or Error and close."""
        def reject(code: int, message: str, detail: str = "") -> bool:
            log.warning("%s: rejected %s: %s%s", self.node, link.peer, message, detail)
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
        assert self.topology is not None and self.spec is not None
        node = hello.node_id
        if self.secure:
            if link.identity is None:
                return reject(pb.ERROR_CODE_BAD_REQUEST, "unauthenticated peer", f": {link.unauthenticated}")
            if link.identity != node:
                return reject(pb.ERROR_CODE_BAD_REQUEST, f"the peer's certificate or token is {link.identity}'s, "
                              f"but it said Hello as {node!r}")
        if node not in self.children:  # the refusal does not list the topology's node ids (the log line does)
            return reject(pb.ERROR_CODE_BAD_REQUEST, f"{node!r} is not a child of {self.node} in this run",
                          f" (its children: {list(self.children)})")
        role = self.topology.role(node)
        if ROLE_NAMES.get(hello.role, "") != role:
            return reject(pb.ERROR_CODE_BAD_REQUEST,
                          f"{node} is a {role} in this run, but said Hello as {ROLE_NAMES.get(hello.role, '?')}")
        if hello.run_id and hello.run_id != self.run_id:
            return reject(pb.ERROR_CODE_RUN_MISMATCH,
                          f"{node} re-joins run {hello.run_id!r}, but {self.node} now runs {self.run_id!r}")
        with self._changed:
            old = self.links.get(node)
            if old is not None and old.alive and not hello.run_id:
                return reject(pb.ERROR_CODE_BAD_REQUEST, f"duplicate Hello: {node} is already connected",
                              f" (from {old.peer})")
            if self.started and node not in self.admitted and not hello.run_id \
                    and self.spec.transport.late_join == "refuse":
                return reject(pb.ERROR_CODE_LATE_JOIN_REFUSED,
                              f"{node} joined run {self.run_id!r} after it started, and transport.late_join "
                              f"is 'refuse'")
            if old is not None and old is not link:
                old.superseded = True  # its stream ends when the child closes it; its calls stay pending
            link.node_id, link.role, link.address = node, role, hello.address
            link.asm = self._assembler(link)
            self.links[node] = link
            self._changed.notify_all()
        w = pb.Frame()
        w.welcome.node_id = node
        w.welcome.role = ROLES[role]
        w.welcome.parent_id = self.node
        w.welcome.run_id = self.run_id
        w.welcome.spec = self.spec_json
        w.welcome.spec_format = "json"
        put_scalars(w.welcome.info, self.welcome_info)
        self.hello_info[node] = get_scalars(hello.info)
        link.send([w])
        how = "re-joined" if hello.run_id else ("joined late" if self.started else "joined")
        log.info("%s: %s %s from %s", self.node, node, how, link.peer)
        if self.on_join is not None:
            self.on_join(node, role)
        return True

    def _ready(self, link: ChildLink, ready: pb.Ready) -> None:
        with self._changed:
            update = link.ready.is_set()
            link.data_sizes = {k: int(v) for k, v in ready.data_sizes.items()}
            if link.node_id is not None:
                self.sizes_at_ready[link.node_id] = dict(link.data_sizes)
            link.ready.set()
            self._changed.notify_all()
        log.info("%s: %s is ready%s (%d clients, %d samples)", self.node, link.name, " (update)" if update else "",
                 len(link.data_sizes), sum(link.data_sizes.values()))
        if self.on_ready is not None and link.node_id is not None:
            self.on_ready(link.node_id, dict(link.data_sizes))
        if not self.started:
            return
        if not update:
            if link.role == "edge" and link.address and link.node_id not in self.peers:
                self.peers[link.node_id or ""] = link.address  # a late edge: every edge learns its address
                for other in self._alive():
                    if other is not link and other.role == "edge" and other.ready.is_set():
                        other.send([self._start_frame()])
            link.send([self._start_frame()])
        if self.on_update is not None:
            self.on_update()

    def _report(self, link: ChildLink, frame: pb.Frame) -> None:
        rows = meter_rows_from_pb(frame.report.meter)
        self.meter.merge(rows)
        self.missing.entries.extend(missing_from_pb(frame.report.missing))
        self.meter.record(link.name, self.node, REPORT, "request", 0, frame.ByteSize(), int(frame.report.round))

    def lost(self, link: ChildLink, why: str) -> None:
        """The session ended (stream closed or broken): its pending calls fail, unless the node re-joined."""
        link.alive = False
        link.close()
        link.asm.close()
        if link.node_id is None:
            return
        with self._changed:
            current = self.links.get(link.node_id) is link
            pending = [c for c in self._calls.values() if c.node == link.node_id] if current else []
            for c in pending:
                del self._calls[c.call_id]
            self._changed.notify_all()
        for c in pending:
            c.finish(Failure(f"connection to {link.node_id} lost: {why}"))
        if current and not link.bye.is_set() and not link.dropped:
            log.warning("%s: lost %s: %s", self.node, link.node_id, why)
            if self.on_lost is not None:
                self.on_lost(link.node_id, why)

    def missed(self, node: NodeId, round_idx: int, why: str) -> bool:
        """A task of round ``round_idx`` to ``node`` got no reply at all (``why``); True when this drops it.

        A child that sent no Result (not a late one, not an error) for the tasks of
        ``transport.drop_after_missed`` consecutive rounds it was given tasks in is dropped (:meth:`drop`). A
        round counts once however many tasks it had; any Result of the child's calls resets the count."""
        n = self.drop_after_missed
        if n == 0:
            return False
        with self._lock:
            link = self.links.get(node)
            if link is None or not link.alive or link.heard_round >= round_idx or link.missed_round == round_idx:
                return False
            link.missed += 1
            link.missed_round = round_idx
            if link.missed < n:
                return False
        self.drop(link, f"no reply in {n} consecutive rounds (transport.drop_after_missed = {n})", f"; the last: {why}")
        return True

    def drop(self, link: ChildLink, why: str, detail: str = "") -> None:
        """Close a child's session for silence: its pending calls fail, the frames queued for it and the bundles
        it was sending are freed, its stream is cancelled (a stopped peer reads nothing, so the transport's
        thread would wait on it). The node stays admitted: it re-joins (Hello with the run id) as after any
        lost stream, and takes part again from its Ready on."""
        node = link.node_id
        with self._changed:
            if not link.alive or node is None or self.links.get(node) is not link:
                return
            link.alive = False
            link.dropped = why
            pending = [c for c in self._calls.values() if c.node == node]
            for c in pending:  # kept as given up on: the replies of a child that comes back are counted, dropped
                del self._calls[c.call_id]
                self._expired[c.call_id] = c
            while len(self._expired) > EXPIRED_KEPT:
                self._expired.popitem(last=False)
            self._changed.notify_all()
        log.warning("%s: dropped %s (%s): %s%s; its session is closed, it may re-join", self.node, node, link.peer, why,
                    detail)
        for c in pending:
            c.finish(Failure(f"{node} was dropped: {why}"))
        link.discard()
        self._end(link, pb.ERROR_CODE_DEADLINE_EXCEEDED, f"{self.node} closed this session: {why}")
        if self.on_lost is not None:
            self.on_lost(node, f"dropped: {why}")

    # -- calls --------------------------------------------------------------------------------------------
    def call(self, target: NodeId, task: str, bundle: Bundle, args: Mapping[str, Scalar], round_idx: int,
             deadline_s: float, gate: ReplyGate | None = None) -> Call | Failure:
        """Push one Task (and its bundle) to a child; the Result completes the returned :class:`Call`. With
        ``gate``, the reply's bundle is read only when the gate admits it."""
        link, admitted = self.await_link(target)
        if link is not None and link.dropped and not link.alive:
            return Failure(f"{target} is not connected (dropped: {link.dropped})")
        if link is None or not link.alive:
            return Failure(f"{target} is not connected")
        # a node that just re-joined says Ready right after its Welcome: worth a short wait, not a lost round
        if not link.ready.is_set() and not (admitted and link.ready.wait(min(deadline_s, REJOIN_READY_WAIT_S))):
            return Failure(f"{target} is (re-)joining and not ready yet")
        if not admitted:
            return Failure(f"{target} joined late and is admitted at the next round")
        cid = next(self._ids)
        head = task_frame(cid, task, args, deadline_s=deadline_s, has_bundle=bool(bundle), round_idx=round_idx)
        try:
            frames = message_frames(head, bundle, self.chunk_bytes)
        except CodecError as e:
            return Failure(f"cannot send the bundle: {e}")
        call = Call(cid, target, task, round_idx, gate=gate)
        timing.event("call", at=self.node, call=cid, child=target, task=task, round=round_idx)
        if gate is not None:
            gate.add(cid)
        with self._lock:
            self._calls[cid] = call
        payload = payload_bytes(bundle)

        def sent(n: int) -> None:
            self.meter.record(self.node, target, meter_kind(task, "request"), "request", payload, n, round_idx)

        link.send(frames, sent)
        return call

    def await_link(self, target: NodeId) -> tuple[ChildLink | None, bool]:
        """The target's session; a child that was admitted once and is away (restarting, re-joining) is
        given transport.rejoin_grace_s to come back and say Ready before the call fails."""
        grace = self.spec.transport.rejoin_grace_s if self.spec is not None else 0.0
        end = time.monotonic() + grace
        with self._changed:
            while True:
                link = self.links.get(target)
                admitted = target in self.admitted
                usable = link is not None and link.alive and link.ready.is_set()
                left = end - time.monotonic()
                if usable or not admitted or left <= 0:
                    return link, admitted
                self._changed.wait(min(left, 1.0))

    def expire(self, call: Call, why: str) -> None:
        """The caller stopped waiting: a reply that still comes is counted and dropped."""
        with self._lock:
            if self._calls.pop(call.call_id, None) is not None:
                self._expired[call.call_id] = call
                while len(self._expired) > EXPIRED_KEPT:
                    self._expired.popitem(last=False)
        call.finish(Failure(why, silent=True))

    def _result(self, link: ChildLink, msg: Message) -> None:
        with self._lock:
            info = self._calls.get(msg.call_id) or self._expired.get(msg.call_id)
            if info is not None and info.node == link.node_id:
                call = self._calls.pop(msg.call_id, None)
                late = self._expired.pop(msg.call_id, None) if call is None else None
                link.heard(info.round)  # a whole reply, on time or late, good or an error: the child is not silent
            else:
                info = call = late = None
        if info is None:
            self._complain(link, msg.call_id, pb.ERROR_CODE_BAD_REQUEST,
                           f"{link.name} answered call {msg.call_id}, which is not pending for it")
            return
        self.meter.record(info.node, self.node, meter_kind(info.task, "reply"), "reply", msg.payload_bytes,
                          msg.message_bytes, info.round)
        timing.event("reply", at=self.node, call=msg.call_id, child=info.node)
        if late is not None:
            log.info("%s: late reply from %s to %s (round %d) dropped", self.node, info.node, info.task,
                     info.round + 1)
            return
        assert call is not None
        call.finish(accept_result(msg, link.name, _HOST))  # NetComm moves replies to its node's device


# -- the child side ------------------------------------------------------------------------------------------


class ChildProtocol:
    """What a child does with its parent's frames: tasks run one at a time, in arrival order, in a worker
    thread (handlers share the node's state and model template, and a task that arrives while a stale one
    runs must wait for it, not race it); each answered task is followed by a Report of what the node's byte
    meter and missing log gained (``report``), and Bye is answered with the rest."""

    def __init__(self, node: NodeId, ctx: NodeContext, send: Callable[[Iterable[pb.Frame | bytes]], None], *,
                 chunk_bytes: int, report: Callable[[], tuple[list[dict], list[dict]]] | None = None,
                 before_task: Callable[[int | None, float], None] | None = None,
                 after_task: Callable[[NodeContext], None] | None = None,
                 peers: dict[NodeId, str] | None = None, task_lock: Any = None) -> None:
        self.node = node
        timing.set_node(node)
        self.ctx = ctx
        self.send = send
        self.chunk_bytes = chunk_bytes
        self.report = report
        self.before_task = before_task
        self.after_task = after_task
        self.peers = peers if peers is not None else {}  # edge id -> Edge address, from the parent's Ready
        self.task_lock = task_lock if task_lock is not None else contextlib.nullcontext()  # held while a handler runs
        self.started = threading.Event()
        self.cursor = ReportCursor()
        self._report_lock = threading.Lock()
        self._tasks: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None

    def on_frame(self, frame: Frame, asm: MessageAssembler) -> pb.Bye | None:
        """Handle one frame of the parent's stream; returns the parent's Bye when it comes."""
        if isinstance(frame, pb.Frame):
            body = frame.WhichOneof("body")
            if body is None:
                return None
            if body == "ready":
                self.peers.update(frame.ready.peers)
                self.started.set()
                return None
            if body == "bye":
                return frame.bye
            if body == "error":
                log.warning("%s: parent reports (call %d): %s", self.node, frame.call_id, frame.error.message)
                return None
            if body in ("hello", "welcome", "report"):
                self._complain(0, f"unexpected {body} frame from the parent; ignored")
                return None
        try:
            msg = asm.feed(frame)
        except FrameError as e:
            self._complain(e.call_id, str(e))
            return None
        if msg is not None:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, daemon=True, name=f"{self.node}-tasks")
                self._worker.start()
            timing.event("task_in", at=self.node, call=msg.call_id)
            self._tasks.put((msg, time.monotonic()))
        return None

    def _complain(self, call_id: int, message: str) -> None:
        log.warning("%s: %s", self.node, message)
        self.send([error_frame(call_id, pb.ERROR_CODE_BAD_REQUEST, f"{self.node}: {message}")])

    def _fail(self, call_id: int, code: int, message: str) -> None:
        log.warning("%s: call %d failed: %s", self.node, call_id, message)
        self.send([error_result_frame(call_id, code, message)])

    def _work(self) -> None:
        while (item := self._tasks.get()) is not CLOSE:
            msg, received = item
            self._run_task(msg, received)

    def _run_task(self, msg: Message, received: float) -> int:
        ctx = self.ctx
        req = accept_request(msg, self.node, "its parent", ctx.device)
        if isinstance(req, Rejection):
            self._fail(msg.call_id, req.code, req.message)
            return ctx.round
        try:
            handler = get_task(req.name)
        except KeyError:
            self._fail(req.call_id, pb.ERROR_CODE_UNKNOWN_TASK, f"{self.node}: unknown task {req.name!r}")
            return ctx.round
        if req.round is not None:
            ctx.round = req.round
        gate(f"{self.node}-{ctx.round}")  # test hook: hold this node mid-round (common/testhooks.py)
        if self.before_task is not None:
            self.before_task(req.round, req.deadline_s - (time.monotonic() - received) if req.deadline_s else 0.0)
        try:
            timing.event("run", at=self.node, call=req.call_id, task=req.name)
            with self.task_lock:
                reply = handler(ctx, req.bundle, dict(req.args))
            timing.event("ran", at=self.node, call=req.call_id)
            out = on_host(reply.bundle)
            frames = message_frames(result_frame(req.call_id, reply.scalars, has_bundle=bool(out)), out,
                                    self.chunk_bytes)
        except NoAnswer:  # this node chose not to answer (e.g. not available this round): no Result at all
            if self.after_task is not None:
                self.after_task(ctx)
            self.send_report(ctx.round)
            return ctx.round
        except Exception as e:  # the handler failed: the parent sees this node as missing for this call
            log.exception("%s: task %s failed", self.node, req.name)
            self.send_report(ctx.round)
            self._fail(req.call_id, pb.ERROR_CODE_INTERNAL, f"{self.node}: {req.name} raised {type(e).__name__}: {e}")
            return ctx.round
        if self.after_task is not None:  # the node's state after this task, saved before anyone hears of it
            self.after_task(ctx)
        # the Report goes before the Result on the same stream: once the parent holds a round's results, it
        # holds their byte rows too, so its checkpoint of that round is complete
        self.send_report(ctx.round)
        self.send(frames)
        return ctx.round

    def _unreported(self) -> tuple[list[dict], list[dict]]:
        if self.report is None:
            return [], []
        try:
            rows, missing = self.report()
        except Exception:
            log.exception("%s: collecting the byte meter failed", self.node)
            return [], []
        return self.cursor.delta(rows, missing)

    def send_report(self, round_idx: int) -> None:
        """Report what the meter and missing log gained since the last report (nothing when nothing did)."""
        with self._report_lock:
            rows, missing = self._unreported()
            if rows or missing:
                self.send([report_frame(rows, missing, round_idx)])

    def stop(self) -> None:
        """Let the task in progress finish (it may still answer), then stop the worker."""
        if self._worker is not None:
            self._tasks.put(CLOSE)
            self._worker.join(timeout=5)

    def bye(self) -> pb.Frame:
        """This child's Bye: what it has not reported yet."""
        with self._report_lock:
            rows, missing = self._unreported()
            return bye_frame("bye", finished=True, rows=rows, missing=missing)


def child_assembler(transport: TransportSpec) -> MessageAssembler:
    """A child's assembler of its parent's stream: Task messages only, within ``transport``'s caps."""
    def tasks_only(head: pb.Frame) -> str | None:
        body = head.WhichOneof("body")
        return None if body == "task" else f"the parent sent a {body} frame; a parent only sends Tasks"

    return MessageAssembler(transport.max_bundle_bytes, accept=tasks_only,
                            budget=InflightBudget(transport.max_open_bundles, transport.inflight_bytes()))


def hello_frame(node: NodeId, role: str, address: str, info: Mapping[str, Any], run_id: str) -> pb.Frame:
    """The Hello frame a child opens its session with (``run_id`` set when re-joining)."""
    hello = pb.Frame()
    hello.hello.protocol = PROTOCOL_VERSION
    hello.hello.node_id = node
    hello.hello.role = ROLES[role]
    hello.hello.address = address
    hello.hello.run_id = run_id
    put_scalars(hello.hello.info, info)
    return hello
