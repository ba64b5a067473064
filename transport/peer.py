"""The edge-to-edge protocol, both halves (docs/design.md section 6): ``Edge.HandOff`` (a model handed to a
neighbour edge directly, never through the PS; acknowledged only once the neighbour holds and has validated
the whole bundle) and ``Edge.Describe`` (small public facts about an edge).

A post to a neighbour (``Comm.post``) travels on ``Edge.HandOff`` too: its Task frame is named after the posted
task and the ``fedhop-post`` metadata entry says it is one (with the post's id, so that a retried post whose
first Ack was lost is not run twice). The receiver validates it like a hand-off, checks that it knows the task,
acknowledges it and queues it for its task loop (``EdgeService.serve``'s ``on_post``).

:class:`PeerClient` is the calling half (used by the networked Comm), :class:`EdgeService` the serving
half (run by every edge). Who calls and the hand-off's inbox slot travel in gRPC metadata, so that the
counted message bytes do not depend on node ids. Byte meter: the caller counts both directions.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from fedhop.common.engine.api import NodeContext, NodeId, Post, Scalar, get_algorithm, get_task, meter_kind
from fedhop.common.engine.base import HandOffError, MissingLog, PostError, inbox_key
from fedhop.common.spec import TransportSpec
from fedhop.common.wire.budget import InflightBudget
from fedhop.common.wire.bundle import Bundle, payload_bytes
from fedhop.common.wire.framing import frame_size, parse_frame_lenient, serialize_frame, unbatched
from fedhop.common.wire.messages import (
    CALL_ID_BASE,
    DESCRIBE,
    HANDOFF,
    FrameError,
    Message,
    MessageAssembler,
    describe_reply,
    message_frames,
    on_host,
    task_frame,
)
from fedhop.common.wire.meter import ByteMeter
from fedhop.common.wire.scalars import get_scalars
from fedhop.transport.channels import make_channel
from fedhop.transport.credentials import PLAINTEXT, Security, Unauthenticated, peer_identity
from fedhop.transport.inbound import Rejection, accept_request
from fedhop.v1 import fedhop_pb2 as pb

if TYPE_CHECKING:
    from fedhop.transport.aio_server import LoopServer

T = TypeVar("T")
log = logging.getLogger("fedhop.peer")

NODE_HEADER = "fedhop-node"  # gRPC metadata: who calls (Edge.HandOff, Edge.Describe)
SLOT_HEADER = "fedhop-slot"  # gRPC metadata: the hand-off's inbox slot
ROUND_HEADER = "fedhop-round"  # gRPC metadata: the round the hand-off happens in (for the receiver's snapshot)
POST_HEADER = "fedhop-post"  # gRPC metadata on a post: the sender's id of the post (a HandOff that is a post)
SENT_HEADER = "fedhop-sent-round"  # gRPC metadata on a post: the sender's round (the receiver saves its state under it)
EPOCH_HEADER = "fedhop-epoch"  # gRPC metadata on a post: the PS incarnation it was sent under (ChildSession.epoch)
POSTS_KEPT = 1024  # post ids remembered per sender (a retried post that was delivered is acknowledged, not rerun)


class PeerClient:
    """Calls neighbour edges' ``Edge`` service for one node; counts both directions on its meter."""

    def __init__(self, node: NodeId, meter: ByteMeter, missing: MissingLog, transport: TransportSpec,
                 peers: Mapping[NodeId, str], security: Security = PLAINTEXT) -> None:
        self.node = node
        self.meter = meter
        self.missing = missing
        self.transport = transport
        self.peers = peers  # filled when the run starts (and when an edge joins late)
        self.security = security
        self._channels: dict[str, grpc.Channel] = {}
        self._posts = 0  # posts sent: their ids
        self._post_lock = threading.Lock()
        self.epoch: Callable[[], int] = lambda: -1  # the PS incarnation this node serves (ChildSession.epoch)

    def _channel(self, peer: NodeId) -> grpc.Channel:
        if peer not in self.peers:
            raise HandOffError(f"{self.node} does not know the address of {peer} (known: {sorted(self.peers)})")
        addr = self.peers[peer]
        if addr not in self._channels:
            self._channels[addr] = make_channel(addr, security=self.security, peer_id=peer)
        return self._channels[addr]

    def hand_off(self, to: NodeId, slot: str, bundle: Bundle, scalars: Mapping[str, Scalar], rnd: int) -> None:
        """Stream the bundle to the neighbour's ``Edge.HandOff``; retried on transport errors."""
        self._stream(to, HANDOFF, HANDOFF, bundle, scalars, rnd, ((SLOT_HEADER, slot), (ROUND_HEADER, str(rnd))),
                     HandOffError, "hand-off")

    def post(self, to: NodeId, task: str, bundle: Bundle, args: Mapping[str, Scalar], rnd: int,
             post_round: int) -> None:
        """Post ``task`` to the neighbour (``Edge.HandOff`` with ``fedhop-post``); it runs there at ``post_round``.
        Counted at round ``rnd`` under the task's request kind, its Ack as that kind's reply. Retried on transport
        errors; raises :class:`PostError` when refused or not delivered."""
        with self._post_lock:
            self._posts += 1
            pid = f"{self.node}/{self._posts}"
        self._stream(to, task, meter_kind(task, "request"), bundle, args, rnd,
                     ((POST_HEADER, pid), (ROUND_HEADER, str(post_round)), (SENT_HEADER, str(rnd)),
                      (EPOCH_HEADER, str(self.epoch()))), PostError, f"post {task}")

    def _stream(self, to: NodeId, name: str, kind: str, bundle: Bundle, scalars: Mapping[str, Scalar], rnd: int,
                metadata: tuple[tuple[str, str], ...], error: type[HandOffError], what: str) -> None:
        """One Task message (``name``, ``scalars``, ``bundle``) on ``Edge.HandOff``, counted under ``kind``."""
        snapshot = on_host(bundle)
        payload = payload_bytes(snapshot)
        call = self._channel(to).stream_unary("/fedhop.v1.Edge/HandOff", request_serializer=serialize_frame,
                                              response_deserializer=pb.Ack.FromString)
        last = ""
        for attempt in range(self.transport.handoff_retries + 1):
            head = task_frame(CALL_ID_BASE + attempt, name, scalars, deadline_s=self.transport.rpc_timeout_s,
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
                           metadata=((NODE_HEADER, self.node), *metadata))
            except grpc.RpcError as e:
                last = f"{e.code().name}: {e.details()}"
                if counted[0]:
                    self.meter.record(self.node, to, kind, "request", payload, counted[0], rnd)
                log.warning("%s: %s to %s failed (attempt %d): %s", self.node, what, to, attempt + 1, last)
                time.sleep(min(0.2 * 2 ** attempt, 2.0))
                continue
            self.meter.record(self.node, to, kind, "request", payload, counted[0], rnd)
            self.meter.record(to, self.node, kind, "reply", 0, ack.ByteSize(), rnd)
            if not ack.ok:
                reason = f"{to} rejected the {what} from {self.node}: {ack.error.message}"
                self.missing.add(rnd, self.node, to, name, reason)
                raise error(reason)
            return
        reason = f"{what} {self.node} -> {to} failed after {self.transport.handoff_retries + 1} attempts: {last}"
        self.missing.add(rnd, self.node, to, name, reason)
        raise error(reason)

    def describe(self, peer: NodeId, rnd: int) -> dict[str, Scalar] | None:
        """The peer's public facts, or None (logged as missing) when it does not answer."""
        req = pb.DescribeRequest()
        call = self._channel(peer).unary_unary("/fedhop.v1.Edge/Describe",
                                              request_serializer=pb.DescribeRequest.SerializeToString,
                                              response_deserializer=pb.DescribeReply.FromString)
        try:
            rep = call(req, timeout=self.transport.rpc_timeout_s, metadata=((NODE_HEADER, self.node),))
        except grpc.RpcError as e:  # an unreachable peer is absent from the answer, as in scatter
            self.missing.add(rnd, self.node, peer, DESCRIBE, f"{e.code().name}: {e.details()}")
            return None
        self.meter.record(self.node, peer, DESCRIBE, "request", 0, req.ByteSize(), rnd)
        self.meter.record(peer, self.node, DESCRIBE, "reply", 0, rep.ByteSize(), rnd)
        return get_scalars(rep.info)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()


