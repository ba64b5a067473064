"""One child's session as its parent sees it (:class:`ChildLink`), and the table of them (:class:`Roster`)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from fedhop.common.engine.api import NodeId
from fedhop.common.wire.codec import CodecError
from fedhop.common.wire.control import SESSION_KINDS
from fedhop.common.wire.framing import BadFrame, ChunkFrame, frame_size
from fedhop.common.wire.messages import BundleMessage, MessageAssembler, error_frame
from fedhop.v1 import fedhop_pb2 as pb

if TYPE_CHECKING:
    from fedhop.transport.lane import Lane

log = logging.getLogger("fedhop.session")

ROLES = {"client": pb.ROLE_CLIENT, "edge": pb.ROLE_EDGE, "server": pb.ROLE_SERVER}
ROLE_NAMES = {v: k for k, v in ROLES.items()}
CLOSE = object()  # end of an outbound frame queue
KEEPALIVE_FRAME = pb.Frame()  # a keep-alive: an empty frame (shared: never changed)
Frame = pb.Frame | ChunkFrame | BadFrame


class Outbound(deque):
    """A session's outbound queue: a deque (one producer side, many threads; one consumer, the servicer's handler),
    whose ``append`` and ``popleft`` are atomic, without ``queue.Queue``'s lock and condition per put and the
    exception of an empty ``get_nowait`` per look (the handler looks two or three times per wake-up: ~550,000
    looks at 10,000 clients in two rounds, issue 19). ``put`` / ``get_nowait`` / ``qsize`` / ``empty`` as a
    ``queue.Queue``'s (without blocking)."""

    def put(self, item: Any) -> None:
        self.append(item)

    def get_nowait(self) -> Any:
        try:
            return self.popleft()
        except IndexError:
            raise queue.Empty from None

    def qsize(self) -> int:
        return len(self)

    def empty(self) -> bool:
        return not self


_KEEPALIVE: tuple[list[pb.Frame], None] = ([KEEPALIVE_FRAME], None)  # the queued item of every keep-alive


