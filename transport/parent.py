"""The gRPC half of ``Parent.Session`` (docs/design.md section 6), served by the PS and by every edge: a thin
servicer that feeds each session's frames to the protocol (:class:`~fedhop.transport.session.ParentHub`, or
an edge's :class:`~fedhop.transport.session.PendingHub` until it knows its run) and streams back what the
protocol queues for that child.

Two servicers: :class:`ParentServicer` on a synchronous ``grpc.Server`` (two threads per session: the
server's worker that streams the replies, and a reader), and :class:`AsyncParentServicer` on a
:class:`~fedhop.transport.aio_server.LoopServer` (the PS: two coroutines per session, the protocol's work on
each frame in the server's small pool, so the PS's threads do not grow with its children; issue 19).
:func:`serve_parent` picks the one that fits the server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol, TypeVar

import grpc

from fedhop.common.wire.framing import BadFrame, ChunkFrame, frame_size, parse_frame_lenient, serialize_frame
from fedhop.transport.aio_server import LoopServer
from fedhop.transport.credentials import Security, Unauthenticated, peer_identity
from fedhop.transport.session import CLOSE, Call, CallTable, ChildLink, Frame
from fedhop.v1 import fedhop_pb2 as pb

T = TypeVar("T")

log = logging.getLogger("fedhop.parent")


class SessionHost(Protocol):
    """What the servicer needs of the protocol: a ``ParentHub`` or a ``PendingHub``."""

    node: str

    @property
    def security(self) -> Security: ...

    def open(self, peer: str, identity: str | None = None, unauthenticated: str = "",
             cancel: Any = None) -> ChildLink: ...

    def on_frame(self, link: ChildLink, frame: Frame) -> bool: ...

    def lost(self, link: ChildLink, why: str) -> None: ...


class ParentServicer:
    """``fedhop.v1.Parent/Session`` for one hub."""

    def __init__(self, hub: SessionHost) -> None:
        self.hub = hub

    def register(self, server: grpc.Server) -> None:
        handler = grpc.stream_stream_rpc_method_handler(
            self.Session, request_deserializer=parse_frame_lenient, response_serializer=serialize_frame)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fedhop.v1.Parent",
                                                                             {"Session": handler}),))

    def Session(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        identity, why = None, ""
        if not self.hub.security.plaintext:
            try:
                identity = peer_identity(context, self.hub.security)
            except Unauthenticated as e:
                why = str(e)
        link = self.hub.open(context.peer(), identity, why, cancel=context.cancel)
        if not link.alive:  # refused at once (not authenticated): only the refusal goes back
            yield from link.outgoing()
            return
        offer = lane_offer(self.hub, link)
        if offer:
            context.send_initial_metadata(offer)
        reader = threading.Thread(target=self._read, args=(link, request_iterator),
                                  name=f"session-{link.peer}", daemon=True)
        reader.start()
        yield from link.outgoing()

    def _read(self, link: ChildLink, frames: Iterator[Any]) -> None:
        why = "the child closed its stream"
        try:
            for frame in frames:
                if not self.hub.on_frame(link, frame):
                    return
        except grpc.RpcError as e:
            why = f"stream broken ({e.code().name if hasattr(e, 'code') else e})"
        except Exception as e:  # never let one session take the node down
            why = f"session failed: {type(e).__name__}: {e}"
            log.exception("%s: session with %s failed", self.hub.node, link.name)
        finally:
            self.hub.lost(link, why)


class AsyncParentServicer:
    """``fedhop.v1.Parent/Session`` for one hub on a :class:`~fedhop.transport.aio_server.LoopServer`.

    Each session is its handler (it streams what the protocol queues for the child, woken by
    ``ChildLink.on_queued``: one wake-up scheduled at a time, however many messages are queued meanwhile) and a
    reader task; the reader hands the frames to the protocol in the server's session pool in batches, one job at
    a time per session, in order (:class:`_Feed`; a bundle header whose payload follows on the session's bulk lane
    in a transfer thread: its read lasts the transfer). A Result whose bundle must wait for the reply gate (a
    folding scatter) waits in the loop, not in a thread: its session's frames are not read meanwhile, as with the
    synchronous reader that blocked."""

    def __init__(self, hub: SessionHost, server: LoopServer) -> None:
        self.hub = hub
        self.loop = server.loop
        self.pool = server.sessions
        self.transfers = server.transfers
        # counted, for the tests of the batching (issue 19): frames read, jobs handed to the session pool for them,
        # wake-ups of the sessions' handlers scheduled from other threads
        self.frames_read = 0
        self.jobs = 0
        self.wakeups = 0

    def register(self, server: LoopServer) -> None:
        handler = grpc.stream_stream_rpc_method_handler(
            self.Session, request_deserializer=parse_frame_lenient, response_serializer=serialize_frame)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fedhop.v1.Parent",
                                                                             {"Session": handler}),))

    async def _work(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.loop.run_in_executor(self.pool, fn, *args)

    async def Session(self, request_iterator: AsyncIterator[Any],  # noqa: N802
                      context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        identity, why = None, ""
        if not self.hub.security.plaintext:
            try:
                identity = peer_identity(context, self.hub.security)  # type: ignore[arg-type]
            except Unauthenticated as e:
                why = str(e)
        task = asyncio.current_task()
        loop = self.loop
        wake = asyncio.Event()

        def cancel() -> None:
            if task is not None:
                with contextlib.suppress(RuntimeError):  # the server stopped: the stream is gone already
                    loop.call_soon_threadsafe(task.cancel)

        link = await self._work(self.hub.open, context.peer(), identity, why, cancel)

        waking = False  # a wake-up is scheduled and has not run yet: one self-pipe write for many queued messages

        def woken() -> None:
            nonlocal waking
            waking = False  # cleared before the handler looks at the queue: a later put schedules a new wake-up
            wake.set()

        def queued() -> None:
            nonlocal waking
            if waking:
                return
            waking = True
            self.wakeups += 1
            with contextlib.suppress(RuntimeError):  # the server stopped: nobody streams this session any more
                loop.call_soon_threadsafe(woken)

        link.on_queued = queued
        offer = lane_offer(self.hub, link)
        if offer:
            await context.send_initial_metadata(offer)
        reader = asyncio.create_task(self._read(link, request_iterator)) if link.alive else None
        try:
            while True:
                item = link.poll()
                if item is None:
                    wake.clear()
                    item = link.poll()
                if item is None:
                    await wake.wait()
                    continue
                if item is CLOSE:
                    return
                for frame in link.sent_frames(item):
                    yield frame
        finally:
            if reader is not None and not reader.done():
                reader.cancel()

    async def _read(self, link: ChildLink, frames: AsyncIterator[Any]) -> None:
        why = "the child closed its stream"
        feed = _Feed(self, link, asyncio.current_task())
        try:
            async for frame in frames:
                if feed.add(frame):  # a Result that may wait for the gate, a lane's payload, or enough read ahead
                    await feed.idle.wait()
            await feed.idle.wait()  # every frame read is handled before the session is lost
        except grpc.RpcError as e:
            why = f"stream broken ({e.code().name if hasattr(e, 'code') else e})"
        except asyncio.CancelledError:
            why = feed.stopped or "stream broken (CANCELLED)"
        except Exception as e:  # never let one session take the node down
            why = f"session failed: {type(e).__name__}: {e}"
            log.exception("%s: session with %s failed", self.hub.node, link.name)
        finally:
            try:
                self.pool.submit(self.hub.lost, link, why)
            except RuntimeError:  # the pool was shut down (the server stopped): nothing is waiting any more
                self.hub.lost(link, why)


READ_AHEAD_BYTES = 64 << 10  # a session's frames read ahead of the protocol's work (then its reader waits) ...
READ_AHEAD_FRAMES = 256  # ... or as many frames


class _Hold:
    """A Result whose bundle waits for the reply gate (``ReplyGate.try_enter`` said not yet): its admission,
    which may come (from the thread that settles a reply) before or after the loop parks the session's frames."""

    def __init__(self, feed: _Feed, call: Call) -> None:
        self.feed = feed
        self.call = call
        self._lock = threading.Lock()
        self._admitted = False
        self._parked: list[Any] | None = None

    def admit(self) -> None:
        """The gate's ``on_admit`` (any thread; never blocks)."""
        with self._lock:
            self._admitted = True
            rest = self._parked
        if rest is not None:
            with contextlib.suppress(RuntimeError):  # the server stopped: nobody reads this session any more
                self.feed.loop.call_soon_threadsafe(self.feed.resume, self.call, rest)

    def park(self, rest: list[Any]) -> None:
        """In the loop: the frames from the held Result on wait here until :meth:`admit` (at once if it came)."""
        with self._lock:
            self._parked = rest
            admitted = self._admitted
        if admitted:
            self.feed.resume(self.call, rest)


