"""Issue 19: a client host's id takes its parent for stalled after ``transport.keepalive_timeout_s`` of silence with
one timer per id (``transport/aio_child.py`` ``_Silence``), not a timer per wait for the next frame: at 10,000 ids
the host loop's timer heap and the quiet ids' wake-ups every ``keepalive_s`` grew with the ids times the round's
length. (An event loop needs its self-pipe, a socket pair: so this is a net test.)"""

from __future__ import annotations

import asyncio

from fedhop.transport.aio_child import _SILENT, _Silence


def test_frames_heard_cost_no_timer_and_a_silent_parent_is_noticed_once_its_timeout_passed() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        timers = len(loop._scheduled)  # type: ignore[attr-defined]
        silences = [_Silence(loop, 0.3, events) for _ in range(100)]
        assert len(loop._scheduled) == timers + 100  # type: ignore[attr-defined]  # one timer per id ...
        for _ in range(50):  # ... whatever the frames heard
            for s in silences:
                s.heard()
        assert len(loop._scheduled) == timers + 100  # type: ignore[attr-defined]
        for s in silences[1:]:
            s.cancel()
        quiet = silences[0]
        start = loop.time()
        # heard every 0.1 s (a parent's keep-alives): its timer looks and finds it heard, nothing is queued
        while loop.time() - start < 0.7:
            quiet.heard()
            await asyncio.sleep(0.1)
        assert events.empty()
        assert len(loop._scheduled) == timers + 1  # type: ignore[attr-defined]  # the look re-armed its one timer
        # then silence: noticed once the timeout passed since the last frame, not before
        last = quiet.last
        event = await asyncio.wait_for(events.get(), 10)
        assert event == (None, _SILENT, None)
        assert loop.time() - last >= 0.3 and quiet.quiet_s() >= 0.3
        quiet.cancel()
        live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert len(live) == timers  # no timer of the id's left (asyncio drops cancelled ones lazily)

    asyncio.run(main())
