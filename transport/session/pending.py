"""A parent whose run is not known yet: an edge serves ``Parent.Session`` before its own Welcome tells it the
run, so its clients may dial (and say Hello) before its :class:`~fedhop.transport.session.hub.ParentHub`
exists. :class:`PendingHub` is that state, made explicit: it opens sessions under the transport's defaults,
checks their first frame, and holds a Hello up to ``run_wait_s`` for the hub (:meth:`PendingHub.serve`);
from then on every session is the hub's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fedhop.common import timing
from fedhop.common.engine.api import NodeId
from fedhop.common.spec import TransportSpec
from fedhop.transport.credentials import PLAINTEXT, Security
from fedhop.transport.lane import LaneServer, lane_enabled
from fedhop.transport.session.checks import Refusal, first_frame_refusal, reject
from fedhop.transport.session.hub import ParentHub, close_lane, offer_lane, open_lanes
from fedhop.transport.session.link import ChildLink, Frame
from fedhop.transport.session.liveness import HelloWaits, close_session, open_session
from fedhop.v1 import fedhop_pb2 as pb

RUN_WAIT_S = 600.0  # how long an early Hello waits for its parent to learn the run, unless told otherwise


class PendingHub:
    """``node``'s session service until its hub is known (:meth:`serve`), then its hub's."""

    def __init__(self, node: NodeId, security: Security = PLAINTEXT, *, run_wait_s: float = RUN_WAIT_S) -> None:
        self.node = node
        timing.set_node(node)
        self.security = security  # the hub's, once it serves
        self.run_wait_s = run_wait_s
        self._hub: ParentHub | None = None
        self._served = threading.Event()
        self.waits = HelloWaits()  # the sessions waiting for their Hello before the hub exists
        self._lanes: LaneServer | None = None  # the bulk lanes offered before the hub exists (then the hub's)
        self._lanes_lock = threading.Lock()

    @property
    def hub(self) -> ParentHub | None:
        """The hub that serves this node's sessions (None while the run is not known)."""
        return self._hub

    def serve(self, hub: ParentHub) -> None:
        """The run is known: ``hub`` takes every session, including the Hellos waiting for it."""
        if hub.node != self.node:
            raise ValueError(f"the hub of {hub.node} cannot serve {self.node}'s sessions")
        with self._lanes_lock:
            hub.adopt_lanes(self._lanes)
            self._hub = hub
        self._served.set()

    def open(self, peer: str, identity: str | None = None, unauthenticated: str = "",
             cancel: Callable[[], Any] | None = None) -> ChildLink:
        """A new session: the hub's, or one under the transport's default handshake timeout and no size cap
        (its Welcome gives it the hub's assembler)."""
        if self._hub is not None:
            return self._hub.open(peer, identity, unauthenticated, cancel)
        return open_session(self.node, self.security, TransportSpec().handshake_timeout_s, None, peer, identity,
                            unauthenticated, cancel, self.waits)

    def lane_offer(self, link: ChildLink) -> tuple[tuple[str, str], ...]:
        """A bulk lane for a session (``ParentHub.lane_offer``): one opened before the hub exists is the hub's
        later, as its session is."""
        lanes: LaneServer | None = None
        with self._lanes_lock:
            hub = self._hub
            if hub is None and link.alive and lane_enabled():
                if self._lanes is None:
                    self._lanes = open_lanes(self.node, self.security)
                lanes = self._lanes
        if hub is not None:
            return hub.lane_offer(link)
        return offer_lane(lanes, self.node, link) if lanes is not None else ()

    def on_frame(self, link: ChildLink, frame: Frame) -> bool:
        """A frame of a session; a Hello that comes before the hub waits for it (``run_wait_s``)."""
        hub = self._hub
        if hub is None:  # no session has said Hello to a hub yet: this is a first frame
            if not link.alive:
                return False
            link.hello_seen.set()
            refusal = first_frame_refusal(frame)
            if refusal is not None:
                return reject(self.node, link, refusal)
            if not self._served.wait(self.run_wait_s):
                return reject(self.node, link, Refusal(pb.ERROR_CODE_INTERNAL, f"{self.node} has not joined a run yet"))
            hub = self._hub
            assert hub is not None
        return hub.on_frame(link, frame)

    def lost(self, link: ChildLink, why: str) -> None:
        if self._hub is not None:
            self._hub.lost(link, why)
        else:  # never welcomed: nothing of the run to clean up
            close_session(link)
            close_lane(self._lanes, link)
