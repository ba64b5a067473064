"""Reports: what a parent hub's children counted, merged into its byte meter, missing log and timeline.

A child sends a Report (meter rows and missing entries since its last one) before each Result, so that a
parent holding a round's results holds their byte rows too; at the end, its Bye carries what it has not
reported yet (:meth:`Reports.collect` says Bye to every child and waits for theirs)."""

from __future__ import annotations

import logging
import time

from fedhop.common import timeline
from fedhop.common.engine.api import NodeId
from fedhop.common.engine.base import MissingLog
from fedhop.common.wire.control import (
    REPORT,
    bye_frame,
    meter_rows_from_pb,
    missing_from_pb,
    session_kind,
    timeline_from_pb,
)
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.session.link import ChildLink
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.session")


class Reports:
    """Merges the children's Reports and Byes into node ``node``'s meter and missing log."""

    def __init__(self, node: NodeId, meter: ByteMeter, missing: MissingLog) -> None:
        self.node = node
        self.meter = meter
        self.missing = missing

    def report(self, link: ChildLink, frame: pb.Frame) -> None:
        """A Report frame: its rows and entries are merged at once; the Report itself is metered."""
        rows = meter_rows_from_pb(frame.report.meter)
        self.meter.merge(rows)
        self.missing.entries.extend(missing_from_pb(frame.report.missing))
        timeline.recorder(self.node).merge(timeline_from_pb(frame.report.timeline))
        self.meter.record(link.name, self.node, REPORT, "request", 0, frame.ByteSize(), int(frame.report.round))

    def control(self, src: NodeId, dst: NodeId, frame: pb.Frame, round_idx: int) -> None:
        """A session control frame (Hello, Welcome, Ready, Bye, keep-alive) between this node and a child,
        either way: metered under its control kind, no payload (``SESSION_KINDS``)."""
        kind = session_kind(frame)
        if kind is not None:
            self.meter.record(src, dst, kind, "request", 0, frame.ByteSize(), round_idx)

    def bye(self, link: ChildLink, frame: pb.Frame) -> None:
        """A child's Bye: what it had not reported yet is merged; the session may close."""
        self.meter.merge(meter_rows_from_pb(frame.bye.meter))
        self.missing.entries.extend(missing_from_pb(frame.bye.missing))
        timeline.recorder(self.node).merge(timeline_from_pb(frame.bye.timeline))
        link.bye.set()

    def collect(self, links: list[ChildLink], timeout_s: float, *, finished: bool, reason: str) -> None:
        """Bye (saying whether the run ``finished``) to each of ``links``; wait up to ``timeout_s`` in all for
        their Bye (:meth:`bye`), then close their streams."""
        for link in links:
            link.send([bye_frame(reason, finished=finished)])
        end = time.monotonic() + timeout_s
        for link in links:
            if not link.bye.wait(max(0.0, end - time.monotonic())):
                log.warning("%s: no Bye from %s within %.0fs; its unreported byte counts are lost", self.node,
                            link.name, timeout_s)
        for link in links:
            link.close()
