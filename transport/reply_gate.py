"""Admission of a folding scatter's replies into memory (issue 11: memory near the model size).

A scatter with a fold (``Comm.scatter(..., fold=...)``) folds the replies in canonical order. Replies that
arrive early would wait decoded, one model each; instead, the session reader of a child whose Result arrives
early stops reading its stream until the reply's turn comes, so the bundle waits in the child (HTTP/2 flow
control holds it there) and the parent holds the running aggregate, the reply being folded and at most
``window`` more. A reply whose Result head came in before the scatter's deadline is waited for as much longer
as the gate held its bundle back (the gate must not turn a punctual node into a missing one), and no longer:
a reply whose bytes stop arriving once it may send them is missing at the deadline (``Call.wait_settled`` in
``transport/session/calls.py``; issue 20).

With a ``stream`` (issue 19), the reply at the head is not decoded at all: when its bundle header arrives the
gate asks ``stream(node, head, header)`` for a sink (a fold that adds each chunk into the aggregate as it
lands, ``common/wire/fold.py``), so the parent holds the aggregate and a chunk. A sink not committed by the
time its reply is settled (the reply failed, was given up or was rejected) is aborted before the next reply
is admitted: the aggregate is restored before anyone else may add to it.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable

from fedhop.common.wire.codec import PayloadSink
from fedhop.v1 import fedhop_pb2 as pb

log = logging.getLogger("fedhop.session")

Stream = Callable[[str, pb.Frame, pb.BundleHeader], PayloadSink | None]  # (node, Result frame, header) -> sink


class ReplyGate:
    """Admits the replies of one scatter (by call id, in canonical order): the first one not yet settled at
    once, and at most ``window`` others at a time; replies waiting for a place are admitted in canonical order.

    Each waiting reply has its own wake-up: a settle wakes only the replies it admits and costs O(log n), so a
    scatter to n children costs O(n log n) in all. (One condition for all waiters woke every waiting session
    reader at every settle, each scanning the scatter's order: O(n^2) wake-ups and O(n^3) steps per round,
    the superlinear term of a round with many clients, issue 19.)"""

    def __init__(self, window: int, stream: Stream | None = None) -> None:
        if window < 0:
            raise ValueError(f"reply window must be >= 0, got {window}")
        self.window = window
        self.stream = stream
        self._sinks: dict[int, PayloadSink] = {}  # call id -> the sink its reply streams into, until settled
        self._order: list[int] = []
        self._pos = 0  # self._order[self._pos] is the head: the first call not settled
        self._settled: set[int] = set()
        self._inside: set[int] = set()  # admitted and not settled
        self._waiting: dict[int, Callable[[], None]] = {}  # call id -> what admits it
        self._queue: list[int] = []  # the waiting call ids, a heap (canonical order: call ids grow with it)
        self._open = False
        self._lock = threading.Lock()
        self.wakeups = 0  # how many waiting replies were admitted later (a test counts them)

    def add(self, call_id: int) -> None:
        """The next call of the scatter, in canonical order."""
        with self._lock:
            self._order.append(call_id)

    def _head(self) -> int | None:
        while self._pos < len(self._order) and self._order[self._pos] in self._settled:
            self._pos += 1
        return self._order[self._pos] if self._pos < len(self._order) else None

    def _others_inside(self, head: int | None) -> int:
        return len(self._inside) - (head in self._inside)

    def _may_enter(self, call_id: int) -> bool:
        head = self._head()
        if self._open or call_id in self._settled or call_id == head:
            return True
        return self._others_inside(head) - (call_id in self._inside) < self.window

    def try_enter(self, call_id: int, on_admit: Callable[[], None]) -> bool:
        """Admit ``call_id``'s reply now (True), or later: then ``on_admit`` is called, once, by the thread whose
        :meth:`settled` or :meth:`open` frees its place (it must not block)."""
        with self._lock:
            if self._may_enter(call_id):
                if call_id not in self._settled:  # (a reply given up on takes no place)
                    self._inside.add(call_id)
                return True
            self._waiting[call_id] = on_admit
            heapq.heappush(self._queue, call_id)
            return False

    def enter(self, call_id: int) -> None:
        """Block until ``call_id``'s reply may be received (called by the session reader of its child)."""
        admitted = threading.Event()
        if not self.try_enter(call_id, admitted.set):
            admitted.wait()

    def _admit(self) -> list[Callable[[], None]]:
        """The waiting replies that may enter now, marked inside (the caller holds the lock and calls them)."""
        out: list[Callable[[], None]] = []
        if not self._waiting:
            return out
        if self._open:
            out = list(self._waiting.values())
            self._inside.update(self._waiting)
            self._waiting.clear()
            self._queue.clear()
            return out
        head = self._head()
        if head is not None and head in self._waiting:  # the head always enters
            out.append(self._waiting.pop(head))
            self._inside.add(head)
        while self._queue and self._others_inside(head) < self.window:
            cid = heapq.heappop(self._queue)
            admit = self._waiting.pop(cid, None)
            if admit is not None:  # (the head, admitted above, is still on the heap)
                out.append(admit)
                self._inside.add(cid)
        return out

    @staticmethod
    def _run(admitted: list[Callable[[], None]]) -> None:
        for admit in admitted:
            admit()

    def sink(self, call_id: int, node: str, head: pb.Frame, header: pb.BundleHeader) -> PayloadSink | None:
        """Where the bundle of ``call_id``'s reply goes (called by its session reader when the header arrives):
        a sink from ``stream`` when the reply is the next to fold, else None (it is decoded whole)."""
        with self._lock:
            if self.stream is None or self._open or call_id != self._head():
                return None
        try:
            s = self.stream(node, head, header)
        except (MemoryError, OSError, ValueError) as e:  # e.g. no memory for the first reply's buffer: decode it
            log.warning("the reply of %s cannot be folded while it arrives (%s): it is decoded whole", node, e)
            return None
        if s is None:
            return None
        with self._lock:
            if not (self._open or call_id in self._settled):
                self._sinks[call_id] = s
                return s
        s.abort()  # settled (given up) meanwhile: never let it touch the aggregate
        return None

    def settled(self, call_id: int) -> None:
        """The reply of ``call_id`` was folded, failed or given up: the next ones may come in (its sink, when not
        committed, is aborted first)."""
        with self._lock:
            self._settled.add(call_id)
            self._inside.discard(call_id)
            s = self._sinks.pop(call_id, None)
            if s is not None:
                s.abort()
            admitted = self._admit()
            given_up = self._waiting.pop(call_id, None)  # its reader still waits: it reads and drops the reply
            if given_up is not None:
                admitted.append(given_up)
            self.wakeups += len(admitted)
        self._run(admitted)

    def open(self) -> None:
        """Admit everything from now on (the scatter is over); sinks not committed are aborted."""
        with self._lock:
            self._open = True
            for s in self._sinks.values():
                s.abort()
            self._sinks.clear()
            admitted = self._admit()
            self.wakeups += len(admitted)
        self._run(admitted)
