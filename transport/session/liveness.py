"""Liveness: a parent hub's watch over its children's sessions.

A session must say Hello within ``transport.handshake_timeout_s`` (sooner where many wait: :class:`HelloWaits`);
a stream quiet for a third of ``transport.keepalive_timeout_s`` (at least ``transport.keepalive_s``) gets a
keep-alive (:func:`keepalive_interval`); a session that ends fails its pending calls
(unless the node re-joined); a child that leaves the tasks of ``transport.drop_after_missed`` consecutive rounds
without any reply is dropped."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fedhop.common import heap
from fedhop.common.engine.api import NodeId
from fedhop.common.engine.base import Failure
from fedhop.common.spec import TransportSpec
from fedhop.common.testhooks import mark
from fedhop.transport.session.calls import CallTable
from fedhop.transport.session.config import HubConfig, HubListener
from fedhop.transport.session.link import ChildLink, Roster
from fedhop.v1 import fedhop_pb2 as pb

if TYPE_CHECKING:
    from fedhop.transport.credentials import Security

log = logging.getLogger("fedhop.session")


KEEPALIVES_PER_TIMEOUT = 3  # a quiet session hears from its parent at least this often within keepalive_timeout_s


def keepalive_interval(transport: TransportSpec) -> float:
    """How long a session may be quiet (nothing sent to it) before its parent sends it a keep-alive frame:
    ``keepalive_timeout_s / KEEPALIVES_PER_TIMEOUT``, at least ``transport.keepalive_s``.

    A child that hears nothing for ``keepalive_timeout_s`` takes its parent for stalled and re-joins
    (``transport/child.py``); a frame every third of that keeps a live parent's child joined with room for a
    late tick (the watch looks every ``keepalive_s / 2``) and a busy loop, and any frame sent (a task, its
    chunks, a Bye) does as well. A keep-alive every ``keepalive_s`` (5 s) to each quiet session was, at 10,000
    clients and rounds of ~50 s, ~10 frames per client and round (~2,000 frames/s through the PS's loop and the
    hosts', growing with clients x round time; issue 19); at the defaults (30 s / 3 = 10 s) it is half that, and
    a session that was sent anything within the interval gets none."""
    return max(transport.keepalive_s, transport.keepalive_timeout_s / KEEPALIVES_PER_TIMEOUT)


CROWD = 8  # sessions of one node that may wait for their Hello at once for the whole handshake timeout
CROWDED_HELLO_S = 0.2  # beyond them, each waits this long at most (a child's Hello comes with its stream)


class HelloWaits:
    """The sessions of one node that have not said Hello yet, oldest first.

    On an edge's (synchronous) server each holds a worker thread while it lasts (the PS's asyncio server holds
    none: ``transport/aio_server.py``, but their memory and handshakes still count), so streams that never
    say Hello, if each could wait ``transport.handshake_timeout_s``, would hold every spare worker and queue a
    real Hello behind them (200 such streams held a mid-run Hello for minutes, and a start past its join
    timeout). So at most :data:`CROWD` wait that long: while they wait, a new session gets
    :data:`CROWDED_HELLO_S` to say Hello, and the waiting sessions older than that beyond the first
    :data:`CROWD` are disconnected at once. A real child that is told so (``ERROR_CODE_DEADLINE_EXCEEDED``
    before its Welcome) dials again (``transport/child.py``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: OrderedDict[ChildLink, float] = OrderedDict()

    def enter(self, link: ChildLink) -> tuple[bool, list[ChildLink]]:
        """A new session waits for its Hello: (whether it came into a crowd, the older sessions to disconnect)."""
        now = time.monotonic()
        with self._lock:
            for old in [w for w in self._waiting if w.hello_seen.is_set() or not w.alive]:
                del self._waiting[old]
            crowded = len(self._waiting) >= CROWD
            evicted: list[ChildLink] = []
            for old, since in self._waiting.items():  # oldest first
                if len(self._waiting) - len(evicted) < CROWD or now - since < CROWDED_HELLO_S:
                    break
                evicted.append(old)
            for old in evicted:
                del self._waiting[old]
            self._waiting[link] = now
        return crowded, evicted

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for w in self._waiting if not w.hello_seen.is_set() and w.alive)


