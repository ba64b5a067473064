"""A parent's gRPC server holds at most about one receive window of a stream it does not read (issue 11).

A folding scatter leaves early replies waiting in their senders (transport/reply_gate.py) by not reading their
streams; what such a stream may still send is buffered in the parent. ``channels.RECEIVE_WINDOW_BYTES`` fixes
that window; gRPC's auto-tuning (the default) lets it grow to 4 MiB or more, which this test tells apart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc

from fedhop.transport.channels import RECEIVE_WINDOW_BYTES, add_port, make_channel, make_server

MESSAGE = 64 << 10
MESSAGES = 160  # 10 MiB offered: more than an auto-tuned window


def _bytes_taken_while_not_read() -> int:
    """Bytes a client's request stream got rid of while the server's handler read only its first message."""
    first, release = threading.Event(), threading.Event()

    def handler(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        next(requests)
        first.set()
        release.wait(60)
        for _ in requests:
            pass
        yield b"done"

    server = make_server(4)
    method = grpc.stream_stream_rpc_method_handler(handler, request_deserializer=bytes, response_serializer=bytes)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Window", {"Hold": method}),))
    port = add_port(server, "127.0.0.1:0")
    server.start()
    taken = 0

    def requests() -> Iterator[bytes]:
        nonlocal taken
        for _ in range(MESSAGES):
            taken += MESSAGE
            yield b"x" * MESSAGE

    channel = make_channel(f"127.0.0.1:{port}")
    try:
        call = channel.stream_stream("/test.Window/Hold", request_serializer=bytes, response_deserializer=bytes)
        replies = call(requests())
        assert first.wait(30), "the handler never got the first message"
        # the sender stops once the window is full: poll until it made no progress for a while (deadline 20 s)
        last, deadline = -1, time.monotonic() + 20
        while taken != last and time.monotonic() < deadline:
            last = taken
            time.sleep(0.5)
        held = taken
        release.set()
        assert list(replies) == [b"done"]
        assert taken == MESSAGE * MESSAGES  # every message arrived once the handler read again
        return held
    finally:
        release.set()
        channel.close()
        server.stop(0)


def test_a_stream_the_parent_does_not_read_parks_about_one_window_in_it():
    held = _bytes_taken_while_not_read()
    # the window, the first message and what the client's send path has in hand; gRPC's auto-tuned window
    # alone is >= 4 MiB
    assert held <= RECEIVE_WINDOW_BYTES + (1 << 20), f"{held} bytes left the sender while the parent read nothing"
    assert held >= RECEIVE_WINDOW_BYTES // 2, f"only {held} bytes left the sender: the window is not in use"