class _Feed:
    """One session's frames on their way to the protocol (issue 19: a thread hand-off per frame was most of the
    PS's loop). The reader adds each frame it reads; one job in the session pool at a time handles, in order,
    every frame that has arrived (``hub.on_frame``; False ends the session), and the frames read meanwhile go in
    the next job. A Result whose bundle must wait for the reply gate parks the session's frames in the loop (no
    thread waits) until the gate admits it; a bundle header whose payload follows on the bulk lane is handled in
    the transfer pool (its read lasts the transfer), the frames after it once it is done. The reader reads no
    further than such a frame (a held reply's bytes stay with the child), nor more than ``READ_AHEAD_BYTES`` or
    ``READ_AHEAD_FRAMES`` ahead of the protocol's work."""

    def __init__(self, servicer: AsyncParentServicer, link: ChildLink, reader: asyncio.Task | None) -> None:
        self.servicer = servicer
        self.loop = servicer.loop
        self.pool = servicer.pool
        self.transfers = servicer.transfers
        self.hub = servicer.hub
        self.calls: CallTable | None = getattr(servicer.hub, "calls", None)  # a ParentHub's (a PendingHub: none)
        self.link = link
        self.reader = reader
        self.pending: list[Any] = []  # read, not handed to a job yet
        self.ahead = 0  # bytes read since the feed was last idle
        self.ahead_frames = 0  # ... and frames
        self.busy = False  # a job runs, or the frames wait for the gate or for a lane's payload
        self.idle = asyncio.Event()  # nothing pending or busy
        self.idle.set()
        self.stopped = ""  # why the frames stopped being handled ("" while they are not)

    def add(self, frame: Any) -> bool:
        """Queue ``frame`` (a job starts when none runs); whether the reader must wait for :attr:`idle` before it
        reads on."""
        self.servicer.frames_read += 1
        wait = False
        if isinstance(frame, pb.Frame):
            body = frame.WhichOneof("body")
            wait = (body == "result" and frame.result.has_bundle) or _lane_payload(self.link, frame)
        self.ahead += frame.size if isinstance(frame, ChunkFrame | BadFrame) else frame_size(frame)
        self.ahead_frames += 1
        self.pending.append(frame)
        self.idle.clear()
        if not self.busy:
            self._start([], False)
        return wait or self.ahead >= READ_AHEAD_BYTES or self.ahead_frames >= READ_AHEAD_FRAMES

    def _start(self, first: list[Any], admitted: bool) -> None:
        """A job for ``first`` (frames taken before) and everything pending; ``admitted``: ``first`` begins with
        a Result the gate admitted (its ``arrived`` was done)."""
        batch = first + self.pending if first else self.pending
        self.pending = []
        if not batch:
            self.busy = False
            self.ahead = self.ahead_frames = 0
            self.idle.set()
            return
        self.busy = True
        self.servicer.jobs += 1
        job = self.loop.run_in_executor(self.pool, self._handle, batch, admitted)
        job.add_done_callback(lambda done: self._handled(done, batch))

    def _handle(self, batch: list[Any], admitted: bool) -> tuple[str, int, _Hold | None]:
        """In the session pool: the protocol's work on ``batch`` in order, up to the first frame that must wait or
        go elsewhere: ("done", n), ("ended", i: on_frame said False), ("held", i, its hold), ("lane", i)."""
        hub, link, calls = self.hub, self.link, self.calls
        for i, frame in enumerate(batch):
            if i > 0 or not admitted:
                if calls is not None and link.node_id is not None and isinstance(frame, pb.Frame) \
                        and frame.WhichOneof("body") == "result":
                    call = calls.arrived(link, frame)
                    if call is not None and call.gate is not None:
                        hold = _Hold(self, call)
                        if not call.gate.try_enter(call.call_id, hold.admit):
                            return "held", i, hold
                        call.admitted_at = time.monotonic()
                if _lane_payload(link, frame):  # read from the lane by a thread of its own (transport/lane.py)
                    return "lane", i, None
            if not hub.on_frame(link, frame):
                return "ended", i, None
        return "done", len(batch), None

    def _handled(self, job: asyncio.Future, batch: list[Any]) -> None:
        """In the loop: a job ended; the next one starts, or the frames wait (gate, lane), or the session ends."""
        if job.cancelled():  # the pool was shut down: the server stopped
            self._stop("stream broken (CANCELLED)")
            return
        error = job.exception()
        if error is not None:
            self._fail(error)
            return
        status, i, hold = job.result()
        if status == "ended":
            self._stop("the child closed its stream")
        elif status == "held":
            assert hold is not None
            hold.park(batch[i:])
        elif status == "lane":
            lane = self.loop.run_in_executor(self.transfers, self.hub.on_frame, self.link, batch[i])
            lane.add_done_callback(lambda done: self._lane_done(done, batch[i + 1:]))
        else:
            self._start([], False)

    def _lane_done(self, job: asyncio.Future, rest: list[Any]) -> None:
        if job.cancelled():
            self._stop("stream broken (CANCELLED)")
        elif job.exception() is not None:
            self._fail(job.exception())  # type: ignore[arg-type]
        elif not job.result():
            self._stop("the child closed its stream")
        else:
            self._start(rest, False)

    def resume(self, call: Call, rest: list[Any]) -> None:
        """In the loop: the gate admitted ``call``'s reply: its Result and the frames after it go on."""
        if self.stopped:
            return
        call.admitted_at = time.monotonic()
        self._start(rest, True)

    def _fail(self, error: BaseException) -> None:
        log.error("%s: session with %s failed", self.hub.node, self.link.name, exc_info=error)
        self._stop(f"session failed: {type(error).__name__}: {error}")

    def _stop(self, why: str) -> None:
        """No more frames are handled; the reader ends (cancelled where it waits) and the session is lost."""
        self.stopped = why
        self.busy = True
        self.pending = []
        if self.reader is not None:
            self.reader.cancel()


def _lane_payload(link: ChildLink, frame: Any) -> bool:
    """Whether ``frame`` is a bundle header whose payload follows on the session's bulk lane."""
    lane = link.lane
    return lane is not None and isinstance(frame, pb.Frame) and frame.WhichOneof("body") == "header" \
        and lane.carries(int(frame.header.total_bytes))


def lane_offer(hub: SessionHost, link: ChildLink) -> tuple[tuple[str, str], ...]:
    """The initial metadata offering ``link``'s child a bulk lane (``ParentHub.lane_offer``); () for a host that
    offers none (an edge's ``PendingHub``: those sessions keep their bundles on the stream)."""
    offer = getattr(hub, "lane_offer", None)
    return offer(link) if offer is not None else ()


def serve_parent(hub: SessionHost, server: grpc.Server | LoopServer) -> ParentServicer | AsyncParentServicer:
    """Register ``Parent.Session`` of ``hub`` on ``server`` (the servicer that fits it)."""
    servicer: ParentServicer | AsyncParentServicer
    if isinstance(server, LoopServer):
        servicer = AsyncParentServicer(hub, server)
        servicer.register(server)
        return servicer
    servicer = ParentServicer(hub)
    servicer.register(server)
    return servicer
