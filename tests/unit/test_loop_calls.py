"""A client host's sends onto its loop in batches (issue 19, ``transport/aio_child.py`` ``LoopCalls``): calls made
from other threads while the loop has not run the previous ones share one ``call_soon_threadsafe``; every call
runs, in the order made; a failing call does not keep the others from running. An event loop in a thread (its
self-pipe is an AF_UNIX pair: no network socket)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from fedhop.transport.loop_calls import LoopCalls


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_calls_made_while_the_loop_is_busy_share_one_wake_up_and_run_in_order(loop) -> None:
    calls = LoopCalls.of(loop)
    assert LoopCalls.of(loop) is calls  # one per loop, shared by its sessions
    busy, release, done = threading.Event(), threading.Event(), threading.Event()
    ran: list[tuple[int, int]] = []

    def block() -> None:
        busy.set()
        release.wait(5)

    calls.soon(block)
    assert busy.wait(5)

    def sender(k: int) -> None:
        for i in range(100):
            calls.soon(ran.append, (k, i))

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    calls.soon(lambda: 1 / 0)  # a failing call: logged, the next ones still run
    calls.soon(done.set)
    release.set()
    assert done.wait(5)
    assert calls.calls == 303 and calls.wakes == 2  # the blocker's, then one for the 302 made while it ran
    assert len(ran) == 300
    for k in range(3):
        assert [i for j, i in ran if j == k] == list(range(100))


def test_a_closed_loop_refuses_a_call_as_call_soon_threadsafe_does() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    calls = LoopCalls.of(loop)
    with pytest.raises(RuntimeError):
        calls.soon(print, "never")
    with pytest.raises(RuntimeError):  # not swallowed by a batch that will never run
        calls.soon(print, "never")