class ChildLink:
    """One child's session, seen from the parent: an outbound frame queue and what the child said."""

    def __init__(self, peer: str, max_bytes: int | None = None, identity: str | None = None,
                 unauthenticated: str = "") -> None:
        self.peer = peer  # the transport address, for log lines
        self.identity = identity  # the node id the peer's certificate or token proves (None: not verified)
        self.unauthenticated = unauthenticated  # why the peer could not be identified ("" where it was)
        self.node_id: NodeId | None = None
        self.role = ""
        self.address = ""  # an edge's Edge service
        self.alive = True
        self.superseded = False  # the node re-joined on another session
        self.ready = threading.Event()
        self.data_sizes: dict[NodeId, int] = {}
        self.bye = threading.Event()
        self.asm = MessageAssembler(max_bytes=max_bytes)  # replaced by the hub's, with its caps, at Hello
        self.hello_seen = threading.Event()  # the first frame arrived (the handshake timer stops)
        self.cancel: Callable[[], Any] | None = None  # ends the transport's stream (the servicer's)
        self._q = Outbound()
        self.last_sent = time.monotonic()
        self.missed = 0  # consecutive rounds whose tasks this child left without any reply
        self.missed_round: int | None = None  # the last round counted in ``missed``
        self.heard_round = -1  # the latest round of a call this child replied to in full (late replies included)
        self.dropped = ""  # why the parent closed this session for silence ("" while it did not)
        self.on_control: Callable[[ChildLink, pb.Frame], None] | None = None  # meters the control frames sent
        self.on_queued: Callable[[], None] | None = None  # told of every put (an asyncio servicer's wake-up)
        self.lane: Lane | None = None  # the session's bulk lane, once the child opened it (transport/lane.py)
        self.lane_token = ""  # the token offered for it (withdrawn when the session ends)

    @property
    def name(self) -> str:
        return self.node_id or f"unidentified peer {self.peer}"

    def send(self, frames: Iterable[pb.Frame | bytes], on_sent: Callable[[int], None] | None = None) -> None:
        if self.on_control is not None and isinstance(frames, list):
            for f in frames:
                if isinstance(f, pb.Frame) and f.WhichOneof("body") in SESSION_KINDS:
                    self.on_control(self, f)
        self._q.append((frames, on_sent))
        if self.on_queued is not None:
            self.on_queued()

    def keepalive(self) -> None:
        """Queue a keep-alive (:data:`KEEPALIVE_FRAME`, metered as a sent control frame, as :meth:`send` meters
        it): the keep-alive tick's send, one per quiet session, without a new frame and list per send."""
        if self.on_control is not None:
            self.on_control(self, KEEPALIVE_FRAME)
        self._q.append(_KEEPALIVE)
        if self.on_queued is not None:
            self.on_queued()

    def idle(self) -> bool:
        return not self._q

    def close(self) -> None:
        self._q.append(CLOSE)
        if self.on_queued is not None:
            self.on_queued()

    def poll(self) -> Any:
        """The next queued item without waiting (None: nothing queued): :data:`CLOSE`, or ``(frames, on_sent)``
        for :meth:`sent_frames` (the servicer's handler streams them; it lets go of each message once written)."""
        q = self._q
        if not q:
            return None
        try:
            return q.popleft()
        except IndexError:  # emptied meanwhile (discard)
            return None

    def sent_frames(self, item: tuple[Iterable[pb.Frame | bytes], Callable[[int], None] | None]) -> Iterator[Any]:
        """One queued message's frames, in order, never interleaved with another message's (the send is metered
        once they are all taken)."""
        frames, on_sent = item
        lane = self.lane
        if lane is not None and isinstance(frames, BundleMessage) and lane.carries(frames.payload_bytes):
            yield from frames.control_frames()  # the payload follows on the lane, counted as its chunk frames
            lane.send(frames.lane_buffers())
            self.last_sent = time.monotonic()
            if on_sent is not None:
                on_sent(frames.message_bytes)
            return
        n = 0
        try:
            for f in frames:
                n += frame_size(f)
                yield f
        except CodecError as e:  # a bundle that cannot travel: the call fails on the parent
            log.error("cannot send to %s: %s", self.name, e)
            return
        self.last_sent = time.monotonic()
        if on_sent is not None:
            on_sent(n)

    def discard(self) -> None:
        """Forget the frames not sent yet (a dropped session's tasks: their bundles are freed)."""
        self._q.clear()

    def end(self, code: int, message: str) -> None:
        """End a session that was never accepted, or one dropped: one Error frame, then the stream ends."""
        self.send([error_frame(0, code, message)])
        self.alive = False
        self.close()
        self.asm.close()
        if self.cancel is not None:  # a peer that reads nothing must not hold the stream either
            t = threading.Timer(1.0, self.cancel)
            t.daemon = True
            t.start()

    def heard(self, round_idx: int) -> None:
        """A whole reply to one of this child's calls (of round ``round_idx``) came in: it is not silent."""
        self.missed, self.missed_round = 0, None
        self.heard_round = max(self.heard_round, round_idx)


def complain(at: NodeId, link: ChildLink, call_id: int, code: int, message: str) -> None:
    """Tell the child (and the log of node ``at``) what was wrong with one of its frames; the session goes on."""
    log.warning("%s: %s", at, message)
    link.send([error_frame(call_id, code, message)])


class Roster:
    """A parent's children's sessions (node id -> its current session) and the nodes admitted to calls.

    Its lock is the one lock of the hub: admission, the call table and liveness change these together (a drop
    moves a node's calls aside while no Hello can replace its session), and ``changed`` wakes whoever waits
    for a child to join, become ready or come back."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.links: dict[NodeId, ChildLink] = {}
        self.admitted: set[NodeId] = set()

    def alive(self) -> list[ChildLink]:
        with self.lock:
            return [link for link in self.links.values() if link.alive]
