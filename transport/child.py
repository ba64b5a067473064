"""The gRPC half of the child side of ``Parent.Session`` (docs/design.md section 6), used by clients and edges.

The child dials its parent (outbound only, NAT-friendly), says Hello, receives Welcome with the RunSpec,
reports Ready with its data sizes, and then serves what its parent pushes (the protocol:
:class:`~fedhop.transport.session.ChildProtocol`). This module owns the streams:

* joining: "nothing listens" at the parent's address is retried with backoff (logged) for
  ``connect_timeout_s``; something that listens but does not complete a gRPC handshake, or answers without
  the fedhop Parent service, fails within seconds (:data:`~fedhop.common.exit_codes.ExitCode.NOT_FEDHOP`);
* staying: a parent whose stream breaks, or that sends nothing (not even its keep-alive) for
  ``transport.keepalive_timeout_s``, is dialed again with backoff for ``transport.reconnect_s``; the child
  re-joins the same run (Hello with its run_id) and moves what it had not sent yet to the new stream. The
  old stream stays open until the new one works, so a parent that was only stalled still gets what the
  child sent before; a parent that still holds the old session refuses the new one, and the child stays on
  the old stream (or, where that one ended, retries until the parent notices).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import grpc

from fedhop.common.engine.api import NodeContext, NodeId, Post, Reply, Scalar
from fedhop.common.engine.base import PARENT, POST_SLOT, BaseComm, Failure, MissingLog, post_entry, post_of, post_seq
from fedhop.common.engine.node_store import NEWEST, NodeStore, Restored
from fedhop.common.engine.workspace import Workspace
from fedhop.common.exit_codes import ExitCode
from fedhop.common.spec import RunSpec, TransportSpec
from fedhop.common.testhooks import mark
from fedhop.common.topology import Topology
from fedhop.common.user_code import UserCodeError, check_parent_code
from fedhop.common.wire.bundle import Bundle
from fedhop.common.wire.codec import CodecError
from fedhop.common.wire.framing import parse_frame_lenient, serialize_frame, unbatched
from fedhop.common.wire.messages import (
    POST_ID_BASE,
    BundleMessage,
    MessageAssembler,
    message_frames,
    on_host,
    post_frame,
)
from fedhop.common.wire.meter import ByteMeter
from fedhop.common.wire.scalars import get_scalars
from fedhop.transport.channels import HANDSHAKE_TIMEOUT_S, listening, make_channel
from fedhop.transport.credentials import Security
from fedhop.transport.lane import Lane, LaneOffer, dial_lane
from fedhop.transport.node_config import NodeConfig
from fedhop.transport.peer import PeerClient
from fedhop.transport.session import CLOSE, ChildProtocol, TaskHooks, child_assembler, hello_frame
from fedhop.transport.workers import DaemonPool
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.child")

_FRAME, _END = "frame", "end"
_HEARD, _SKIP, _REJOIN, _BYE = object(), object(), object(), object()  # what serve() does after an event
BYE_WAIT_S = 10.0  # how long a node that answered Bye waits for the parent to close the stream
_REFUSALS = {pb.ERROR_CODE_LATE_JOIN_REFUSED: ExitCode.LATE_JOIN_REFUSED,
             pb.ERROR_CODE_RUN_MISMATCH: ExitCode.RUN_MISMATCH}


class JoinError(RuntimeError):
    """The parent refused this node, could not be reached, or is not a fedhop parent; ``code`` is the exit
    code the node's process ends with."""

    def __init__(self, message: str, code: ExitCode = ExitCode.JOIN_FAILED) -> None:
        super().__init__(message)
        self.code = code


# the codes of a Session call that gRPC's core gives when the connection breaks before the parent's first answer
_BROKEN_BEFORE_ANSWER = (grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED)


class _Retry(Exception):
    """This attempt failed in a way worth retrying (nobody answers yet)."""


class _StillConnected(Exception):
    """The parent refused a re-join: it still holds this node's session (``ERROR_CODE_ALREADY_CONNECTED``)."""


