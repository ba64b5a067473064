"""The child side of ``Parent.Session`` on an asyncio loop: the sessions of a client host's ids (``fedhop clients``,
``client/host.py``), all on one event loop, with ``grpc.aio`` streams, instead of a session thread, a stream
reader thread and gRPC's request-consumer thread per id (and a task worker: the ids' tasks run in
:class:`~fedhop.transport.workers.SerialWork` s on the host's shared workers).

:class:`AioChildSession` is a :class:`~fedhop.transport.child.ChildSession`: the same joining (dialing with
backoff, the checks of the Welcome), re-joining, state (keep_state / restore / rolled-back posts), posts and
protocol (:class:`~fedhop.transport.session.ChildProtocol`); only the streams and the loop that waits on them are
asyncio's. The blocking steps (``connect`` / ``_rejoin``, with their backoff sleeps, and the Bye's wait for the
task in progress) run on the host's join workers; each attempt's gRPC calls run on the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

import grpc

from fedhop.common import heap
from fedhop.common.engine.api import NodeContext
from fedhop.common.exit_codes import ExitCode
from fedhop.common.wire.codec import CodecError
from fedhop.common.wire.framing import parse_frame_lenient, serialize_frame, unbatched
from fedhop.common.wire.messages import BundleMessage, MessageAssembler
from fedhop.transport.channels import HANDSHAKE_TIMEOUT_S, make_aio_channel
from fedhop.transport.child import _BYE, _END, _FRAME, _HEARD, _REJOIN, BYE_WAIT_S, ChildSession, _Stream
from fedhop.transport.lane import Lane, LaneOffer, dial_lane
from fedhop.transport.loop_calls import LoopCalls
from fedhop.transport.session import CLOSE
from fedhop.transport.workers import DaemonPool
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.child")

T = TypeVar("T")


class _Outbox:
    """A stream's outbound queue on the loop; ``put`` may be called from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.q: asyncio.Queue = asyncio.Queue()

    def put(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.q.put_nowait, item)


class _AioStream:
    """One ``Parent/Session`` call on the loop: its channel, its outbound queue and the task reading its answers
    (what :class:`~fedhop.transport.child._Stream` is with threads)."""

    def __init__(self, channel: grpc.aio.Channel, loop: asyncio.AbstractEventLoop) -> None:
        self.sid = next(_Stream._ids)  # one numbering with the threaded streams
        self.channel = channel
        self.loop = loop
        self.out = _Outbox(loop)
        rpc = channel.stream_stream("/fedhop.v1.Parent/Session", request_serializer=serialize_frame,
                                    response_deserializer=parse_frame_lenient)
        self.call: Any = rpc(self._outgoing())
        self._reader: asyncio.Task | None = None
        self.lane: Lane | None = None  # the session's bulk lane (transport/lane.py), set before it is read
        # a keep-alive read (an empty frame): told here, on the loop, instead of queued as an event (None: queued)
        self.on_keepalive: Callable[[_AioStream], None] | None = None

    async def _outgoing(self) -> AsyncIterator[pb.Frame | bytes]:
        while True:
            item = await self.out.q.get()
            if item is CLOSE:
                return
            lane = self.lane
            if lane is not None and isinstance(item, BundleMessage) and lane.carries(item.payload_bytes):
                for frame in item.control_frames():  # the payload follows on the lane (its own writer thread)
                    yield frame
                lane.send(item.lane_buffers())
            else:
                try:
                    for frame in item:
                        yield frame
                except CodecError as e:
                    log.error("cannot send a message: %s", e)
            item = frame = None  # not held while waiting for the next message (transport/child.py _Stream._outgoing)

    async def first(self) -> Any:
        """The parent's first answer; None when it closed the stream without one."""
        got = await self.call.read()
        return None if got is grpc.aio.EOF else got

    def read_into(self, events: asyncio.Queue) -> None:
        """Read the rest of the answers into ``events`` (on the loop)."""
        self._reader = self.loop.create_task(self._read(events))

    async def _read(self, events: asyncio.Queue) -> None:
        why = "the parent closed the stream"
        try:
            while (message := await self.call.read()) is not grpc.aio.EOF:
                if type(message) is pb.Frame and self.on_keepalive is not None \
                        and message.WhichOneof("body") is None:
                    self.on_keepalive(self)  # the session's serving task is not woken for it (issue 19)
                    continue
                for frame in unbatched(message):  # a Batch's frames (a small Task's) as if they came one by one
                    events.put_nowait((self.sid, _FRAME, frame))
        except grpc.RpcError as e:
            why = f"{e.code().name}: {e.details()}"
        heap.session_ended()  # its objects may be frozen garbage now (common/heap.py)
        events.put_nowait((self.sid, _END, why))

    def hand_over(self, other: _AioStream) -> None:
        """Move the messages not yet taken by this stream to ``other``; end this stream's requests (on the loop)."""
        while True:
            try:
                item = self.out.q.get_nowait()
            except asyncio.QueueEmpty:
                break
            if item is not CLOSE:
                other.out.q.put_nowait(item)
        self.out.q.put_nowait(CLOSE)

    def close(self) -> None:
        self.out.put(CLOSE)
        asyncio.run_coroutine_threadsafe(self.channel.close(), self.loop)
        if self.lane is not None:
            self.lane.close()


