"""A child's stream lets go of a message once its frames are sent, not when the next message is queued.

A client's reply is its trained model; the stream that sends it waited for the next message with the last one
still bound, so the model of round r stayed alive until round r+1's first message was sent, after round r+1's
model had arrived into memory of its own: two models in every client at each receive (and fresh pages each
round). Checked on the threaded stream (``transport/child.py``) and the asyncio one of client hosts
(``transport/aio_child.py``), with fake channels (no sockets): the payload's memory is a numpy array whose
only owners are the message's tensors.
"""

from __future__ import annotations

import asyncio
import gc
import queue
import threading
import weakref

import numpy as np
import pytest
import torch

from fedhop.common.wire.messages import message_frames, result_frame
from fedhop.transport.aio_child import _AioStream
from fedhop.transport.child import _Stream
from fedhop.transport.session import CLOSE


class _FakeChannel:
    """``stream_stream`` hands back an rpc that keeps the request iterator for the test to drive."""

    def __init__(self) -> None:
        self.requests = None

    def stream_stream(self, *_args, **_kwargs):
        def rpc(requests):
            self.requests = requests
            return None
        return rpc


def _message():
    """A Result with a 1 MiB bundle, and a weak reference to the bundle's memory."""
    arr = np.arange(1 << 18, dtype=np.float32)
    ref = weakref.ref(arr)
    msg = message_frames(result_frame(7, {"n": 3}, has_bundle=True), {"w": torch.from_numpy(arr)}, 1 << 16)
    return msg, ref


class _FakeLane:
    """A bulk lane that writes a payload at once (``Lane.send`` hands it to a writer thread, which drops it)."""

    def carries(self, payload_bytes: int) -> bool:
        return True

    def send(self, chunks) -> None:
        for _ in chunks:
            pass


def _frames_on_stream(msg, lane) -> int:
    return len(msg.control_frames()) if lane is not None else sum(1 for _ in msg)


class _SignallingQueue(queue.Queue):
    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def get(self, *args, **kwargs):
        if self.empty():
            self.waiting.set()
        return super().get(*args, **kwargs)


@pytest.mark.parametrize("lane", [None, _FakeLane()], ids=["frames", "lane"])
def test_the_threaded_stream_frees_a_sent_bundle_while_it_waits_for_the_next_message(lane):
    channel = _FakeChannel()
    stream = _Stream(channel)  # type: ignore[arg-type]
    stream.out = _SignallingQueue()
    stream.lane = lane
    msg, ref = _message()
    n = _frames_on_stream(msg, lane)
    stream.out.put(msg)
    del msg
    frames = channel.requests
    for _ in range(n):
        next(frames)
    stream.out.waiting.clear()
    waiter = threading.Thread(target=lambda: next(frames, None), daemon=True)
    waiter.start()
    assert stream.out.waiting.wait(10)  # the stream is waiting for its next message
    gc.collect()
    assert ref() is None, "the sent bundle is still held while the stream waits"
    stream.out.put(CLOSE)
    waiter.join(10)
    assert not waiter.is_alive()


class _SignallingAsyncQueue(asyncio.Queue):
    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()

    async def get(self):
        if self.empty():
            self.waiting.set()
        return await super().get()


@pytest.mark.parametrize("lane", [None, _FakeLane()], ids=["frames", "lane"])
def test_the_asyncio_stream_frees_a_sent_bundle_while_it_waits_for_the_next_message(lane):
    async def main() -> None:
        channel = _FakeChannel()
        stream = _AioStream(channel, asyncio.get_running_loop())  # type: ignore[arg-type]
        q = _SignallingAsyncQueue()
        stream.out.q = q
        stream.lane = lane
        msg, ref = _message()
        n = _frames_on_stream(msg, lane)
        q.put_nowait(msg)
        del msg
        frames = channel.requests
        for _ in range(n):
            await frames.__anext__()
        q.waiting.clear()
        waiter = asyncio.ensure_future(frames.__anext__())
        await q.waiting.wait()  # the stream is waiting for its next message
        gc.collect()
        assert ref() is None, "the sent bundle is still held while the stream waits"
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)

    asyncio.run(main())