PostUp = Callable[[str, Bundle, dict[str, Scalar], int], None]  # (task, bundle, args, round): a Post to the parent


class LeafComm(BaseComm):
    """A client's Comm: it has no children to scatter to. On a run with client peer links
    (``topology.peer_graph``) it hands models to its peers, posts to them and describes them, through
    ``peer_client`` (a :class:`~fedhop.transport.peer.PeerClient` over the peers' addresses the parent sent at
    the start); without peers these are errors. ``up``: posts to its parent (:meth:`ChildSession.post_up`)."""

    def __init__(self, node: NodeId, topology: Topology, missing: MissingLog,
                 peer_client: PeerClient | None = None, up: PostUp | None = None) -> None:
        super().__init__(node, topology, missing)
        self.peer_client = peer_client
        self.up = up

    def _post(self, route: str, to: NodeId, task: str, bundle: Bundle, args: dict[str, Scalar], rnd: int) -> None:
        post_out(self, self.up, self.peer_client, route, to, task, bundle, args, rnd)

    def current_round(self) -> int:
        return self.ctx.round if self.ctx is not None else -1

    def _exchange(self, targets: list[NodeId], task: str, bundle: Bundle, args: dict[str, Scalar],
                  deadline_s: float | None, quorum: int | None = None) -> dict[NodeId, Reply | Failure]:
        raise RuntimeError(f"{self.node} is a client; it has nobody to scatter to")

    def _peers(self) -> PeerClient:
        if self.peer_client is None:
            raise RuntimeError(f"{self.node} is a client of a run without client peer links "
                               "(topology.peer_graph = 'none'): it hands off to nobody")
        return self.peer_client

    def hand_off(self, to: NodeId, slot: str, bundle: Bundle, scalars: Mapping[str, Scalar] | None = None) -> None:
        peers = self._peers()
        self._check_peer(to)
        began = time.perf_counter()
        try:
            peers.hand_off(to, slot, bundle, dict(scalars or {}), self.current_round())
        finally:
            self.clock().add(self.current_round(), self.node, "transfer", time.perf_counter() - began, peer=to)

    def describe(self, peers: list[NodeId]) -> dict[NodeId, dict[str, Scalar]]:
        client = self._peers()
        out: dict[NodeId, dict[str, Scalar]] = {}
        for p in self.topology.sort(peers):
            self._check_peer(p)
            facts = client.describe(p, self.current_round())
            if facts is not None:
                out[p] = facts
        return out

    def close(self) -> None:
        if self.peer_client is not None:
            self.peer_client.close()


def post_out(comm: BaseComm, up: PostUp | None, peers: PeerClient | None, route: str, to: NodeId, task: str,
             bundle: Bundle, args: dict[str, Scalar], rnd: int) -> None:
    """A networked node's post: up its session stream to its parent, or to a neighbour over its peer link."""
    if route == PARENT:
        if up is None:
            raise RuntimeError(f"{comm.node} has no session to its parent to post on")
        up(task, bundle, args, rnd)
        return
    if peers is None:
        raise RuntimeError(f"{comm.node} has no peer links (topology.peer_graph = 'none'): it posts to nobody")
    peers.post(to, task, bundle, args, comm.ctx.round if comm.ctx is not None else rnd, rnd)


