"""Issue 19: a client host takes a parent's keep-alive (an empty frame, ~2 per id and round at 10,000 clients) as
heard in the stream's reader, on the loop: it is not queued as an event of the id, so the id's serving task is not
woken for it (a queue put, a task wake-up and a look at the event each, on a loop shared by 5,000 ids). A
keep-alive of a stream that is no longer the id's current one is not heard, as before (``_on_event``'s skip).
(An event loop needs its self-pipe, a socket pair: so this is a net test.)"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from fedhop.common.wire.messages import error_frame
from fedhop.transport.aio_child import AioChildSession, _AioStream
from fedhop.transport.child import _END, _FRAME
from fedhop.v1 import fedhop_pb2 as pb


class _Call:
    """A ``Parent/Session`` call whose answers are given."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = list(answers)

    async def read(self) -> Any:
        return self.answers.pop(0) if self.answers else grpc.aio.EOF


class _Channel:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return lambda requests: _Call(self.answers)


def _read(answers: list[Any], on_keepalive: Any) -> list[tuple[Any, ...]]:
    async def main() -> list[tuple[Any, ...]]:
        stream = _AioStream(_Channel(answers), asyncio.get_running_loop())  # type: ignore[arg-type]
        stream.on_keepalive = on_keepalive
        events: asyncio.Queue = asyncio.Queue()
        stream.read_into(events)
        got = []
        while not got or got[-1][1] is not _END:
            got.append(await asyncio.wait_for(events.get(), 10))
        return [(kind, item) for _, kind, item in got]

    return asyncio.run(main())


def test_a_keepalive_is_heard_in_the_reader_and_never_queued_for_the_serving_task() -> None:
    task = error_frame(7, pb.ERROR_CODE_BAD_REQUEST, "a frame with a body")
    heard: list[_AioStream] = []
    got = _read([pb.Frame(), task, pb.Frame(), pb.Frame()], heard.append)
    assert got == [(_FRAME, task), (_END, "the parent closed the stream")]
    assert len(heard) == 3
    # a stream nobody listens on for them (before the session adopts it) queues them as frames, as before
    got = _read([pb.Frame(), task], None)
    assert [kind for kind, _ in got] == [_FRAME, _FRAME, _END] and got[0][1].WhichOneof("body") is None


def test_only_the_current_stream_s_keepalive_is_heard_while_the_session_serves() -> None:
    class Silence:
        def __init__(self) -> None:
            self.heard_n = 0

        def heard(self) -> None:
            self.heard_n += 1

    session = AioChildSession.__new__(AioChildSession)  # only the two attributes _kept_alive reads
    current, old = object(), object()
    session._stream = current  # type: ignore[assignment]
    session._silence = None
    session._kept_alive(current)  # type: ignore[arg-type]  # not serving yet: nothing to tell
    silence = Silence()
    session._silence = silence  # type: ignore[assignment]
    session._kept_alive(old)  # type: ignore[arg-type]
    assert silence.heard_n == 0
    session._kept_alive(current)  # type: ignore[arg-type]
    assert silence.heard_n == 1
