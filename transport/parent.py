"""The gRPC half of ``Parent.Session`` (docs/design.md section 6), served by the PS and by every edge: a thin
servicer that feeds each session's frames to the protocol (:class:`~fedhop.transport.session.ParentHub`, or
an edge's :class:`~fedhop.transport.session.PendingHub` until it knows its run) and streams back what the
protocol queues for that child.

:class:`AsyncParentServicer` serves it on a :class:`~fedhop.transport.aio_server.LoopServer`: two coroutines per
session, the protocol's work on each frame in the server's small pool, so a parent's threads do not grow with its
children (issue 19). :func:`serve_parent` registers it; the synchronous servicer that ran two threads per session
on a plain ``grpc.Server`` is retired."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent import futures
from typing import Any, Protocol, TypeVar

import grpc

from fedhop.common.wire.framing import frame_size, parse_frame_lenient, serialize_frame, unbatched
from fedhop.transport.aio_server import LoopServer
from fedhop.transport.credentials import Security, Unauthenticated, peer_identity
from fedhop.transport.loop_calls import LoopCalls
from fedhop.transport.session import CLOSE, CallTable, ChildLink, Frame
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


class AsyncParentServicer:
    """``fedhop.v1.Parent/Session`` for one hub on a :class:`~fedhop.transport.aio_server.LoopServer`.

    Each session is its handler (it streams what the protocol queues for the child, woken by
    ``ChildLink.on_queued``: one wake-up scheduled at a time, however many messages are queued meanwhile) and a
    reader task; the reader hands the frames to the protocol in the server's session pool in batches, one job at
    a time per session, in order (:class:`_Feed`; a bundle header whose payload follows on the session's bulk lane
    in a transfer thread: its read lasts the transfer). A Result whose bundle must wait for the reply gate (a
    folding scatter) waits in the loop, not in a thread: its session's frames are not read meanwhile, as with the
    retired synchronous servicer's reader, which blocked."""

    def __init__(self, hub: SessionHost, server: LoopServer) -> None:
        self.hub = hub
        self.loop = server.loop
        self.pool = server.sessions
        self.transfers = server.transfers
        # counted, for the tests of the batching (issue 19): gRPC messages read, frames read (a Batch's inner frames
        # each), jobs handed to the session pool for them, wake-ups of the sessions' handlers scheduled from other
        # threads
        self.messages_read = 0
        self.frames_read = 0
        self.jobs = 0
        self.wakeups = 0
        # ... carried to the loop in batches: loop_wakes counts the self-pipe writes (one for many sessions)
        self._wakes = LoopCalls(self.loop, f"{hub.node}: a session's wake-up")

    @property
    def loop_wakes(self) -> int:
        return self._wakes.wakes

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
            self._wake_soon(woken)

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

    def _wake_soon(self, woken: Callable[[], None]) -> None:
        """Run ``woken`` on the loop soon, from any thread: the wake-ups queued by other threads meanwhile (a
        scatter's Tasks, a keep-alive tick's frames: one per session) share one ``call_soon_threadsafe`` (a
        self-pipe write and a loop wake-up each), not one each (:class:`LoopCalls`)."""
        with contextlib.suppress(RuntimeError):  # the server stopped: nobody streams these sessions any more
            self._wakes.soon(woken)

    async def _read(self, link: ChildLink, frames: AsyncIterator[Any]) -> None:
        why = "the child closed its stream"
        feed = _Feed(self, link, asyncio.current_task())
        calls: CallTable | None = getattr(self.hub, "calls", None)  # a ParentHub's (a PendingHub has none)
        try:
            async for message in frames:
                self.messages_read += 1
                # a Batch's frames (a small message: Result, header, chunk) go to the protocol together, one job
                batch: list[Any] = []
                for frame in unbatched(message):
                    if calls is not None and isinstance(frame, pb.Frame) and frame.WhichOneof("body") == "result" \
                            and frame.result.has_bundle:
                        if batch:
                            feed.add(batch)
                            batch = []
                        await feed.idle.wait()  # the frames before it are handled (its Hello, surely, by now)
                        if link.node_id is not None:
                            await self._admitted(calls, link, frame)
                    batch.append(frame)
                if feed.add(batch):  # a lane's payload follows, or enough was read ahead of the protocol's work
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

    async def _admitted(self, calls: CallTable, link: ChildLink, frame: pb.Frame) -> None:
        """A Result with a bundle: its call is marked answered, and a reply of a folding scatter waits here, in the
        loop, until the reply gate admits it (no thread waits; the session's next frames are not read meanwhile,
        so the held reply's bytes stay with the child)."""
        call = calls.arrived(link, frame)  # (never waits: the roster's lock, briefly)
        if call is None or call.gate is None:
            return
        admitted = self.loop.create_future()

        def admit(f: asyncio.Future = admitted) -> None:
            with contextlib.suppress(RuntimeError):  # the server stopped: nobody reads this session any more
                self.loop.call_soon_threadsafe(lambda: f.done() or f.set_result(None))

        if not call.gate.try_enter(call.call_id, admit):
            await admitted
        call.admitted_at = time.monotonic()


READ_AHEAD_BYTES = 64 << 10  # a session's frames read ahead of the protocol's work (then its reader waits) ...
READ_AHEAD_FRAMES = 256  # ... or as many frames