class _Stream:
    """One ``Parent/Session`` call: its channel, its outbound queue and the thread reading its answers."""

    _ids = itertools.count(1)

    def __init__(self, channel: grpc.Channel) -> None:
        self.sid = next(self._ids)
        self.channel = channel
        self.out: queue.Queue = queue.Queue()
        rpc = channel.stream_stream("/fedhop.v1.Parent/Session", request_serializer=serialize_frame,
                                    response_deserializer=parse_frame_lenient)
        self.responses: Any = rpc(self._outgoing())
        self.lane: Lane | None = None  # the session's bulk lane (transport/lane.py), set before anything is queued

    def _outgoing(self) -> Iterator[pb.Frame | bytes]:
        while True:
            item = self.out.get()
            if item is CLOSE:
                return
            lane = self.lane
            if lane is not None and isinstance(item, BundleMessage) and lane.carries(item.payload_bytes):
                yield from item.control_frames()  # the payload follows on the lane
                lane.send(item.lane_buffers())
            else:
                try:
                    yield from item
                except CodecError as e:
                    log.error("cannot send a message: %s", e)
            # not held while waiting for the next message: a sent reply's tensors (a model) are freed once written,
            # not when the next round's message is queued, after the next model has arrived into memory of its own
            item = None

    def read_into(self, events: queue.Queue) -> None:
        def run() -> None:
            why = "the parent closed the stream"
            try:
                for message in self.responses:
                    for frame in unbatched(message):  # a Batch's frames (a small Task's) as if they came one by one
                        events.put((self.sid, _FRAME, frame))
            except grpc.RpcError as e:
                why = f"{e.code().name}: {e.details()}"
            events.put((self.sid, _END, why))

        threading.Thread(target=run, daemon=True, name=f"parent-stream-{self.sid}").start()

    def hand_over(self, other: _Stream) -> None:
        """Move the messages not yet taken by this stream to ``other``; end this stream's requests."""
        while True:
            try:
                item = self.out.get_nowait()
            except queue.Empty:
                break
            if item is not CLOSE:
                other.out.put(item)
        self.out.put(CLOSE)

    def close(self) -> None:
        self.out.put(CLOSE)
        self.channel.close()
        if self.lane is not None:
            self.lane.close()


def open_lane(responses: Any, parent_addr: str, security: Security, node: str, channel: grpc.Channel) -> Lane | None:
    """The bulk lane of a session whose first answer (the Welcome) came on ``responses`` (the ``Parent/Session``
    call): dialed when the parent offered one in the call's initial metadata; a lane that breaks closes
    ``channel`` (the session ends and the child re-joins). Call it after the Welcome and before anything else
    is sent on the session (a client host's sessions can call it too). None: bundles stay on the stream."""
    try:
        offer = LaneOffer.parse(responses.initial_metadata())
    except grpc.RpcError:
        return None
    return dial_lane(parent_addr, offer, security, node, on_broken=lambda why: channel.close())


