"""The parent side of ``Parent.Session`` for one node (the PS or an edge): :class:`ParentHub`, a façade over
its concerns, each its own module and all sharing one :class:`~fedhop.transport.session.link.Roster`:

* ``admission.py``: Hello (its checks in ``checks.py``), Welcome, Ready, the start and round boundaries;
* ``calls.py``: the call table (Tasks out, Results back, calls given up on);
* ``liveness.py``: handshake timers, keep-alives, lost sessions, silent children dropped;
* ``reports.py``: the children's Reports and Byes, merged into this node's meter and missing log.

Built from one frozen :class:`~fedhop.transport.session.config.HubConfig`; what it tells its node goes to
one :class:`~fedhop.transport.session.config.HubListener`. An edge, which learns its run only after its
server is up, serves a :class:`~fedhop.transport.session.pending.PendingHub` until its hub exists."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fedhop.common import timing
from fedhop.common.engine.api import NodeId, Scalar
from fedhop.common.engine.base import Failure, MissingLog
from fedhop.common.wire.bundle import Bundle
from fedhop.common.wire.control import SESSION_KINDS
from fedhop.common.wire.messages import FrameError
from fedhop.common.wire.meter import ByteMeter
from fedhop.transport.lane import Lane, LaneServer, lane_enabled
from fedhop.transport.reply_gate import ReplyGate
from fedhop.transport.session.admission import Admission
from fedhop.transport.session.calls import Call, CallTable
from fedhop.transport.session.config import QUIET, HubConfig, HubListener
from fedhop.transport.session.link import ChildLink, Frame, Roster, complain
from fedhop.transport.session.liveness import Liveness
from fedhop.transport.session.posts import Mailbox
from fedhop.transport.session.reports import Reports
from fedhop.transport.tcp_counters import Address, TcpCounters, WireProbe, parse_grpc_peer
from fedhop.v1 import fedhop_pb2 as pb

if TYPE_CHECKING:
    import torch

    from fedhop.transport.credentials import Security

log = logging.getLogger("fedhop.session")


class ParentHub:
    """The parent side of the session protocol for one node: its children's sessions, their calls,
    admission, keep-alives and reports. Its keep-alives run from construction to :meth:`shutdown`."""

    def __init__(self, config: HubConfig, meter: ByteMeter, missing: MissingLog | None = None,
                 listener: HubListener = QUIET, counters: TcpCounters | None = None) -> None:
        self.config = config
        self.node = config.node
        timing.set_node(self.node)
        self.meter = meter
        self.missing = missing if missing is not None else MissingLog()
        self.roster = Roster()
        self.calls = CallTable(config, self.roster, meter)
        self.admission = Admission(config, self.roster, listener, self.calls.assembler)
        self.liveness = Liveness(config, self.roster, self.calls, listener)
        self.reports = Reports(self.node, meter, self.missing)
        self.mailbox = Mailbox(self.node, meter, self.missing)  # the children's posts (Comm.receive takes them)
        # the wire level: each child's connection is read here, by its parent (transport/tcp_counters.py)
        self.wire = WireProbe(self.node, meter, self._child_addresses, counters)
        self._lanes: LaneServer | None = None  # the bulk lanes' listener, opened at the first offer
        self._lanes_lock = threading.Lock()
        self.liveness.start()

    def _child_addresses(self) -> dict[Address, NodeId]:
        """Each child's address as gRPC saw it (the remote end of its connection) -> its node id."""
        with self.roster.lock:
            links = list(self.roster.links.values())
        out = {a: link.name for link in links if (a := parse_grpc_peer(link.peer)) is not None}
        out.update({link.lane.remote: link.name for link in links if link.lane is not None and link.lane.remote})
        return out

    @property
    def security(self) -> Security:
        return self.config.security

    @property
    def children(self) -> tuple[NodeId, ...]:
        return self.config.children

    @property
    def hello_info(self) -> dict[NodeId, dict[str, Any]]:
        """What each child said in its last Hello (e.g. ``state_round``)."""
        return self.admission.hello_info

    # -- one session (the servicer's calls) -----------------------------------------------------------------
    def open(self, peer: str, identity: str | None = None, unauthenticated: str = "",
             cancel: Callable[[], Any] | None = None) -> ChildLink:
        """A new session from ``peer`` (:func:`~fedhop.transport.session.liveness.open_session`)."""
        link = self.liveness.open(peer, identity, unauthenticated, cancel)
        link.on_control = self._sent_control
        return link

    def lane_offer(self, link: ChildLink) -> tuple[tuple[str, str], ...]:
        """The initial metadata that offers ``link``'s child a bulk lane (transport/lane.py); () where this node
        offers none (``FEDHOP_BULK_LANE=0``, a refused session, no listener)."""
        if not link.alive or not lane_enabled():
            return ()
        with self._lanes_lock:
            if self._lanes is None:
                self._lanes = open_lanes(self.node, self.config.security)
            lanes = self._lanes
        return offer_lane(lanes, self.node, link) if lanes is not None else ()

    def adopt_lanes(self, lanes: LaneServer | None) -> None:
        """Take over the lane listener that offered lanes to this node's sessions before the hub existed (an
        edge's :class:`~fedhop.transport.session.pending.PendingHub`)."""
        with self._lanes_lock:
            if self._lanes is None:
                self._lanes = lanes

    def _sent_control(self, link: ChildLink, frame: pb.Frame) -> None:
        if link.node_id is not None:  # refusals before a Hello are no child's traffic
            self.reports.control(self.node, link.node_id, frame, self.wire.round)

    def on_frame(self, link: ChildLink, frame: Frame) -> bool:
        """Handle one frame from a child; False ends the session (a refused Hello)."""
        if link.on_control is None:  # a session opened before this hub existed (an edge's PendingHub)
            link.on_control = self._sent_control
        if link.node_id is None:
            if not link.alive:
                return False
            link.hello_seen.set()
            admitted = self.admission.hello(link, frame)
            if admitted and link.node_id is not None and isinstance(frame, pb.Frame):
                self.reports.control(link.node_id, self.node, frame, self.wire.round)
            return admitted
        if isinstance(frame, pb.Frame):
            body = frame.WhichOneof("body")
            if body in SESSION_KINDS and link.node_id is not None:
                self.reports.control(link.node_id, self.node, frame, self.wire.round)
            if body is None:
                return True  # keep-alive
            if body == "hello":
                complain(self.node, link, 0, pb.ERROR_CODE_BAD_REQUEST,
                         f"duplicate Hello from {link.name} on an open session; ignored")
                return True
            if body == "ready":
                self.admission.ready(link, frame.ready)
                return True
            if body == "report":
                self.reports.report(link, frame)
                return True
            if body == "bye":
                self.reports.bye(link, frame)
                return True
            if body == "error" and frame.call_id == 0:
                log.warning("%s: %s reports: %s", self.node, link.name, frame.error.message)
                return True
            if body == "result":
                self.calls.answered(link, frame)
        try:
            msg = link.asm.feed(frame)
        except FrameError as e:
            complain(self.node, link, e.call_id, pb.ERROR_CODE_BAD_REQUEST, f"{link.name}: {e}")
            msg = None
        if msg is not None:
            if msg.kind == "post":
                self.mailbox.arrived(link, msg)
            else:
                self.calls.result(link, msg)
        if link.lane is not None and link.lane.broken:  # mid-payload: the message failed above with the reason
            end_for_lane(self.node, link, link.lane.broken)
        return True

    def lost(self, link: ChildLink, why: str) -> None:
        """The session ended (:meth:`Liveness.lost <fedhop.transport.session.liveness.Liveness.lost>`)."""
        self.liveness.lost(link, why)
        self._close_lane(link)

    def _close_lane(self, link: ChildLink) -> None:
        close_lane(self._lanes, link)

    # -- the run ------------------------------------------------------------------------------------------------
    def wait_ready(self, timeout_s: float, give_up: Callable[[], str | None] | None = None) -> list[NodeId]:
        """Wait until every child said Ready; returns the children that did not (``Admission.wait_ready``)."""
        return self.admission.wait_ready(timeout_s, give_up)

    def data_sizes(self) -> dict[NodeId, int]:
        return self.admission.data_sizes()

    def admit(self) -> dict[NodeId, int]:
        """A round boundary: the ready children are admitted to calls (``Admission.admit``)."""
        return self.admission.admit()

    def start(self, peers: Mapping[NodeId, str] | None = None) -> dict[NodeId, int]:
        """The run starts (``Admission.start``)."""
        return self.admission.start(peers)

    def peer_addresses(self) -> dict[NodeId, str]:
        return self.admission.peer_addresses()

    def shutdown(self, timeout_s: float, *, finished: bool, reason: str = "run finished") -> None:
        """Bye (saying whether the run ``finished``) to every child; wait for their Bye, whose meter rows and
        missing entries are merged into this node's meter and missing log; then close the streams. The
        children's connections are read before the Byes and once more after them (the wire level)."""
        self.wire.flush()
        self.reports.collect(self.roster.alive(), timeout_s, finished=finished, reason=reason)
        self.wire.flush()  # the Byes (with the children's last meter and timeline rows), on connections still open
        self.liveness.stop()
        if self._lanes is not None:
            self._lanes.close()

    # -- calls ----------------------------------------------------------------------------------------------------
    def call(self, target: NodeId, task: str, bundle: Bundle, args: Mapping[str, Scalar], round_idx: int,
             deadline_s: float, gate: ReplyGate | None = None,
             expect: Mapping[str, torch.Tensor] | None = None) -> Call | Failure:
        """Push one Task to a child (``CallTable.call``; ``expect``: what the reply's bundle must hold, checked
        at its header); the first call of a round reads the wire level."""
        self.wire.round_boundary(round_idx)
        return self.calls.call(target, task, bundle, args, round_idx, deadline_s, gate, expect)

    def await_link(self, target: NodeId) -> tuple[ChildLink | None, bool]:
        return self.calls.await_link(target)

    def expire(self, call: Call, why: str) -> None:
        self.calls.expire(call, why)

    def missed(self, node: NodeId, round_idx: int, why: str) -> bool:
        """A task got no reply at all; True when this drops the child (``Liveness.missed``)."""
        return self.liveness.missed(node, round_idx, why)


