"""A parent whose run is not known yet: an edge serves ``Parent.Session`` before its own Welcome tells it the
run, so its clients may dial (and say Hello) before its :class:`~fedhop.transport.session.hub.ParentHub`
exists. :class:`PendingHub` is that state, made explicit: it opens sessions under the transport's defaults,
checks their first frame, and holds a Hello up to ``run_wait_s`` for the hub (:meth:`PendingHub.serve`);
from then on every session is the hub's.

A held Hello holds no thread: it is kept (with any frame its session sends after it) and handed to the hub when
the hub comes, or refused when ``run_wait_s`` passes first. The edge serves its sessions from an asyncio loop
and a small pool (``transport/aio_server.py``): a Hello that waited in a pool thread would hold that thread, and
as many early Hellos as the pool has threads would stop every other session's frames (issue 19)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fedhop.common import timing
from fedhop.common.engine.api import NodeId
from fedhop.common.spec import TransportSpec
from fedhop.transport.credentials import PLAINTEXT, Security
from fedhop.transport.lane import LaneServer, lane_enabled
from fedhop.transport.session.calls import Call
from fedhop.transport.session.checks import Refusal, first_frame_refusal, reject
from fedhop.transport.session.hub import ParentHub, close_lane, offer_lane, open_lanes
from fedhop.transport.session.link import ChildLink, Frame
from fedhop.transport.session.liveness import HANDSHAKE_TIMERS, HelloWaits, close_session, open_session
from fedhop.v1 import fedhop_pb2 as pb

RUN_WAIT_S = 600.0  # how long an early Hello waits for its parent to learn the run, unless told otherwise
HELD_FRAMES = 16  # frames of a session held before its Welcome, its Hello included (a child sends only the Hello)


class PendingHub:
    """``node``'s session service until its hub is known (:meth:`serve`), then its hub's."""

    class Calls:
        """The hub's call table as the servicer sees it (``AsyncParentServicer`` waits for a folding scatter's
        reply gate in its loop, never in a pool thread): a Result comes only on a session the hub welcomed."""

        def __init__(self, pending: PendingHub) -> None:
            self._pending = pending

        def arrived(self, link: ChildLink, frame: pb.Frame) -> Call | None:
            """``CallTable.arrived`` of the hub (None before it exists: no call is pending then)."""
            hub = self._pending.hub
            return hub.calls.arrived(link, frame) if hub is not None else None

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
        # the sessions whose Hello came before the hub, with their frames so far, in order (the hub's on serve)
        self._held: dict[ChildLink, list[Frame]] = {}
        self._held_lock = threading.Lock()
        self.calls = PendingHub.Calls(self)

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
            with self._held_lock:
                self._hub = hub
                held = list(self._held)
        self._served.set()
        for link in held:  # in the order they said Hello
            self._hand_over(hub, link)

    def _hand_over(self, hub: ParentHub, link: ChildLink) -> None:
        """Give a held session's frames to ``hub``, in order, with those that come meanwhile; then its frames go
        to the hub directly (:meth:`on_frame`)."""
        while True:
            with self._held_lock:
                frames = self._held.get(link)
                if not frames:
                    self._held.pop(link, None)
                    return
                self._held[link] = []
            for frame in frames:
                if not hub.on_frame(link, frame):  # refused: the hub ended the session (its stream ends with it)
                    with self._held_lock:
                        self._held.pop(link, None)
                    return

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
        """A frame of a session; never waits. A Hello that comes before the hub is held for it (``run_wait_s``,
        then refused), and so is what its session sends after it until the hub has taken it (:meth:`serve`)."""
        refusal: Refusal | None = None
        with self._held_lock:
            hub = self._hub
            held = self._held.get(link)
            if held is not None:  # its Hello is held (or being handed over): this frame follows it
                if len(held) < HELD_FRAMES:
                    held.append(frame)
                    return True
                del self._held[link]  # a session that floods before its Welcome is not held any longer
                refusal = Refusal(pb.ERROR_CODE_BAD_REQUEST, f"more than {HELD_FRAMES} frames before the Welcome")
            elif hub is None:  # no session has said Hello to a hub yet: this is a first frame
                if not link.alive:
                    return False
                link.hello_seen.set()
                refusal = first_frame_refusal(frame)
                if refusal is None:
                    self._held[link] = [frame]
        if refusal is not None:
            return reject(self.node, link, refusal)
        if hub is not None:
            return hub.on_frame(link, frame)
        HANDSHAKE_TIMERS.call_later(self.run_wait_s, self._run_overdue, link)
        return True

    def _run_overdue(self, link: ChildLink) -> None:
        """``run_wait_s`` after a held Hello: refused if the hub has not come (nothing happens if it has)."""
        with self._held_lock:
            if self._hub is not None or self._held.pop(link, None) is None:
                return
        if link.alive:
            reject(self.node, link, Refusal(pb.ERROR_CODE_INTERNAL, f"{self.node} has not joined a run yet"))

    def lost(self, link: ChildLink, why: str) -> None:
        with self._held_lock:  # decided against serve(): a session lost before the hub is never handed to it
            hub = self._hub
            if hub is None:
                self._held.pop(link, None)
        if hub is not None:
            hub.lost(link, why)
        else:  # never welcomed: nothing of the run to clean up
            close_session(link)
            close_lane(self._lanes, link)