def advertised(listen: str, port: int, advertise: str | None) -> str:
    """The address peers dial for a node listening on ``listen`` (bound to ``port``): ``advertise`` if given,
    else the listen host (127.0.0.1 for a wildcard) and the bound port."""
    host = listen.rsplit(":", 1)[0] or "127.0.0.1"
    return advertise or f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '') else host}:{port}"


class EdgeService:
    """``Edge.HandOff`` and ``Edge.Describe`` of one edge; refuses calls until the edge is in a run.

    Served on the edge's asyncio server (:class:`~fedhop.transport.aio_server.LoopServer`, with its children's
    sessions): the handlers are coroutines, so a hand-off holds no thread while its frames arrive, and refusals
    abort the call where the synchronous handlers did (``Describe``: ``UNAVAILABLE`` before the run,
    ``PERMISSION_DENIED`` for a stranger under TLS or tokens); the work on each frame, the checks of the whole
    message and the state saved before an Ack run in the server's session pool."""

    def __init__(self, node_id: NodeId, security: Security = PLAINTEXT) -> None:
        self.node = node_id
        self.security = security  # with TLS or tokens, who calls is what its certificate or token proves
        self.ctx: NodeContext | None = None  # set by serve(): until then every call is refused
        self.max_bytes: int | None = None
        self._budgets: dict[str, InflightBudget] = {}  # per sender: every hand-off stream it has open
        self._budget_lock = threading.Lock()
        self.on_received: Callable[[NodeContext, int], None] | None = None  # (ctx, round): save the node's state
        # a validated post, its epoch and its sender's round: keep it and queue it for the node's task loop
        self.on_post: Callable[[Post, int, int], None] | None = None
        self._seen: dict[str, OrderedDict[str, None]] = {}  # per sender: the ids of the posts it delivered
        self._pool: Executor | None = None  # where the handlers' work runs: the server's session pool (register)

    def serve(self, ctx: NodeContext, on_received: Callable[[NodeContext, int], None] | None = None,
              on_post: Callable[[Post, int, int], None] | None = None) -> None:
        """The edge is in the run: take hand-offs into ``ctx`` (bundles capped by its spec's
        ``transport.max_bundle_bytes``); ``on_received(ctx, round)`` is told of each before it is acknowledged
        (to save the node's state); ``on_post(post, epoch, sent_round)`` gets each validated post before it is
        acknowledged (None: posts are refused)."""
        self.max_bytes = ctx.spec.transport.max_bundle_bytes
        self.on_received = on_received
        self.on_post = on_post
        self.ctx = ctx  # last: a call that sees the run sees its cap and its saver

    def register(self, server: LoopServer) -> None:
        """Serve ``Edge.HandOff`` and ``Edge.Describe`` on ``server`` (the edge's asyncio server: the handlers are
        coroutines; what they do that takes time runs in its session pool)."""
        self._pool = server.sessions
        handlers = {
            "HandOff": grpc.stream_unary_rpc_method_handler(
                self.HandOff, request_deserializer=parse_frame_lenient, response_serializer=pb.Ack.SerializeToString),
            "Describe": grpc.unary_unary_rpc_method_handler(
                self.Describe, request_deserializer=pb.DescribeRequest.FromString,
                response_serializer=pb.DescribeReply.SerializeToString),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fedhop.v1.Edge", handlers),))

    async def _work(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the server's session pool (the loop's default executor before :meth:`register`)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _caller(self, context: grpc.aio.ServicerContext) -> tuple[str, str]:
        """(who calls, the hand-off's slot); who calls is "" when it cannot be established. With TLS or
        tokens it comes from the certificate or token, never from the ``fedhop-node`` entry the caller writes."""
        md = dict(context.invocation_metadata() or ())
        slot = str(md.get(SLOT_HEADER, ""))
        if self.security.plaintext:
            return str(md.get(NODE_HEADER, "")), slot
        try:
            return str(peer_identity(context, self.security)), slot  # type: ignore[arg-type]
        except Unauthenticated as e:
            log.warning("%s: unauthenticated caller %s: %s", self.node, context.peer(), e)
            return "", slot

    def _stranger(self, sender: str, ctx: NodeContext) -> str | None:
        """Why ``sender`` may not call this edge (None: a neighbour). Says nothing of the topology."""
        if sender in ctx.neighbours:
            return None
        return f"{sender or 'an unauthenticated caller'} is not a neighbour of {self.node}"

    def _refuse(self, code: int, message: str) -> pb.Ack:
        log.warning("%s: hand-off refused: %s", self.node, message)
        return pb.Ack(ok=False, error=pb.Error(code=code, message=f"{self.node}: {message}"))

    def _unread_refusal(self, ctx: NodeContext | None, sender: str, slot: str, pid: str, peer: str) -> pb.Ack | None:
        """The refusal of a hand-off or post that is decided before a byte of it is read (None: read it)."""
        if ctx is None:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, "not in a run yet")
        why = self._stranger(sender, ctx)
        if why is not None:
            log.warning("%s: hand-off from %s refused: %s", self.node, peer, why)
            return pb.Ack(ok=False, error=pb.Error(code=pb.ERROR_CODE_BAD_REQUEST, message=f"{self.node}: {why}"))
        if pid:
            if self.on_post is None:
                return self._refuse(pb.ERROR_CODE_BAD_REQUEST, f"post from {sender}: this node takes no posts")
        elif not slot:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, f"hand-off from {sender} names no slot")
        elif slot not in get_algorithm(ctx.spec.algorithm.name).handoff_slots:
            # checked before a byte is read: nothing is kept for a slot nobody takes from
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, f"hand-off from {sender} into slot {slot!r}, which "
                                f"{ctx.spec.algorithm.name} does not use")
        return None

    async def HandOff(self, frames: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> pb.Ack:  # noqa: N802
        """One hand-off or post: its frames are assembled in the session pool as they come (one gRPC message at a
        time: a Batch's frames in one job), then validated and kept (or queued) there; the Ack says whether it was
        taken. A sender that stops half-way holds no thread, and its call is cancelled (``CANCELLED``) at
        ``transport.rpc_timeout_s``."""
        sender, slot = self._caller(context)
        md = dict(context.invocation_metadata() or ())
        pid = str(md.get(POST_HEADER, ""))
        ctx = self.ctx
        refused = self._unread_refusal(ctx, sender, slot, pid, context.peer())
        if refused is not None:
            return refused
        assert ctx is not None
        transport = ctx.spec.transport
        asm = MessageAssembler(max_bytes=self.max_bytes, budget=self._budget(sender, transport),
                               accept=lambda head: None if head.WhichOneof("body") == "task" else "not a Task")
        feeding = threading.Lock()  # the assembler is closed only once the frame being fed (in the pool) is in

        def feed(batch: tuple[Any, ...]) -> Message | None:
            """One gRPC message's frames (a Batch's, in one job), until the message is whole."""
            with feeding:
                for frame in batch:
                    done = asm.feed(frame)
                    if done is not None:
                        return done
                return None

        msg = None
        try:
            async with asyncio.timeout(transport.rpc_timeout_s):
                async for f in frames:
                    msg = await self._work(feed, unbatched(f))
                    if msg is not None:
                        break
        except FrameError as e:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, f"hand-off from {sender}: {e}")
        except TimeoutError:
            log.warning("%s: hand-off from %s (%s) cancelled: not complete within transport.rpc_timeout_s = %gs",
                        self.node, sender, context.peer(), transport.rpc_timeout_s)
            await context.abort(grpc.StatusCode.CANCELLED, f"{self.node}: the hand-off was not complete within "
                                f"transport.rpc_timeout_s = {transport.rpc_timeout_s:g}s")
        finally:
            with feeding:
                asm.close()
        if msg is None:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, f"hand-off from {sender} ended before its bundle")
        return await self._work(self._accepted, msg, sender, slot, pid, md, ctx)

    def _accepted(self, msg: Message, sender: str, slot: str, pid: str, md: Mapping[str, Any],
                  ctx: NodeContext) -> pb.Ack:
        """A whole hand-off (or post): validated, kept in the inbox (saved before it is acknowledged)."""
        if pid:
            return self._posted(msg, sender, pid, md, ctx)
        req = accept_request(msg, self.node, sender, ctx.device, expect_name=HANDOFF)
        if isinstance(req, Rejection):
            return self._refuse(req.code, req.message)
        ctx.inbox[inbox_key(slot, sender)] = (req.bundle, req.args)
        if self.on_received is not None:  # saved before the Ack: an acknowledged model is never lost
            self.on_received(ctx, int(md.get(ROUND_HEADER, ctx.round)))
        return pb.Ack(ok=True)

    def _posted(self, msg: Message, sender: str, pid: str, md: Mapping[str, Any], ctx: NodeContext) -> pb.Ack:
        """A whole post from a neighbour: validated (a task this node knows, a finite bundle), then queued for the
        node's task loop and acknowledged; one already delivered (its first Ack was lost) is acknowledged only."""
        name = msg.head.task.name if msg.kind == "task" else ""
        try:
            get_task(name)
        except KeyError:
            return self._refuse(pb.ERROR_CODE_UNKNOWN_TASK, f"unknown task {name!r}")
        req = accept_request(msg, self.node, sender, ctx.device, expect_name=name)
        if isinstance(req, Rejection):
            return self._refuse(req.code, req.message)
        try:
            rnd = int(md.get(ROUND_HEADER, ctx.round))
            sent = int(md.get(SENT_HEADER, rnd))
            epoch = int(md.get(EPOCH_HEADER, -1))
        except ValueError:
            return self._refuse(pb.ERROR_CODE_BAD_REQUEST, f"post from {sender}: bad round or epoch in its metadata")
        with self._budget_lock:
            seen = self._seen.setdefault(sender, OrderedDict())
            again = pid in seen
            seen[pid] = None
            while len(seen) > POSTS_KEPT:
                seen.popitem(last=False)
        if not again:
            assert self.on_post is not None
            self.on_post(Post(sender, req.name, req.bundle, dict(req.args), rnd), epoch, sent)
        return pb.Ack(ok=True)

    def _budget(self, sender: str, transport: TransportSpec) -> InflightBudget:
        with self._budget_lock:
            if sender not in self._budgets:
                self._budgets[sender] = InflightBudget(transport.max_open_bundles, transport.inflight_bytes())
            return self._budgets[sender]

    async def Describe(self, request: pb.DescribeRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> pb.DescribeReply:
        ctx = self.ctx
        if ctx is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.node} is not in a run yet")
        assert ctx is not None
        if not self.security.plaintext:
            sender, _ = self._caller(context)
            why = self._stranger(sender, ctx)
            if why is not None:
                log.warning("%s: describe from %s refused: %s", self.node, context.peer(), why)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        return describe_reply({"data_size": ctx.sizes.get(self.node, 0), **ctx.public})