# -- bulk lanes (transport/lane.py) of a parent's sessions ------------------------------------------------------


def open_lanes(node: NodeId, security: Security) -> LaneServer | None:
    """``node``'s lane listener; None (logged) where it cannot listen: bundles then travel on the streams."""
    try:
        return LaneServer(node, security)
    except (OSError, ValueError) as e:
        log.warning("%s: no bulk-lane listener (%s); bundles travel on the gRPC streams", node, e)
        return None


def offer_lane(lanes: LaneServer, node: NodeId, link: ChildLink) -> tuple[tuple[str, str], ...]:
    """A one-time token of ``lanes`` for ``link``'s session, as the servicer's initial metadata; the lane its
    child opens with it becomes the session's (its assembler reads the payloads from it)."""
    def attach(lane: Lane) -> None:
        lane.name = f"{node}<->{link.name}"
        lane.on_broken = lambda why: end_for_lane(node, link, why)
        link.lane = lane
        link.asm.lane = lane
        if not link.alive:  # the session ended meanwhile
            lane.close()

    offer = lanes.offer(attach, link.identity, link.name, link.peer)
    if offer is None:  # as many lanes as the node's file descriptors allow: this session stays on its stream
        return ()
    link.lane_token = offer.token
    return offer.metadata()


def end_for_lane(node: NodeId, link: ChildLink, why: str) -> None:
    """A session's lane failed: the session ends as with a broken stream (its calls fail, the child re-joins)."""
    log.warning("%s: ending the session of %s: %s", node, link.name, why)
    if link.cancel is not None:
        link.cancel()


def close_lane(lanes: LaneServer | None, link: ChildLink) -> None:
    """A session ended: its lane token is withdrawn and its lane closed."""
    if lanes is not None and link.lane_token:
        lanes.withdraw(link.lane_token)
    if link.lane is not None:
        link.lane.close()