class ChildSession:
    """This node's session with its parent, across re-joins."""

    def __init__(self, config: NodeConfig, role: str, *, address: str = "", info: Mapping[str, Scalar] | None = None,
                 task_lock: AbstractContextManager | None = None, own_connection: bool = False) -> None:
        """``config``: who this node is, its parent (``connect``), how long to keep dialing it and the credentials
        of the channel. ``address``: what the Hello advertises (an edge's, for its neighbours); ``info``: the
        Hello's scalars. A client host's sessions give ``task_lock`` (one task handler at a time in the process:
        a shared Workspace) and ``own_connection`` (a TCP connection per session, not one shared by its ids)."""
        self.config = config
        self.node: NodeId = config.node_id
        self.security = config.security
        self.role = role
        self.parent_addr = config.connect
        self.address = address
        self.info = dict(info or {})
        self.connect_timeout_s = config.connect_timeout_s
        self.peers: dict[NodeId, str] = {}  # edge id -> Edge service address, from the parent's Ready
        self.welcome: pb.Welcome | None = None
        self.run_id = ""
        self.transport = TransportSpec()
        self.max_bytes: int | None = None
        self.protocol: ChildProtocol | None = None
        self._stream: _Stream | None = None
        self._streams: list[_Stream] = []
        self._events: queue.Queue = queue.Queue()
        self._ready_sizes: dict[NodeId, int] | None = None
        self._lock = threading.Lock()
        self.store: NodeStore | None = None  # this node's saved states (keep_state)
        self.meter: ByteMeter | None = None  # this node's byte meter, relabelled on a roll-back
        self._ctx: NodeContext | None = None
        self.task_lock = task_lock
        self.own_connection = own_connection
        self._post_ids = itertools.count(POST_ID_BASE)  # the call ids of this node's Posts to its parent
        self._post_keys = itertools.count()  # the inbox keys of the posts neighbours give it (post:<n>)
        self.parent_up = threading.Event()  # set while the session to the parent works (posted tasks wait for it)
        self._posts_lock = threading.Lock()  # the posts in the node's inbox: delivered, saved, rolled back

    # -- outbound -----------------------------------------------------------------------------------------
    def send(self, frames: Iterable[pb.Frame | bytes]) -> None:
        with self._lock:
            assert self._stream is not None, "send before connect"
            self._stream.out.put(frames)

    def post_up(self, task: str, bundle: Bundle, args: dict[str, Scalar], rnd: int) -> None:
        """A Post to the parent (``Comm.post``): queued on the session stream, not waited for; what a broken
        stream had not sent yet moves to the re-joined one. The parent counts it when it arrives. The node's byte
        rows not reported yet go first (a Report), so that a parent holding the post holds them too (its
        checkpoint of the round the post completes is whole)."""
        if self.protocol is not None:
            self.protocol.send_report(rnd)
        out = on_host(bundle)
        head = post_frame(next(self._post_ids), task, args, has_bundle=bool(out), round_idx=rnd)
        self.send(message_frames(head, out, self.transport.chunk_bytes))

    def epoch(self) -> int:
        """The incarnation of the parent this node serves: the round it resumed at (its Welcome's
        ``resume_round``), -1 for the first. A post carries its sender's (``PeerClient.epoch``)."""
        info = get_scalars(self.welcome.info) if self.welcome is not None else {}
        return int(info["resume_round"]) if "resume_round" in info else -1

    def deliver_post(self, post: Post, epoch: int, sent_round: int) -> None:
        """A neighbour's validated post (``EdgeService``'s ``on_post``), before it is acknowledged: it becomes this
        node's state (an inbox entry ``post:<n>``, saved under the sender's round ``sent_round``, as a hand-off:
        an acknowledged post is never lost), then runs in this node's task loop after the tasks and posts before
        it (one that comes before the loop starts waits for it)."""
        ctx = self._ctx
        if ctx is None:
            raise RuntimeError(f"{self.node}: a post came before this node has its context")
        with self._posts_lock:
            key = f"{POST_SLOT}{next(self._post_keys):012d}"
            ctx.inbox[key] = post_entry(post, epoch)
            if self.store is not None:
                self.store.save(ctx, self.run_id, tag=sent_round)
            proto = self.protocol
        if proto is not None:
            proto.posted(key)

    def _queue_posts(self, ctx: NodeContext) -> None:
        """Give the task loop every post this node holds (after a start, a restart or a roll-back), in order; one
        already queued runs once (the loop takes it out of the inbox)."""
        keys = sorted((k for k in ctx.inbox if post_seq(k) >= 0), key=post_seq)
        if keys:
            self._post_keys = itertools.count(max(post_seq(keys[-1]) + 1, next(self._post_keys)))
        if self.protocol is not None:
            for k in keys:
                self.protocol.posted(k)

    # -- joining ------------------------------------------------------------------------------------------
    def connect(self) -> pb.Welcome:
        """Dial the parent (waiting for it to come up), say Hello, and return its Welcome."""
        end = time.monotonic() + self.connect_timeout_s
        delay, said = 0.25, 0.0
        while True:
            up = listening(self.parent_addr)
            if up:
                try:
                    welcome = self._open(rejoin=False)
                    self.parent_up.set()
                    return welcome
                except _Retry as e:
                    why = str(e)
            else:
                why = "nothing listens there yet" if up is False else "it cannot be reached"
            left = end - time.monotonic()
            if left <= 0:
                raise JoinError(f"{self.node}: parent {self.parent_addr} unreachable for "
                                f"{self.connect_timeout_s:.0f}s ({why})")
            if time.monotonic() - said >= 10:
                log.warning("%s: waiting for parent %s: %s; retrying for %.0fs more", self.node, self.parent_addr,
                            why, left)
                said = time.monotonic()
            time.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)

    def _open(self, *, rejoin: bool) -> pb.Welcome:
        """One attempt: channel, handshake, Hello, Welcome; on success the new stream becomes current."""
        channel = make_channel(self.parent_addr, keepalive=True, security=self.security,
                               own_connection=self.own_connection)
        try:
            grpc.channel_ready_future(channel).result(timeout=HANDSHAKE_TIMEOUT_S)
        except grpc.FutureTimeoutError:
            channel.close()
            raise self._no_handshake(rejoin) from None
        stream = _Stream(channel)
        stream.out.put([self._hello(rejoin)])
        try:
            first = next(stream.responses)
        except StopIteration:
            first = None
        except grpc.RpcError as e:
            stream.close()
            raise self._call_failed(e) from None
        self._check_welcome(first, rejoin, stream.close)
        stream.lane = open_lane(stream.responses, self.parent_addr, self.security, self.node, channel)
        self._adopt(stream, first.welcome)
        return first.welcome

    # the steps of an attempt, shared with the asyncio sessions of a client host (transport/aio_child.py)
    def _hello(self, rejoin: bool) -> pb.Frame:
        return hello_frame(self.node, self.role, self.address, self.info, self.run_id if rejoin else "")

    def _no_handshake(self, rejoin: bool) -> Exception:
        """What a channel that did not become ready within HANDSHAKE_TIMEOUT_S means."""
        if rejoin:
            return _Retry("no gRPC handshake")
        if not self.security.plaintext:
            return JoinError(f"{self.node}: no TLS handshake with {self.parent_addr} within "
                             f"{HANDSHAKE_TIMEOUT_S:g}s: the parent refused this node's certificate (another CA, "
                             f"expired) or presented one this node does not trust or that does not name "
                             f"{self.parent_addr}, or it does not speak TLS ({self.security.describe()})",
                             ExitCode.JOIN_FAILED)
        return JoinError(f"{self.node}: {self.parent_addr} accepts connections but does not complete a gRPC "
                         f"(HTTP/2) handshake within {HANDSHAKE_TIMEOUT_S:g}s: it is not a fedhop node (or it is "
                         "stalled)", ExitCode.NOT_FEDHOP)

    def _call_failed(self, e: grpc.RpcError) -> Exception:
        """What a Session call that failed before its first answer means."""
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            return JoinError(f"{self.node}: {self.parent_addr} is a gRPC server without the fedhop Parent "
                             f"service: not a fedhop node ({e.details()})", ExitCode.NOT_FEDHOP)
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            return _Retry(f"{e.code().name}: {e.details()}")
        if e.code() in _BROKEN_BEFORE_ANSWER:
            # gRPC's core ends a call this way when the parent's server shuts down (or restarts) while the call
            # is being set up: the connection, not the parent, failed (grpc/grpc#14109: "not categorically
            # wrong"); dialling again is right, and a parent that stays away ends the wait with this reason
            return _Retry(f"the call broke before the parent answered ({e.code().name}: {e.details()})")
        return JoinError(f"{self.node}: parent {self.parent_addr}: {e.code().name}: {e.details()}")

    def _check_welcome(self, first: Any, rejoin: bool, close: Callable[[], None]) -> None:
        """The parent's first answer (None: it closed the stream) must be this run's Welcome; else ``close()``
        the stream and raise what it means (JoinError, _Retry or _StillConnected)."""
        if first is None:
            close()
            raise JoinError(f"{self.node}: parent {self.parent_addr} closed the session without a Welcome")
        if isinstance(first, pb.Frame) and first.WhichOneof("body") == "error":
            close()
            if rejoin and first.error.code == pb.ERROR_CODE_ALREADY_CONNECTED:
                raise _StillConnected(first.error.message)
            if first.error.code == pb.ERROR_CODE_DEADLINE_EXCEEDED:  # our Hello came too late (a crowded parent)
                raise _Retry(f"the parent did not see this node's Hello in time: {first.error.message}")
            raise JoinError(f"{self.node}: parent {self.parent_addr} refused: {first.error.message}",
                            _REFUSALS.get(first.error.code, ExitCode.JOIN_FAILED))
        if not isinstance(first, pb.Frame) or first.WhichOneof("body") != "welcome":
            close()
            raise JoinError(f"{self.node}: expected Welcome from {self.parent_addr}, got {first!r}")
        if rejoin and first.welcome.run_id != self.run_id:
            close()
            raise JoinError(f"{self.node}: parent {self.parent_addr} came back running run "
                            f"{first.welcome.run_id!r}; this node belongs to run {self.run_id!r}",
                            ExitCode.RUN_MISMATCH)

    def _adopt(self, stream: Any, welcome: pb.Welcome) -> None:
        """The stream that brought ``welcome`` becomes current; what the old one had not sent moves to it."""
        with self._lock:
            old, self._stream = self._stream, stream
            if old is not None:
                old.hand_over(stream)
                if old.lane is not None:  # the old session is over: its lane carries nothing more
                    old.lane.close()
        self._streams.append(stream)
        stream.read_into(self._events)
        self.welcome = welcome
        self.run_id = welcome.run_id

    def join(self, device: str | None = None, data_path: str | None = None,
             workspace: Callable[[str], Workspace] | None = None) -> tuple[pb.Welcome, Workspace]:
        """connect(), then build this process's Workspace from the RunSpec in the Welcome and check that the
        run gives this node the role it joined as; a JoinError says what went wrong. ``workspace`` (a client
        host's): the Workspace for the Welcome's spec JSON, shared by the host's sessions, instead of a new one."""
        welcome = self.connect()
        ws = workspace(welcome.spec) if workspace is not None else None
        spec = ws.spec if ws is not None else RunSpec.model_validate_json(welcome.spec)
        try:
            check_parent_code(spec, get_scalars(welcome.info), self.node)
        except UserCodeError as e:
            raise JoinError(str(e), ExitCode.USER_CODE) from None
        ws = ws if ws is not None else Workspace(spec, device, data_path)
        try:
            role = ws.topology.role(self.node)
        except KeyError:
            role = None
        if role != self.role:
            raise JoinError(f"{self.node} is not {'an' if self.role == 'edge' else 'a'} {self.role} of this run")
        self.transport = ws.spec.transport
        self.max_bytes = ws.spec.transport.max_bundle_bytes
        mark(f"joined-{self.node}")  # the Welcome passed every check (a test hook, common/testhooks.py)
        return welcome, ws

    def send_ready(self, data_sizes: Mapping[NodeId, int]) -> None:
        """Ready with this subtree's data sizes (again as an update, e.g. when a client joined an edge late)."""
        self._ready_sizes = {k: int(v) for k, v in data_sizes.items()}
        f = pb.Frame()
        f.ready.SetInParent()
        for k, v in self._ready_sizes.items():
            f.ready.data_sizes[k] = v
        self.send([f])

    def _rejoin(self, *, old_ended: bool) -> ExitCode | None:
        """Dial the parent again for transport.reconnect_s; None once re-joined, else the exit code.

        ``old_ended``: the current stream ended (else the parent was only silent). A parent that still holds
        this node's session refuses the new one (``ERROR_CODE_ALREADY_CONNECTED``): a stream that has not ended
        is then kept (the parent was only slow, and gets what was sent on it); one that ended here is retried
        until the parent notices too."""
        mark(f"rejoining-{self.node}")  # test hooks (common/testhooks.py): the tests await states, not log lines
        self.parent_up.clear()  # posted tasks wait: their reports must reach the parent, and a resumed one rolls back
        end = time.monotonic() + self.transport.reconnect_s
        delay, why = 0.25, "no attempt finished"
        while time.monotonic() < end:
            try:
                self._open(rejoin=True)
            except _StillConnected as e:
                why = f"it still held this node's old session: {e}"
                if not old_ended:
                    log.info("%s: parent %s still holds this node's session (%s); staying on it", self.node,
                             self.parent_addr, e)
                    mark(f"rejoined-{self.node}")
                    self.parent_up.set()
                    return None
                time.sleep(max(0.0, min(delay, end - time.monotonic())))
                delay = min(delay * 2, 5.0)
                continue
            except _Retry as e:
                why = str(e)
                time.sleep(max(0.0, min(delay, end - time.monotonic())))
                delay = min(delay * 2, 5.0)
                continue
            except JoinError as e:
                log.error("%s", e)
                return e.code
            if self._ctx is not None and self.store is not None:
                self.restore(self._ctx)
            if self._ready_sizes is not None:
                self.send_ready(self._ready_sizes)
            log.info("%s: re-joined run %s at %s", self.node, self.run_id, self.parent_addr)
            mark(f"rejoined-{self.node}")
            self.parent_up.set()
            return None
        log.error("%s: parent %s did not come back within transport.reconnect_s = %gs (last: %s); giving up",
                  self.node, self.parent_addr, self.transport.reconnect_s, why)
        return ExitCode.PARENT_LOST

    # -- state --------------------------------------------------------------------------------------------
    def keep_state(self, ctx: NodeContext, store: NodeStore, meter: ByteMeter | None = None) -> Restored:
        """Save this node's state after every task (``store``), and restore it now and at every re-join: to
        before the parent's ``resume_round`` when the parent resumed from a checkpoint (a node that is ahead
        rolls back; its byte rows since are relabelled "redo"), else to its newest saved state (a restarted
        node). The Hello says which round the state is from (``state_round``; -1: none)."""
        self.store, self.meter, self._ctx = store, meter, ctx
        store.keep_rounds(ctx.spec.checkpoint_every + 1)
        return self.restore(ctx)

    def restore(self, ctx: NodeContext) -> Restored:
        assert self.store is not None and self.welcome is not None
        info = get_scalars(self.welcome.info)
        if "resume_round" in info:
            r = int(info["resume_round"])
            with self._posts_lock:  # posts sent under the resumed parent (by a neighbour that re-joined first) stay
                fresh = {k: e for k, e in ctx.inbox.items() if post_seq(k) >= 0 and post_of(e)[1] == r}
                got = self.store.rollback(ctx, r, self.run_id)
                ctx.inbox.update(fresh)
            self._queue_posts(ctx)
            if self.meter is not None and self.meter.relabel_from(r) and self.protocol is not None:
                log.info("%s: byte rows of round %d on are reported as redo", self.node, r + 1)
        elif self.store.newest_tag() is not None and self.store.disk is not None and self.protocol is None:
            got = self.store.rollback(ctx, NEWEST, self.run_id)  # a restarted node: its newest state
        else:
            got = Restored(self.store.newest_tag(), "memory")
        self.info["state_round"] = got.tag if got.tag is not None else -1
        return got

    def _saved(self, ctx: NodeContext) -> None:
        assert self.store is not None
        self.store.save(ctx, self.run_id)
        self.info["state_round"] = ctx.round

    # -- serving ------------------------------------------------------------------------------------------
    def serve(self, ctx: NodeContext, *, on_bye: Callable[[bool], None] | None = None,
              report: Callable[[], tuple[list[dict], list[dict]]] | None = None,
              before_task: Callable[[int | None, float], None] | None = None) -> ExitCode:
        """Serve the parent until its Bye (``on_bye(finished)`` runs first, e.g. an edge's own shutdown; then
        this node answers Bye) or until the parent is lost for good. Returns the process's exit code."""
        proto = self._serving(ctx, report, before_task)
        asms: dict[int, MessageAssembler] = {}
        quiet = 0
        while True:
            try:
                sid, kind, item = self._events.get(timeout=self.transport.keepalive_s)
            except queue.Empty:
                quiet += 1
                if not self._silent_too_long(quiet):
                    continue
                step, got = _REJOIN, False
            else:
                step, got = self._on_event(proto, asms, sid, kind, item)
            if step is _HEARD:
                quiet = 0
            elif step is _REJOIN:
                code = self._rejoin(old_ended=got)
                if code is not None:
                    return self._give_up(proto, code, on_bye)
                quiet = 0
            elif step is _BYE:
                return self._finish(proto, got, on_bye)

    # the steps of serve(), shared with the asyncio sessions of a client host (transport/aio_child.py)
    def _serving(self, ctx: NodeContext, report: Callable[[], tuple[list[dict], list[dict]]] | None,
                 before_task: Callable[[int | None, float], None] | None,
                 workers: DaemonPool | None = None) -> ChildProtocol:
        hooks = TaskHooks(before_task=before_task, after_task=self._saved if self.store is not None else None,
                          report=report, parent_up=self.parent_up)
        proto = ChildProtocol(self.node, ctx, self.send, chunk_bytes=self.transport.chunk_bytes, hooks=hooks,
                              peers=self.peers, task_lock=self.task_lock, workers=workers)
        with self._lock:
            self.protocol = proto
        self._queue_posts(ctx)  # the posts that came before (or that a restarted node restored)
        return proto

    def _silent_too_long(self, quiet: int) -> bool:
        """``quiet`` keep-alive ticks without a frame from the parent: time to re-join?"""
        tick = self.transport.keepalive_s
        if quiet * tick < self.transport.keepalive_timeout_s:
            return False
        log.warning("%s: nothing from parent %s for %.0fs (stalled or gone); re-joining", self.node,
                    self.parent_addr, quiet * tick)
        return True

    def _on_event(self, proto: ChildProtocol, asms: dict[int, MessageAssembler], sid: int, kind: str,
                  item: Any) -> tuple[object, Any]:
        """One event of the streams: (_HEARD, None) a frame of the current stream, (_SKIP, None) one of an old
        stream, (_REJOIN, True) the current stream ended, (_BYE, bye) the parent's Bye."""
        current = self._stream is not None and sid == self._stream.sid
        if kind == _END:
            if not current:
                return _SKIP, None
            log.warning("%s: stream to parent %s ended (%s); re-joining", self.node, self.parent_addr, item)
            return _REJOIN, True
        if sid not in asms:
            asms[sid] = child_assembler(self.transport)
            asms[sid].lane = next((s.lane for s in self._streams if s.sid == sid), None)
        bye = proto.on_frame(item, asms[sid])
        lane = asms[sid].lane
        if lane is not None and lane.broken:  # mid-payload (that task failed): the session ends, and re-joins
            self._end_stream(sid)
        if bye is not None:
            return _BYE, bye
        return (_HEARD if current else _SKIP), None

    def _end_stream(self, sid: int) -> None:
        """End one session stream (its reader then reports the end, and the node re-joins if it was current)."""
        for s in self._streams:
            if s.sid == sid:
                s.channel.close()

    def _give_up(self, proto: ChildProtocol, code: ExitCode, on_bye: Callable[[bool], None] | None) -> ExitCode:
        proto.stop()
        if on_bye is not None:
            on_bye(False)
        return code

    def _finish(self, proto: ChildProtocol, bye: pb.Bye, on_bye: Callable[[bool], None] | None) -> ExitCode:
        stream = self._say_bye(proto, bye, on_bye)
        end = time.monotonic() + BYE_WAIT_S
        while time.monotonic() < end:  # wait until the parent closes its side, so the Bye is delivered
            try:
                sid, kind, _ = self._events.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if sid == stream.sid and kind == _END:
                break
        return self._outcome(bye)

    def _say_bye(self, proto: ChildProtocol, bye: pb.Bye, on_bye: Callable[[bool], None] | None) -> Any:
        """Stop the tasks, run ``on_bye``, answer Bye and end the current stream's requests; returns that stream."""
        proto.stop()
        if on_bye is not None:
            try:
                on_bye(bye.finished)
            except Exception:
                log.exception("%s: ending its own sessions failed", self.node)
        self.send([proto.bye()])
        stream = self._stream
        assert stream is not None
        stream.out.put(CLOSE)
        return stream

    def _outcome(self, bye: pb.Bye) -> ExitCode:
        if bye.finished:
            return ExitCode.OK
        log.error("%s: the parent ended the session, but the run did not finish: %s", self.node, bye.reason)
        return ExitCode.RUN_NOT_FINISHED

    def close(self) -> None:
        for s in self._streams:
            s.close()
