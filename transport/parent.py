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

from fedhop.common.wire.framing import parse_frame_lenient, serialize_frame
from fedhop.transport.aio_server import LoopServer
from fedhop.transport.credentials import Security, Unauthenticated, peer_identity
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
    ``ChildLink.on_queued``) and a reader task; the reader hands each frame to the protocol in the server's
    session pool, one frame at a time per session, in order (a bundle header whose payload follows on the
    session's bulk lane in a transfer thread: its read lasts the transfer). A Result whose bundle must wait for
    the reply gate (a folding scatter) waits in the loop, not in a thread: its session's frames are not read meanwhile,
    as with the synchronous reader that blocked."""

    def __init__(self, hub: SessionHost, server: LoopServer) -> None:
        self.hub = hub
        self.loop = server.loop
        self.pool = server.sessions
        self.transfers = server.transfers

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

        def queued() -> None:
            with contextlib.suppress(RuntimeError):  # the server stopped: nobody streams this session any more
                loop.call_soon_threadsafe(wake.set)

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
        calls: CallTable | None = getattr(self.hub, "calls", None)  # a ParentHub's (a PendingHub has none)
        try:
            async for frame in frames:
                if calls is not None and link.node_id is not None and isinstance(frame, pb.Frame) \
                        and frame.WhichOneof("body") == "result":
                    call = await self._work(calls.arrived, link, frame)
                    if call is not None and call.gate is not None:
                        admitted = self.loop.create_future()

                        def admit(f: asyncio.Future = admitted) -> None:
                            self.loop.call_soon_threadsafe(lambda: f.done() or f.set_result(None))

                        if not call.gate.try_enter(call.call_id, admit):
                            await admitted
                        call.admitted_at = time.monotonic()
                if _lane_payload(link, frame):  # read from the lane by a thread of its own (transport/lane.py)
                    if not await self.loop.run_in_executor(self.transfers, self.hub.on_frame, link, frame):
                        return
                elif not await self._work(self.hub.on_frame, link, frame):
                    return
        except grpc.RpcError as e:
            why = f"stream broken ({e.code().name if hasattr(e, 'code') else e})"
        except asyncio.CancelledError:
            why = "stream broken (CANCELLED)"
        except Exception as e:  # never let one session take the node down
            why = f"session failed: {type(e).__name__}: {e}"
            log.exception("%s: session with %s failed", self.hub.node, link.name)
        finally:
            try:
                self.pool.submit(self.hub.lost, link, why)
            except RuntimeError:  # the pool was shut down (the server stopped): nothing is waiting any more
                self.hub.lost(link, why)


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