class AioChildSession(ChildSession):
    """A :class:`~fedhop.transport.child.ChildSession` whose streams and serving loop run on ``loop``; blocking
    steps run on ``joins``, tasks on ``workers`` (both shared by the host's sessions)."""

    def __init__(self, config: Any, role: str, *, loop: asyncio.AbstractEventLoop, joins: DaemonPool,
                 workers: DaemonPool, **kwargs: Any) -> None:
        super().__init__(config, role, **kwargs)
        self.loop = loop
        self.joins = joins
        self.workers = workers
        self._events: asyncio.Queue = asyncio.Queue()  # type: ignore[assignment]
        self._calls = LoopCalls.of(loop)
        self._silence: _Silence | None = None  # while serve_async runs

    def _adopt(self, stream: Any, welcome: pb.Welcome) -> None:
        stream.on_keepalive = self._kept_alive
        super()._adopt(stream, welcome)

    def _kept_alive(self, stream: _AioStream) -> None:
        """A keep-alive on ``stream`` (on the loop): the parent was heard, if it is the current stream and the
        session serves (before, nothing waits for the parent's frames; a replaced stream's frames are not heard).

        It is all a keep-alive does (``ChildProtocol.on_frame`` ignores an empty frame; nothing meters it on
        this side), so it skips the id's event queue: a put, the serving task's wake-up and its look at the
        event were most of the ~2 keep-alives per id and round at 10,000 clients (rounds of ~26 s; one per
        ``keepalive_timeout_s / 3`` of quiet) on a host's loop (issue 19)."""
        silence = self._silence
        if silence is not None and stream is self._stream:
            silence.heard()

    # -- outbound: from any thread, onto the stream that is current when the loop takes it ------------------
    def send(self, frames: Iterable[pb.Frame | bytes]) -> None:
        self._calls.soon(self._send_now, frames)  # batched with the host's other ids' sends (LoopCalls)

    def _send_now(self, frames: Iterable[pb.Frame | bytes]) -> None:
        stream = self._stream
        assert stream is not None, "send before connect"
        stream.out.q.put_nowait(frames)

    # -- joining: ChildSession.connect / _rejoin run on a join worker; each attempt on the loop ---------------
    def _open(self, *, rejoin: bool) -> pb.Welcome:
        if threading.get_ident() == getattr(self.loop, "_thread_id", None):
            raise RuntimeError("AioChildSession._open blocks: call it from a worker, not the loop")
        return asyncio.run_coroutine_threadsafe(self._open_aio(rejoin), self.loop).result()

    async def _open_aio(self, rejoin: bool) -> pb.Welcome:
        channel = make_aio_channel(self.parent_addr, keepalive=True, security=self.security,
                                   own_connection=self.own_connection)
        try:
            await asyncio.wait_for(channel.channel_ready(), HANDSHAKE_TIMEOUT_S)
        except TimeoutError:
            await channel.close()
            raise self._no_handshake(rejoin) from None
        stream = _AioStream(channel, self.loop)
        stream.out.q.put_nowait([self._hello(rejoin)])
        try:
            first = await stream.first()
        except grpc.RpcError as e:
            stream.close()
            raise self._call_failed(e) from None
        self._check_welcome(first, rejoin, stream.close)
        stream.lane = await self._dial_lane(stream)
        self._adopt(stream, first.welcome)
        return first.welcome

    async def _dial_lane(self, stream: _AioStream) -> Lane | None:
        """The session's bulk lane, as :func:`~fedhop.transport.child.open_lane` dials it for a threaded session
        (after the Welcome, before the stream is read): dialed on the loop's executor (the join worker that
        awaits this attempt is busy); a lane that breaks ends the session (the id re-joins)."""
        try:
            offer = LaneOffer.parse(await stream.call.initial_metadata())
        except grpc.RpcError:
            return None
        if offer is None:
            return None
        return await self.loop.run_in_executor(None, functools.partial(
            dial_lane, self.parent_addr, offer, self.security, self.node, on_broken=lambda why: stream.close()))

    def _end_stream(self, sid: int) -> None:
        for s in self._streams:
            if s.sid == sid:
                s.close()

    async def in_pool(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a join worker (named after this node meanwhile), awaited on the loop."""
        return await asyncio.wrap_future(self.joins.submit(functools.partial(fn, *args, **kwargs), name=self.node))

    # -- serving --------------------------------------------------------------------------------------------
    async def serve_async(self, ctx: NodeContext, *,
                          report: Callable[[], tuple[list[dict], list[dict]]] | None = None) -> ExitCode:
        """:meth:`ChildSession.serve` on the loop (a client: no ``on_bye``, no ``before_task``). A parent not
        heard for ``transport.keepalive_timeout_s`` is taken for stalled or gone (:class:`_Silence`)."""
        proto = self._serving(ctx, report, None, self.workers)
        asms: dict[int, MessageAssembler] = {}
        silence = self._silence = _Silence(self.loop, self.transport.keepalive_timeout_s, self._events)
        try:
            while True:
                event = await self._events.get()
                if event[1] is _SILENT:
                    quiet_s = silence.quiet_s()
                    if quiet_s < self.transport.keepalive_timeout_s:
                        continue  # heard since the look that queued it
                    log.warning("%s: nothing from parent %s for %.0fs (stalled or gone); re-joining", self.node,
                                self.parent_addr, quiet_s)
                    step, got = _REJOIN, False
                elif self._reads_lane(*event):
                    # a payload on the lane is read inside the frame's handling: on the executor, where it blocks
                    # none of the host's other sessions (only there: every other frame is handled on the loop)
                    step, got = await self.loop.run_in_executor(None, self._on_event, proto, asms, *event)
                else:
                    step, got = self._on_event(proto, asms, *event)
                if step is _HEARD:
                    silence.heard()
                elif step is _REJOIN:
                    code = await self.in_pool(self._rejoin, old_ended=got)
                    if code is not None:
                        return await self.in_pool(self._give_up, proto, code, None)
                    silence.heard()
                elif step is _BYE:
                    stream = await self.in_pool(self._say_bye, proto, got, None)
                    await self._wait_closed(stream.sid)
                    return self._outcome(got)
        finally:
            self._silence = None
            silence.cancel()

    def _reads_lane(self, sid: int, kind: Any, item: Any) -> bool:
        """Whether handling this event reads a payload from a bulk lane, which blocks: a bundle header whose
        payload follows on its stream's lane (the assembler's own rule, ``MessageAssembler.feed``). Every other
        event is handled on the loop: a hop to the executor and back per frame of every id whose session has a lane
        (Tasks, chunks, keep-alives, the Bye) cost ~6,000 hops a host of 500 ids in 3 rounds (issue 19)."""
        if kind is not _FRAME or not isinstance(item, pb.Frame) or item.WhichOneof("body") != "header":
            return False
        lane = next((s.lane for s in self._streams if s.sid == sid), None)
        return lane is not None and lane.carries(int(item.header.total_bytes))

    async def _next_event(self, timeout: float) -> tuple[int, str, Any] | None:
        try:
            return self._events.get_nowait()
        except asyncio.QueueEmpty:
            pass
        try:
            async with asyncio.timeout(timeout):  # a timer on this task, not a task per wait (asyncio.wait_for)
                return await self._events.get()
        except TimeoutError:
            return None

    async def _wait_closed(self, sid: int) -> None:
        """Until the parent closes the stream ``sid`` (so the Bye is delivered), at most BYE_WAIT_S."""
        end = self.loop.time() + BYE_WAIT_S
        while (left := end - self.loop.time()) > 0:
            event = await self._next_event(left)
            if event is None or (event[0] == sid and event[1] == _END):
                return


_SILENT = object()  # an event's kind: the parent was not heard for transport.keepalive_timeout_s (maybe)


class _Silence:
    """When an id last heard its parent, and one timer that looks at it every ``timeout_s``: when it finds the
    parent silent that long, it queues ``(None, _SILENT, None)`` on the id's events (the serving loop checks
    again when it takes it: a frame queued before it counts).

    A frame heard costs an assignment, no timer: a wait for the next event with a timeout of its own (an
    ``asyncio.timeout`` per wait, woken every ``keepalive_s`` while quiet) put a timer in the loop's heap for
    every wait of every id and cancelled it at the frame; at 10,000 ids (5,000 per host) the heap's Python
    comparisons and the quiet ids' wake-ups every 5 s grew with the ids times the round's length, the
    superlinear term of a host's loop (issue 19, docs/benchmarks.md)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float, events: asyncio.Queue) -> None:
        self.loop = loop
        self.timeout_s = timeout_s
        self.events = events
        self.last = loop.time()
        self._handle: asyncio.TimerHandle | None = loop.call_at(self.last + timeout_s, self._look)

    def heard(self) -> None:
        self.last = self.loop.time()

    def quiet_s(self) -> float:
        """Seconds since the parent was last heard."""
        return self.loop.time() - self.last

    def _look(self) -> None:
        now = self.loop.time()
        if now - self.last >= self.timeout_s:
            self.events.put_nowait((None, _SILENT, None))
            self._handle = self.loop.call_at(now + self.timeout_s, self._look)
        else:
            self._handle = self.loop.call_at(self.last + self.timeout_s, self._look)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