class Deadlines:
    """One thread that runs callbacks at their times, for any number of pending ones (a ``threading.Timer`` per
    session was a thread per joining child: 10,000 children joining within a handshake timeout ran as many
    timer threads; issue 19). Callbacks run one at a time on that thread and must not block."""

    def __init__(self, name: str = "deadlines") -> None:
        self.name = name
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_later(self, delay_s: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in ``delay_s`` seconds."""
        with self._cv:
            heapq.heappush(self._heap, (time.monotonic() + delay_s, next(self._seq), fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cv.notify()

    def __len__(self) -> int:
        with self._cv:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cv.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, _, fn, args = heapq.heappop(self._heap)
            try:
                fn(*args)
            except Exception:  # one callback's failure must not stop the others'
                log.exception("%s: %s failed", self.name, getattr(fn, "__name__", fn))


HANDSHAKE_TIMERS = Deadlines("handshake-timers")  # every hub's sessions' handshake timers, in this process


def open_session(at: NodeId, security: Security, handshake_timeout_s: float, max_bytes: int | None,
                 peer: str, identity: str | None = None, unauthenticated: str = "",
                 cancel: Callable[[], Any] | None = None, waits: HelloWaits | None = None) -> ChildLink:
    """A new session from ``peer`` to node ``at``; ``identity``: the node id its certificate or token proves
    (the servicer's :func:`~fedhop.transport.credentials.peer_identity`), or why it could not be proved;
    ``cancel``: ends the transport's stream; ``waits``: the node's sessions waiting for their Hello.

    A session holds a server thread while it lasts, so a peer holds none for long before it is known: with
    TLS or tokens, one that is not authenticated is refused at once (the reason is logged, not echoed); any
    peer that has not said Hello within ``handshake_timeout_s`` is disconnected, and sooner where many wait
    (:class:`HelloWaits`)."""
    link = ChildLink(peer, max_bytes, identity, unauthenticated)
    link.cancel = cancel
    if not security.plaintext and identity is None:
        log.warning("%s: rejected %s: unauthenticated peer: %s", at, peer, unauthenticated)
        mark(f"rejected-{at}")  # a test hook (common/testhooks.py)
        link.end(pb.ERROR_CODE_BAD_REQUEST, "unauthenticated peer")
        return link
    timeout_s = handshake_timeout_s
    if waits is not None:
        crowded, evicted = waits.enter(link)
        for old in evicted:
            hello_overdue(at, old, CROWDED_HELLO_S, crowded=True)
        if crowded:
            timeout_s = min(timeout_s, CROWDED_HELLO_S)
    HANDSHAKE_TIMERS.call_later(timeout_s, hello_overdue, at, link, timeout_s, timeout_s < handshake_timeout_s)
    return link


def hello_overdue(at: NodeId, link: ChildLink, handshake_timeout_s: float, crowded: bool = False) -> None:
    """The handshake timer fired (or, ``crowded``, the session was among too many waiting for their Hello): a
    session that has not said Hello yet is disconnected."""
    if link.hello_seen.is_set() or not link.alive:
        return
    if crowded:
        log.warning("%s: disconnected %s: no Hello within %gs while %d sessions waited for theirs", at, link.peer,
                    handshake_timeout_s, CROWD)
    else:
        log.warning("%s: disconnected %s: no Hello within transport.handshake_timeout_s = %gs", at, link.peer,
                    handshake_timeout_s)
    link.end(pb.ERROR_CODE_DEADLINE_EXCEEDED, f"no Hello within {handshake_timeout_s:g}s")


def close_session(link: ChildLink) -> None:
    """The session's stream ended: nothing more is sent on it, nothing it was sending is kept."""
    link.alive = False
    link.close()
    link.asm.close()
    heap.session_ended()  # its objects may be frozen garbage now (common/heap.py)


class Liveness:
    """Handshake timers, keep-alives, lost sessions and the drop of silent children, for one hub."""

    def __init__(self, config: HubConfig, roster: Roster, calls: CallTable, listener: HubListener) -> None:
        self.config = config
        self.node = config.node
        self.roster = roster
        self.calls = calls
        self.listener = listener
        self.waits = HelloWaits()
        self._stop = threading.Event()

    def open(self, peer: str, identity: str | None = None, unauthenticated: str = "",
             cancel: Callable[[], Any] | None = None) -> ChildLink:
        """A new session (:func:`open_session`, with this run's transport settings)."""
        t = self.config.transport
        return open_session(self.node, self.config.security, t.handshake_timeout_s, t.max_bundle_bytes, peer,
                            identity, unauthenticated, cancel, self.waits)

    def hello_overdue(self, link: ChildLink) -> None:
        """What the handshake timer of a session of this hub does when it fires."""
        hello_overdue(self.node, link, self.config.transport.handshake_timeout_s)

    # -- keep-alives --------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start sending keep-alives (again, after :meth:`stop`)."""
        t = self.config.transport
        self._stop = threading.Event()
        threading.Thread(target=self._keepalive, args=(keepalive_interval(t), t.keepalive_s / 2, self._stop),
                         daemon=True, name=f"{self.node}-keepalive").start()

    def stop(self) -> None:
        self._stop.set()

    def _keepalive(self, quiet_s: float, tick_s: float, stop: threading.Event) -> None:
        """Every ``tick_s``, :meth:`keepalive_tick` until ``stop``: a child that hears nothing for
        transport.keepalive_timeout_s takes its parent for stalled or gone and re-joins."""
        while not stop.wait(tick_s):
            self.keepalive_tick(time.monotonic(), quiet_s)

    def keepalive_tick(self, now: float, quiet_s: float) -> int:
        """An empty frame to every child that was sent nothing for ``quiet_s`` (:func:`keepalive_interval`) and
        has nothing queued; returns how many were sent."""
        sent = 0
        for link in self.roster.alive():
            if now - link.last_sent >= quiet_s and link.idle():
                link.last_sent = now
                link.keepalive()
                sent += 1
        return sent

    # -- sessions that end ----------------------------------------------------------------------------------
    def lost(self, link: ChildLink, why: str) -> None:
        """The session ended (stream closed or broken): its pending calls fail, unless the node re-joined."""
        close_session(link)
        if link.node_id is None:
            return
        with self.roster.changed:
            current = self.roster.links.get(link.node_id) is link
            pending = self.calls.take_pending(link.node_id, keep_expired=False) if current else []
            self.roster.changed.notify_all()
        for c in pending:
            c.finish(Failure(f"connection to {link.node_id} lost: {why}"))
        if current and not link.bye.is_set() and not link.dropped:
            log.warning("%s: lost %s: %s", self.node, link.node_id, why)
            self.listener.child_lost(link.node_id, why)

    def missed(self, node: NodeId, round_idx: int, why: str) -> bool:
        """A task of round ``round_idx`` to ``node`` got no reply at all (``why``); True when this drops it.

        A child that sent no Result (not a late one, not an error) for the tasks of
        ``transport.drop_after_missed`` consecutive rounds it was given tasks in is dropped (:meth:`drop`). A
        round counts once however many tasks it had; any Result of the child's calls resets the count."""
        n = self.config.transport.drop_after_missed
        if n == 0:
            return False
        with self.roster.lock:
            link = self.roster.links.get(node)
            if link is None or not link.alive or link.heard_round >= round_idx or link.missed_round == round_idx:
                return False
            link.missed += 1
            link.missed_round = round_idx
            if link.missed < n:
                return False
        self.drop(link, f"no reply in {n} consecutive rounds (transport.drop_after_missed = {n})", f"; the last: {why}")
        return True

    def drop(self, link: ChildLink, why: str, detail: str = "") -> None:
        """Close a child's session for silence: its pending calls fail, the frames queued for it and the bundles
        it was sending are freed, its stream is cancelled (a stopped peer reads nothing, so the transport's
        thread would wait on it). The node stays admitted: it re-joins (Hello with the run id) as after any
        lost stream, and takes part again from its Ready on."""
        node = link.node_id
        with self.roster.changed:
            if not link.alive or node is None or self.roster.links.get(node) is not link:
                return
            link.alive = False
            link.dropped = why
            # kept as given up on: the replies of a child that comes back are counted, then dropped
            pending = self.calls.take_pending(node, keep_expired=True)
            self.roster.changed.notify_all()
        log.warning("%s: dropped %s (%s): %s%s; its session is closed, it may re-join", self.node, node, link.peer, why,
                    detail)
        for c in pending:
            c.finish(Failure(f"{node} was dropped: {why}"))
        link.discard()
        link.end(pb.ERROR_CODE_DEADLINE_EXCEEDED, f"{self.node} closed this session: {why}")
        self.listener.child_lost(node, f"dropped: {why}")
