"""Issue 19: the PS's asyncio servicer (``transport/parent.py``) hands a session's frames to the protocol in batches
(one job in the session pool drains what has arrived, in order, and what arrives while it runs) and wakes a
session's handler once for many queued messages, not once per frame and per message: counted, never timed."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from fedhop.common.wire.framing import parse_frame_lenient, serialize_frame
from fedhop.transport.aio_server import LoopServer, make_loop_server
from fedhop.transport.channels import add_port
from fedhop.transport.credentials import PLAINTEXT, Security
from fedhop.transport.parent import READ_AHEAD_FRAMES, AsyncParentServicer, serve_parent
from fedhop.transport.session import ChildLink
from fedhop.v1 import fedhop_pb2 as pb
from tests.waiting import wait_until


class Host:
    """A SessionHost that records the frames it is given (and in which thread); the frame numbered ``block`` (its
    ``call_id``) holds its job until ``go`` is set; the one numbered ``end`` ends the session (False)."""

    node = "ps"

    def __init__(self, block: int = -1, end: int = -1) -> None:
        self.block, self.end = block, end
        self.go = threading.Event()
        self.seen: list[int] = []
        self.threads: set[str] = set()
        self.links: list[ChildLink] = []
        self.lost_why: queue.Queue[str] = queue.Queue()

    @property
    def security(self) -> Security:
        return PLAINTEXT

    def open(self, peer: str, identity: str | None = None, unauthenticated: str = "", cancel: Any = None) -> ChildLink:
        link = ChildLink(peer)
        link.cancel = cancel
        self.links.append(link)
        return link

    def on_frame(self, link: ChildLink, frame: Any) -> bool:
        n = int(frame.call_id)
        self.seen.append(n)
        self.threads.add(threading.current_thread().name)
        if n == self.block:
            assert self.go.wait(30)
        return n != self.end

    def lost(self, link: ChildLink, why: str) -> None:
        link.close()
        self.lost_why.put(why)


def _serve(host: Host) -> tuple[LoopServer, AsyncParentServicer, str]:
    server = make_loop_server()
    servicer = serve_parent(host, server)
    assert isinstance(servicer, AsyncParentServicer)
    addr = f"127.0.0.1:{add_port(server, '127.0.0.1:0')}"
    server.start()
    return server, servicer, addr


def _stream(addr: str, frames: Iterator[pb.Frame]) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(addr)
    session = channel.stream_stream("/fedhop.v1.Parent/Session", request_serializer=serialize_frame,
                                    response_deserializer=parse_frame_lenient)
    return channel, session(frames)


def _numbered(n: int, q: queue.Queue | None = None) -> Iterator[pb.Frame]:
    """Keep-alive-sized frames numbered 1..n (their call ids), then (with ``q``) the stream stays open until told."""
    for k in range(1, n + 1):
        yield pb.Frame(call_id=k)
    if q is not None:
        q.get()


def test_frames_that_arrive_while_a_job_runs_are_handled_by_one_job_in_order() -> None:
    n = 120
    host = Host(block=1)
    server, servicer, addr = _serve(host)
    q: queue.Queue = queue.Queue()
    channel, call = _stream(addr, _numbered(n, q))
    try:
        wait_until(lambda: servicer.frames_read == n, "the reader to read every frame while frame 1's job waits")
        assert host.seen == [1] and servicer.jobs == 1
        host.go.set()
        wait_until(lambda: len(host.seen) == n, "every frame to be handled")
        assert host.seen == list(range(1, n + 1))  # in order
        assert servicer.jobs == 1  # the job of frame 1 drained the 119 read meanwhile: one hand-off, not 120
        assert all(t.startswith("session") for t in host.threads)  # the session pool, never the loop's thread
    finally:
        q.put(None)
        call.cancel()
        channel.close()
        server.stop(0)


def test_the_reader_reads_no_further_ahead_than_its_bound() -> None:
    n = 3 * READ_AHEAD_FRAMES
    host = Host(block=1)
    server, servicer, addr = _serve(host)
    q: queue.Queue = queue.Queue()
    channel, call = _stream(addr, _numbered(n, q))
    try:
        wait_until(lambda: servicer.frames_read >= READ_AHEAD_FRAMES, "the reader to read ahead")
        assert host.lost_why.empty()
        assert servicer.frames_read == READ_AHEAD_FRAMES  # then it waits for the protocol (frame 1 is held)
        host.go.set()
        wait_until(lambda: len(host.seen) == n, "every frame to be handled")
        assert host.seen == list(range(1, n + 1))
    finally:
        q.put(None)
        call.cancel()
        channel.close()
        server.stop(0)


@pytest.mark.parametrize("end", [1, 40])
def test_a_frame_the_protocol_refuses_ends_the_session_and_nothing_after_it_is_handled(end: int) -> None:
    host = Host(end=end)
    server, servicer, addr = _serve(host)
    q: queue.Queue = queue.Queue()
    channel, call = _stream(addr, _numbered(100, q))
    try:
        assert host.lost_why.get(timeout=30) == "the child closed its stream"
        assert host.seen == list(range(1, end + 1))
        assert servicer.frames_read <= end + READ_AHEAD_FRAMES
    finally:
        q.put(None)
        call.cancel()
        channel.close()
        server.stop(0)


def test_many_messages_queued_at_once_wake_the_session_s_handler_once() -> None:
    host = Host()
    server, servicer, addr = _serve(host)
    q: queue.Queue = queue.Queue()
    channel, call = _stream(addr, _numbered(1, q))
    try:
        wait_until(lambda: host.seen == [1], "the session to open")
        link = host.links[0]
        before = servicer.wakeups
        hold, held = threading.Event(), threading.Event()
        server.loop.call_soon_threadsafe(lambda: (held.set(), hold.wait(30)))  # the loop is busy meanwhile
        assert held.wait(30)
        for k in range(50):
            link.send([pb.Frame(call_id=1000 + k)])
        assert servicer.wakeups == before + 1  # one wake-up scheduled for the 50 messages
        hold.set()
        got = [next(call).call_id for _ in range(50)]
        assert got == [1000 + k for k in range(50)]  # all of them sent, in order
        link.send([pb.Frame(call_id=2000)])  # the wake-up ran: the next message schedules a new one
        assert next(call).call_id == 2000
        assert servicer.wakeups == before + 2
    finally:
        q.put(None)
        call.cancel()
        channel.close()
        server.stop(0)


def test_the_wake_ups_of_many_sessions_share_one_trip_to_the_loop() -> None:
    # a scatter's Tasks or a keep-alive tick queue a message for every session from one thread: the sessions'
    # wake-ups ride one call_soon_threadsafe (a self-pipe write each was ~7 per client and round at 1,000 clients)
    host = Host()
    server, servicer, addr = _serve(host)
    qs = [queue.Queue() for _ in range(8)]
    streams = [_stream(addr, _numbered(1, q)) for q in qs]
    try:
        wait_until(lambda: len(host.seen) == 8, "the sessions to open")
        links = list(host.links)
        before, trips = servicer.wakeups, servicer.loop_wakes
        hold, held = threading.Event(), threading.Event()
        server.loop.call_soon_threadsafe(lambda: (held.set(), hold.wait(30)))  # the loop is busy meanwhile
        assert held.wait(30)
        for k, link in enumerate(links):
            link.send([pb.Frame(call_id=3000 + k)])
        assert servicer.wakeups == before + 8  # each session's handler is woken ...
        assert servicer.loop_wakes == trips + 1  # ... by one trip to the loop
        hold.set()
        got = sorted(next(call).call_id for _, call in streams)
        assert got == [3000 + k for k in range(8)]  # every session's message sent
    finally:
        for q in qs:
            q.put(None)
        for channel, call in streams:
            call.cancel()
            channel.close()
        server.stop(0)
