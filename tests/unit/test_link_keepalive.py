"""Issue 19: a parent's keep-alive, sent to every session quiet for ``keepalive_timeout_s / 3`` (~2 per client and
round at 10,000 clients), costs the sending side as little as the rule allows: the keep-alive tick queues one
shared empty frame per session (no new frame and list per send), metered as :meth:`ChildLink.send` meters a
control frame, onto an outbound queue without a lock and a condition per put or an exception per empty look
(:class:`~fedhop.transport.session.link.Outbound`)."""

from __future__ import annotations

import queue

import pytest

from fedhop.common.engine.base import MissingLog
from fedhop.common.wire.control import KEEPALIVE
from fedhop.common.wire.framing import frame_size, serialize_frame
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.session.link import CLOSE, ChildLink, Outbound
from fedhop.transport.session.reports import Reports
from fedhop.v1 import fedhop_pb2 as pb


def _metered(link: ChildLink, meter: ByteMeter) -> list[int]:
    """Meter the link's control frames as a hub does (``ParentHub._sent_control``); count its wake-ups."""
    reports = Reports("ps", meter, MissingLog())
    woken: list[int] = []
    link.node_id = "client-0"
    link.on_control = lambda lk, frame: reports.control("ps", lk.node_id, frame, 3)
    link.on_queued = lambda: woken.append(1)
    return woken


def test_a_keepalive_is_queued_and_metered_as_a_sent_empty_frame_is() -> None:
    sent_meter, kept_meter = ByteMeter(), ByteMeter()
    sent, kept = ChildLink("a"), ChildLink("b")
    sent_woken, kept_woken = _metered(sent, sent_meter), _metered(kept, kept_meter)
    sent.send([pb.Frame()])
    kept.keepalive()
    kept.keepalive()
    sent.send([pb.Frame()])
    assert sent_meter.rows() == kept_meter.rows()
    (row,) = kept_meter.rows()
    assert (row["kind"], row["messages"], row["message_bytes"], row["round"]) == (KEEPALIVE, 2, 0, 3)
    assert len(sent_woken) == len(kept_woken) == 2  # the servicer's handler is told of each
    for link in (sent, kept):
        before = link.last_sent
        frames = []
        while (item := link.poll()) is not None:
            frames += list(link.sent_frames(item))
        assert [serialize_frame(f) for f in frames] == [b"", b""] and sum(map(frame_size, frames)) == 0
        assert link.idle() and link.last_sent >= before
    assert kept.poll() is None


def test_the_outbound_queue_keeps_order_and_a_queue_s_nonblocking_face() -> None:
    link = ChildLink("c")
    assert isinstance(link._q, Outbound) and link.idle() and link.poll() is None
    link.send([pb.Frame(call_id=1)])
    link.keepalive()
    link.close()
    assert link._q.qsize() == 3 and not link._q.empty()
    first = link.poll()
    assert [f.call_id for f in first[0]] == [1]
    assert link._q.get_nowait()[0][0].WhichOneof("body") is None  # the keep-alive, in order
    assert link.poll() is CLOSE and link.idle()
    with pytest.raises(queue.Empty):
        link._q.get_nowait()
    link.send([pb.Frame(call_id=2)])
    link.discard()  # a dropped session's frames are forgotten
    assert link.idle() and link.poll() is None