class _Feed:
    """One session's frames on their way to the protocol (issue 19: a thread hand-off per frame was most of the
    PS's loop). The reader adds each frame it reads; one job at a time in the session pool drains them, in order
    (``hub.on_frame``; False ends the session), taking also the frames that arrive while it runs (a job waiting
    for a pool thread behind other sessions' finds them all). A bundle header whose payload follows on the bulk
    lane is handled in the transfer pool (its read lasts the transfer), the frames after it once it is done. The
    reader reads no further than such a header, nor more than ``READ_AHEAD_BYTES`` or ``READ_AHEAD_FRAMES``
    ahead of the protocol's work; a Result that waits for the reply gate waits before it is added
    (:meth:`AsyncParentServicer._admitted`)."""

    def __init__(self, servicer: AsyncParentServicer, link: ChildLink, reader: asyncio.Task | None) -> None:
        self.servicer = servicer
        self.loop = servicer.loop
        self.link = link
        self.reader = reader
        self.pending: deque[Any] = deque()  # read, not handled yet (appended by the loop, taken by the job)
        self.ahead = 0  # bytes read since the feed was last idle
        self.ahead_frames = 0  # ... and frames
        self.scheduled = False  # a job runs or is queued, or a lane's payload is being read
        self.idle = asyncio.Event()  # nothing pending or scheduled
        self.idle.set()
        self.stopped = ""  # why the frames stopped being handled ("" while they are not)

    def add(self, frames: list[Any]) -> bool:
        """Queue ``frames`` (one gRPC message's: a Batch's, in order; one job drains them all, as one starts only
        once they are all queued, when none is scheduled); whether the reader must wait for :attr:`idle` before it
        reads on."""
        lane = False
        for frame in frames:
            self.ahead += frame_size(frame)
            lane = lane or _lane_payload(self.link, frame)
        self.servicer.frames_read += len(frames)
        self.ahead_frames += len(frames)
        self.pending.extend(frames)
        self.idle.clear()
        if not self.scheduled:
            self._schedule()
        return lane or self.ahead >= READ_AHEAD_BYTES or self.ahead_frames >= READ_AHEAD_FRAMES

    def _schedule(self) -> None:
        self.scheduled = True
        self.servicer.jobs += 1
        # the job's end comes back to the loop with the wake-ups of other sessions (AsyncParentServicer._wake_soon):
        # run_in_executor's asyncio future chained to the pool's, and a self-pipe write per job, were ~3 per reply
        job = self.servicer.pool.submit(self._drain)
        job.add_done_callback(self._job_ended)

    def _job_ended(self, job: futures.Future) -> None:
        """In the pool thread that ran ``job`` (or the loop, had it ended already): its outcome to the loop."""
        self.servicer._wake_soon(functools.partial(self._drained, job))

    def _drain(self) -> tuple[str, Any]:
        """In the session pool: the protocol's work on the frames pending, in order, until none is left (the
        loop then schedules the next job for any added meanwhile), a lane's payload must be read (the loop hands
        that header to the transfer pool) or the session ends: ("done" | "lane" | "ended", the frame)."""
        hub, link, pending = self.servicer.hub, self.link, self.pending
        while pending:
            frame = pending.popleft()
            if _lane_payload(link, frame):  # read from the lane by a thread of its own (transport/lane.py)
                return "lane", frame
            if not hub.on_frame(link, frame):
                return "ended", frame
        return "done", None

    def _outcome(self, job: asyncio.Future | futures.Future) -> tuple[bool, Any]:
        """(whether the feed goes on, the job's result): a job cancelled (the pool was shut down: the server
        stopped) or failed stops the feed; nothing goes on once it stopped."""
        if self.stopped:
            return False, None
        if job.cancelled():
            self._stop("stream broken (CANCELLED)")
            return False, None
        error = job.exception()
        if error is not None:
            self._fail(error)
            return False, None
        return True, job.result()

    def _drained(self, job: futures.Future) -> None:
        """In the loop: a job ended; the next one starts for the frames added meanwhile, or the feed is idle."""
        going, result = self._outcome(job)
        if not going:
            return
        status, frame = result
        if status == "ended":
            self._stop("the child closed its stream")
        elif status == "lane":
            lane = self.loop.run_in_executor(self.servicer.transfers, self.servicer.hub.on_frame, self.link, frame)
            lane.add_done_callback(self._lane_read)
        else:
            self._next()

    def _lane_read(self, job: asyncio.Future) -> None:
        going, handled = self._outcome(job)
        if not going:
            return
        if not handled:
            self._stop("the child closed its stream")
        else:
            self._next()

    def _next(self) -> None:
        if self.pending:
            self._schedule()
            return
        self.scheduled = False
        self.ahead = self.ahead_frames = 0
        self.idle.set()

    def _fail(self, error: BaseException) -> None:
        log.error("%s: session with %s failed", self.servicer.hub.node, self.link.name, exc_info=error)
        self._stop(f"session failed: {type(error).__name__}: {error}")

    def _stop(self, why: str) -> None:
        """No more frames are handled; the reader ends (cancelled where it waits) and the session is lost."""
        self.stopped = why
        self.scheduled = True
        self.pending.clear()
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


def serve_parent(hub: SessionHost, server: LoopServer) -> AsyncParentServicer:
    """Register ``Parent.Session`` of ``hub`` on ``server`` and return its servicer.

    Raises :class:`TypeError` for anything but a :class:`~fedhop.transport.aio_server.LoopServer` (the
    synchronous servicer for a plain ``grpc.Server`` is retired: ``make_loop_server()`` serves a parent)."""
    if not isinstance(server, LoopServer):
        raise TypeError(f"serve_parent needs a LoopServer (fedhop.transport.channels.make_loop_server), "
                        f"not {type(server).__name__}: the synchronous ParentServicer is retired")
    servicer = AsyncParentServicer(hub, server)
    servicer.register(server)
    return servicer
